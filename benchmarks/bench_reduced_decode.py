"""mAP after a short fine-tune with and without reduced JPEG decoding (``reduced_decode``), within the seed spread?

The official ``yolov5n.pt`` fine-tuned on the first ``--images`` coco128 images upscaled 4x (Lanczos, JPEG quality
92, ~2560 px: ``bench_scaling.upscaled_copy``) at ``--img`` px, trained and validated on those images (coco128
ships no separate val split), for ``--epochs`` epochs and each of ``--seeds``, once with the default (large JPEGs
decoded at 1/2, 1/4 or 1/8, here 1/8: 2560 -> 320) and once with ``--no-reduced-decode`` (every image decoded in
full, then resized). Each run is a whole ``yolotrain train`` command in a subprocess: batch 8 with an optimiser
step every batch (``--nominal-batch 8``) and no warm-up (``--warmup-epochs 0``: the warm-up's high bias learning
rate would wreck the pretrained head in a run of a few steps), the defaults otherwise (SGD, scratch-low
augmentations, ``--amp auto``, the loader's decoded-image memory budget); its score
is the validation after the last epoch (``results.csv``; ``--no-val`` validates after the last epoch only,
decoding as training does). The two settings alternate first in each seed.

Reduced decoding is called *within the seed spread* when the difference of the two settings' mean final
mAP50-95 (and mAP50) is no larger than the larger of their seed-to-seed ranges (max - min over seeds). Training
images/s is the mean over epochs of the trainer's own figure (an epoch's images over its loading and steps, from
its progress bar; start-up and validation left out), the median over seeds: the machine may be shared, so it is a
within-run comparison, not an absolute speed.

    python benchmarks/bench_reduced_decode.py   # 32 images, 320 px, 2 epochs, seeds 0 1 2 (~20 min, 2 busy cores)
    python benchmarks/bench_reduced_decode.py --smoke --out /tmp/rd   # 4 images, 64 px, 1 epoch, 1 seed

Writes ``benchmarks/results/reduced_decode.json`` and ``reduced_decode.md``; skips (exit 0, one line) without the
shared ``yolov5n.pt`` or coco128.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_scaling import JPEG_QUALITY, UPSCALE, upscaled_copy
from common import COCO128, ROOT, YOLOV5N, copy_images, cpu_model

SETTINGS = {"reduced": [], "full": ["--no-reduced-decode"]}
# The training progress bar: "EPOCH/EPOCHS ... N img/s", the epoch's images over its time so far.
PROGRESS = re.compile(r"(\d+)/\d+ box .*? (\d+(?:\.\d+)?) img/s")


def upscaled_dataset(root: Path, images: int) -> Path:
    """The first ``images`` coco128 images 4x larger with their labels, train and val alike; returns its YAML."""
    small = copy_images(COCO128, root / "small", images)
    upscaled_copy(small, root / "big")
    names = (COCO128 / "data.yaml").read_text().split("names:", 1)[1]
    yaml = root / "big" / "data.yaml"
    yaml.write_text(f"path: {root / 'big'}\ntrain: images/train2017\nval: images/train2017\nnames:{names}")
    return yaml


def read_scores(results_csv: Path) -> dict[str, float]:
    last = list(csv.DictReader(results_csv.open()))[-1]
    return {"map50_95": float(last["mAP50-95"]), "map50": float(last["mAP50"])}


def train(data: Path, setting: str, seed: int, a: argparse.Namespace, work: Path) -> dict[str, object]:
    name = f"{setting}-seed{seed}"
    command = [sys.executable, "-m", "yolotrain", "train", "--model", str(YOLOV5N), "--data", str(data),
               "--img", str(a.img), "--batch", str(a.batch), "--epochs", str(a.epochs), "--seed", str(seed),
               "--nominal-batch", str(a.batch), "--warmup-epochs", "0", "--device", "cpu", "--project",
               str(work / "runs"), "--name", name, "--exist-ok", "--no-plots", "--no-val", *SETTINGS[setting]]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "YOLOTRAIN_CACHE": str(work / "cache")})
    wall = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"{shlex.join(command)} failed:\n{done.stderr[-3000:]}")
    # Each epoch's last progress figure: its images over its time (loading and steps; not start-up or validation).
    per_epoch = {int(epoch): float(rate) for epoch, rate in PROGRESS.findall(done.stderr)}
    return {"setting": setting, "seed": seed, "wall_s": round(wall, 1),
            "epoch_images_per_s": [per_epoch[e] for e in sorted(per_epoch)],
            "train_images_per_s": round(statistics.fmean(per_epoch.values()), 2),
            **read_scores(work / "runs" / name / "results.csv")}


def spread(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "range": max(values) - min(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def summarise(runs: list[dict[str, object]]) -> dict[str, object]:
    summary: dict[str, object] = {}
    for setting in SETTINGS:
        mine = [r for r in runs if r["setting"] == setting]
        if mine:
            summary[setting] = {"seeds": len(mine), "map50_95": spread([r["map50_95"] for r in mine]),
                                "map50": spread([r["map50"] for r in mine]),
                                "train_images_per_s": statistics.median(r["train_images_per_s"] for r in mine)}
    if len(summary) == 2:
        for metric in ("map50_95", "map50"):
            difference = summary["reduced"][metric]["mean"] - summary["full"][metric]["mean"]
            summary[f"{metric}_reduced_minus_full"] = difference
            summary[f"{metric}_within_seed_spread"] = abs(difference) <= max(
                summary["reduced"][metric]["range"], summary["full"][metric]["range"])
        summary["speed_ratio"] = summary["reduced"]["train_images_per_s"] / summary["full"]["train_images_per_s"]
    return summary


def reading(summary: dict[str, object], runs: list[dict[str, object]]) -> str:
    if "speed_ratio" not in summary:
        return "Incomplete: one setting has no runs."
    within = summary["map50_95_within_seed_spread"] and summary["map50_within_seed_spread"]
    rates = [v for r in runs for v in r["epoch_images_per_s"]]
    return (f"Reduced decoding changes the mean final mAP50-95 by {summary['map50_95_reduced_minus_full']:+.4f} and "
            f"mAP50 by {summary['map50_reduced_minus_full']:+.4f}: {'within' if within else 'NOT within'} the seed "
            f"spread. Training ran at {summary['speed_ratio']:.2f}x the full decode's images/s, but single epochs "
            f"ranged from {min(rates):.1f} to {max(rates):.1f} images/s: at this speed the training step, not "
            "decoding, sets the pace, and the shared machine's load moves it more than the setting does (the "
            "loader alone: bench_scaling.py).")


def write_table(result: dict[str, object], path: Path) -> None:
    s, setup = result["summary"], result["setup"]
    lines = [f"# mAP with and without reduced JPEG decoding ({setup['cpu']})", "",
             f"`{setup['command']}`", "",
             f"yolov5n.pt fine-tuned on the first {setup['images']} coco128 images upscaled {setup['upscale']}x "
             f"(JPEG quality {setup['jpeg_quality']}), {setup['img_size']} px, batch {setup['batch']} "
             "(an optimiser step each, no warm-up), "
             f"{setup['epochs']} epochs, seeds {setup['seeds']}; validated on the same images after the last epoch (a "
             "subset of coco128 and few epochs, so that the study fits in about 15 minutes on 2 shared cores). "
             f"1-minute load average {setup['load_average_1min_at_start']:.1f} at the start, "
             f"{setup.get('load_average_1min_at_end', float('nan')):.1f} at the end (a shared machine: images/s "
             "compare within this run only).", "",
             "| setting | seeds | mAP50-95 mean | range | std | mAP50 mean | range | std | train images/s (median) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for setting, label in (("reduced", "reduced decode (default)"), ("full", "--no-reduced-decode")):
        if setting in s:
            r = s[setting]
            m, m50 = r["map50_95"], r["map50"]
            lines.append(f"| {label} | {r['seeds']} | {m['mean']:.4f} | {m['range']:.4f} | {m['std']:.4f} | "
                         f"{m50['mean']:.4f} | {m50['range']:.4f} | {m50['std']:.4f} | {r['train_images_per_s']:.2f} |")
    lines += ["", reading(s, result["runs"]), "", "Per run (mAP50-95 / mAP50 after the last epoch, wall time):", ""]
    lines += [f"- {r['setting']} seed {r['seed']}: {r['map50_95']:.4f} / {r['map50']:.4f}, {r['wall_s']:.0f} s "
              f"(images/s per epoch: {', '.join(f'{v:.1f}' for v in r['epoch_images_per_s'])})" for r in result["runs"]]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=32, help="coco128 images (train and val)")
    parser.add_argument("--img", type=int, default=320, help="training and validation size")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--smoke", action="store_true", help="4 images at 64 px, batch 2, 1 epoch, seed 0")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    a = parser.parse_args()
    if a.smoke:
        a.images, a.img, a.batch, a.epochs, a.seeds = 4, 64, 2, 1, [0]
    if not YOLOV5N.is_file() or not (COCO128 / "images").is_dir():
        print(f"skipped: needs {YOLOV5N} and {COCO128}")
        return
    a.out.mkdir(parents=True, exist_ok=True)
    setup = {"cpu": cpu_model(), "cpus": os.cpu_count(), "torch": torch.__version__, "images": a.images,
             "upscale": UPSCALE, "jpeg_quality": JPEG_QUALITY, "img_size": a.img, "batch": a.batch,
             "epochs": a.epochs, "seeds": a.seeds, "command": "python benchmarks/bench_reduced_decode.py "
             + shlex.join(sys.argv[1:]), "load_average_1min_at_start": os.getloadavg()[0]}
    runs: list[dict[str, object]] = []
    json_path = a.out / "reduced_decode.json"
    with tempfile.TemporaryDirectory(prefix="reduced-decode-") as folder:
        work = Path(folder)
        data = upscaled_dataset(work / "data", a.images)
        for seed in a.seeds:
            order = list(SETTINGS) if seed % 2 == 0 else list(reversed(SETTINGS))
            for setting in order:
                runs.append(train(data, setting, seed, a, work))
                print(f"{setting} seed {seed}: mAP50-95 {runs[-1]['map50_95']:.4f} mAP50 {runs[-1]['map50']:.4f} "
                      f"({runs[-1]['wall_s']:.0f} s)", flush=True)
                json_path.write_text(json.dumps({"setup": setup, "runs": runs, "summary": summarise(runs)}, indent=2)
                                     + "\n")
    setup["load_average_1min_at_end"] = os.getloadavg()[0]
    result = {"setup": setup, "runs": runs, "summary": summarise(runs)}
    result["reading"] = reading(result["summary"], runs)
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    write_table(result, a.out / "reduced_decode.md")
    print((a.out / "reduced_decode.md").read_text())


if __name__ == "__main__":
    main()
