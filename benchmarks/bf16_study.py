"""Accuracy of ``--amp bf16`` against float32 training on the CPU: the evidence behind ``--amp auto``.

Two setups, each trained with both precisions and several seeds, everything else equal:

- **coco128 fine-tune**: the official ``yolov5n.pt`` on coco128 at 320 px (the dataset defaults: SGD,
  batch 16, scratch-low augmentations), 30 epochs;
- **shapes from scratch**: ``yolov5n`` from random weights on the built-in shapes set (its defaults:
  160 px, AdamW, batch 16), 30 epochs.

Each run is a whole ``yolotrain train`` command in a subprocess; the score is the mAP50-95 after the
last epoch (``results.csv``; validation runs after the last epoch only). bf16 is called *within the seed
spread* of a setup when the difference of the two precisions' mean final mAP50-95 is no larger than the larger of their
seed-to-seed ranges (max - min over seeds). The runs are independent of wall-clock time, so the study
may run on a busy machine (the per-run wall times in the JSON are not speed measurements: those are
``bench_train.py``'s); it only needs the CPU's native bf16 instructions (AVX512-BF16 or AMX) for
bf16 to mean what it means in production.

    python benchmarks/bf16_study.py                  # the study (about 40 minutes on 2 idle cores)
    python benchmarks/bf16_study.py --epochs 1 --seeds 0 --out /tmp/smoke   # checks the script runs

Writes ``benchmarks/results/bf16_study.json`` and ``bf16_study.md``; runs finished before an
interruption are kept in the JSON and not repeated.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import COCO128, ROOT, YOLOV5N, cpu_model

from yolotrain.devices import native_bf16

# Each setup's arguments. Without --data, training takes the built-in shapes set and its defaults (the
# set is generated into YOLOTRAIN_CACHE, which the study points at its temporary folder).
SETUPS = {
    "coco128-finetune-320": ["--model", str(YOLOV5N), "--data", str(COCO128 / "data.yaml"), "--img", "320"],
    "shapes-scratch-160": ["--model", "yolov5n"],
}


def read_scores(results_csv: Path) -> dict[str, object]:
    rows = list(csv.DictReader(results_csv.open()))
    # Validation runs after the last epoch only (--no-val): its row is the run's score.
    return {"final_map50_95": float(rows[-1]["mAP50-95"]), "final_map50": float(rows[-1]["mAP50"]),
            "epochs": len(rows)}


def train(setup: str, amp: str, seed: int, epochs: int, work: Path) -> dict[str, object]:
    name = f"{setup}-{amp}-seed{seed}"
    command = [sys.executable, "-m", "yolotrain", "train", *SETUPS[setup], "--epochs", str(epochs),
               "--seed", str(seed), "--amp", amp, "--device", "cpu", "--project", str(work / "runs"),
               "--name", name, "--exist-ok", "--no-plots", "--no-val"]
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=work, stdout=subprocess.DEVNULL,
                   env={**os.environ, "YOLOTRAIN_CACHE": str(work / "cache")})
    return {"setup": setup, "amp": amp, "seed": seed, "wall_s": round(time.perf_counter() - start, 1),
            **read_scores(work / "runs" / name / "results.csv")}


def summarise(runs: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    summary: dict[str, dict[str, object]] = {}
    for setup in SETUPS:
        by_amp = {}
        for amp in ("off", "bf16"):
            finals = [r["final_map50_95"] for r in runs if r["setup"] == setup and r["amp"] == amp]
            if finals:
                by_amp[amp] = {"seeds": len(finals), "mean": statistics.fmean(finals),
                               "range": max(finals) - min(finals),
                               "std": statistics.stdev(finals) if len(finals) > 1 else 0.0}
        if len(by_amp) == 2:
            difference = by_amp["bf16"]["mean"] - by_amp["off"]["mean"]
            spread = max(by_amp["bf16"]["range"], by_amp["off"]["range"])
            by_amp["bf16_minus_float32"] = difference
            by_amp["within_seed_spread"] = abs(difference) <= spread
        summary[setup] = by_amp
    return summary


def write_table(result: dict[str, object], path: Path) -> None:
    lines = [f"# bf16 against float32 on the CPU ({result['setup']['cpu']})", "",
             "| setup | precision | seeds | final mAP50-95 mean | seed range | std |",
             "|---|---|---|---|---|---|"]
    for setup, rows in result["summary"].items():
        for amp in ("off", "bf16"):
            if amp in rows:
                r = rows[amp]
                label = "float32" if amp == "off" else "bf16"
                lines.append(f"| {setup} | {label} | {r['seeds']} | {r['mean']:.4f} | {r['range']:.4f} | "
                             f"{r['std']:.4f} |")
        if "within_seed_spread" in rows:
            lines.append(f"| {setup} | bf16 - float32 | | {rows['bf16_minus_float32']:+.4f} | within seed spread: "
                         f"{'yes' if rows['within_seed_spread'] else 'no'} | |")
    lines += ["", "Per run (mAP50-95 / mAP50 after the last epoch):", ""]
    lines += [f"- {r['setup']} {r['amp']} seed {r['seed']}: {r['final_map50_95']:.4f} / {r['final_map50']:.4f}"
              for r in result["runs"]]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / "bf16_study.json"
    previous = json.loads(json_path.read_text()) if json_path.is_file() else {}
    runs = [r for r in previous.get("runs", []) if previous.get("setup", {}).get("epochs") == args.epochs]
    done = {(r["setup"], r["amp"], r["seed"]) for r in runs}
    # native_bf16: what --amp auto decides by (AMX, AVX512-BF16 or None).
    setup = {"cpu": cpu_model(), "cpus": torch.get_num_threads(), "native_bf16": native_bf16(),
             "torch": torch.__version__, "epochs": args.epochs, "seeds": args.seeds}
    with tempfile.TemporaryDirectory(prefix="bf16-study-") as folder:
        work = Path(folder)
        for seed in args.seeds:
            for name in args.setups:
                # Alternating the precision first in each seed spreads machine drift over both.
                for amp in (("off", "bf16") if seed % 2 == 0 else ("bf16", "off")):
                    if (name, amp, seed) in done:
                        continue
                    runs.append(train(name, amp, seed, args.epochs, work))
                    result = {"setup": setup, "runs": runs, "summary": summarise(runs)}
                    json_path.write_text(json.dumps(result, indent=2) + "\n")
                    print(f"{name} {amp} seed {seed}: final mAP50-95 {runs[-1]['final_map50_95']:.4f} "
                          f"({runs[-1]['wall_s']:.0f} s)", flush=True)
    result = {"setup": setup, "runs": runs, "summary": summarise(runs)}
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    write_table(result, args.out / "bf16_study.md")
    print((args.out / "bf16_study.md").read_text())


if __name__ == "__main__":
    main()
