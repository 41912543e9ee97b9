"""Predict speed with and without reduced JPEG decoding, against ultralytics' predict, on coco128 and on coco128
upscaled 4x, in one run.

The model is ultralytics' ``--model`` (random weights, seeded, saved as its checkpoint that both sides load:
``bench_anchor_free.reference_checkpoint``); the folder is the first ``--images`` coco128 images, as they are
(640 px) and upscaled 4x (Lanczos, JPEG quality 92, ~2560 px: ``bench_scaling.upscaled_copy``). Each pass is a
whole predict over the folder with the model loaded once (read, letterbox, model, NMS, boxes in image pixels;
nothing saved); the sides alternate and each one's fastest pass is kept (``bench_anchor_free.fastest_alternating``):

- ``ours_stream`` / ``ours_stream_fp32``: ``yolotrain.predict(stream=True)``, our defaults' precision and float32,
  against ``reference``, ultralytics' ``YOLO.predict(stream=True)``: the rows of ``bench_anchor_free.py`` (results
  that keep their image, so every file is decoded whole, as ultralytics does);
- ``ours_list``: ``yolotrain.predict(...)`` returning the list (no image kept, nothing saved): large JPEGs decoded
  at 1/2, 1/4 or 1/8 (``reduced_decode``, the default), and ``ours_list_full`` the same with
  ``reduced_decode=False``.

Images/s is the folder's images over the fastest pass. Ratios are against ultralytics (above 1: ours faster).

    python benchmarks/bench_predict_decode.py --threads 1      # the recorded results (a busy 2-core machine)
    python benchmarks/bench_predict_decode.py --smoke --out /tmp/pd   # tiny: checks the script runs

Writes ``benchmarks/results/predict_decode.json`` and ``predict_decode.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from bench_anchor_free import fastest_alternating, image_folder, offline_reference, predict_sides, reference_checkpoint
from bench_scaling import upscaled_copy
from common import COCO128, ROOT, copy_images, cpu_model

from yolotrain.engine.prepare import autocast_dtype

SIDES = ("ours_stream", "ours_stream_fp32", "ours_list", "ours_list_full", "reference")


def sides(weights: Path, folder: Path, img_size: int) -> dict[str, Callable[[], int]]:
    """The passes over ``folder`` (each returns the number of boxes found), models loaded once."""
    from yolotrain import predict
    from yolotrain.interop import resolve_model

    anchor_free = predict_sides(weights, folder, img_size)
    ours = resolve_model(str(weights))

    def listed(reduced: bool) -> int:
        return sum(len(r.boxes) for r in predict(ours, folder, img_size=img_size, device="cpu", reduced_decode=reduced))

    return {"ours_stream": anchor_free["ours_half"], "ours_stream_fp32": anchor_free["ours_fp32"],
            "ours_list": lambda: listed(True), "ours_list_full": lambda: listed(False),
            "reference": anchor_free["reference"]}


def table(result: dict) -> str:
    setup = result["setup"]
    lines = [f"# Predict with and without reduced JPEG decoding, against ultralytics ({setup['cpu']})", "",
             f"`{setup['command']}`", "",
             f"{setup['model']} (random weights, seeded), {setup['images']} images per folder, "
             f"{setup['torch_threads']} torch threads, ultralytics {setup['ultralytics']}; our defaults' precision on "
             f"this CPU: {setup['auto_precision']} (ultralytics: float32); fastest of {setup['rounds']} alternating "
             f"passes; 1-minute load average {setup['load_average_1min_at_start']:.1f} at the start, "
             f"{setup['load_average_1min_at_end']:.1f} at the end. Images/s (ratio to ultralytics).", "",
             "| data | px | ours stream (defaults) | ours stream float32 | ours list, reduced decode | "
             "ours list, --no-reduced-decode | ultralytics stream |", "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        rate = row["images_per_s"]
        cells = [f"{rate[s]:.1f} ({rate[s] / rate['reference']:.2f}x)" for s in SIDES[:-1]]
        lines.append(f"| {row['data']} | {row['img_size']} | {' | '.join(cells)} | {rate['reference']:.1f} |")
    lines += ["", result["reading"]]
    return "\n".join(lines) + "\n"


def reading(rows: list[dict]) -> str:
    parts = []
    for row in rows:
        rate = row["images_per_s"]
        parts.append(f"{row['data']} at {row['img_size']}: list with reduced decode "
                     f"{rate['ours_list'] / rate['reference']:.2f}x ultralytics "
                     f"({rate['ours_list'] / rate['ours_list_full']:.2f}x ours without it), stream "
                     f"{rate['ours_stream'] / rate['reference']:.2f}x")
    return "; ".join(parts) + "."


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="yolov8n", help="ultralytics detector built from its YAML")
    p.add_argument("--img", type=int, nargs="+", default=[320, 640], help="prediction sizes")
    p.add_argument("--images", type=int, default=32, help="coco128 images per folder")
    p.add_argument("--rounds", type=int, default=3, help="passes per side")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: PyTorch's default)")
    p.add_argument("--smoke", action="store_true", help="2 images at 64 px, 1 round")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    a = p.parse_args()
    if a.smoke:
        a.images, a.img, a.rounds = 2, [64], 1
    if not COCO128.is_dir():
        sys.exit(f"needs {COCO128}")
    if importlib.util.find_spec("ultralytics") is None:
        sys.exit("needs the reference package ultralytics: pip install '.[parity]'")
    if a.threads:
        torch.set_num_threads(a.threads)
    work = Path(tempfile.mkdtemp(prefix="bench-predict-decode-"))
    offline_reference(work)
    import ultralytics

    from yolotrain.yamlio import read_yaml

    names = read_yaml(COCO128 / "data.yaml")["names"]
    names = list(names.values()) if isinstance(names, dict) else list(names)
    weights = reference_checkpoint(a.model, names, work / f"{a.model}.pt")
    folders = {"coco128 (640 px)": image_folder(COCO128 / "images" / "train2017", work / "small", a.images),
               "coco128 4x (2560 px)": upscaled_copy(copy_images(COCO128, work / "copy", a.images), work / "big")}
    setup = {"cpu": cpu_model(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
             "torch": torch.__version__, "ultralytics": ultralytics.__version__, "model": a.model,
             "images": a.images, "rounds": a.rounds,
             "auto_precision": "bf16" if autocast_dtype("auto", torch.device("cpu")) else "fp32",
             "command": "python benchmarks/bench_predict_decode.py " + shlex.join(sys.argv[1:]),
             "load_average_1min_at_start": os.getloadavg()[0]}
    rows = []
    for img_size in a.img:
        for data, folder in folders.items():
            passes = fastest_alternating(sides(weights, folder, img_size), a.rounds)
            rate = {side: a.images / passes[side]["best_s"] for side in SIDES}
            rows.append({"data": data, "img_size": img_size, "images_per_s": rate, "passes": passes})
            print(data, img_size, json.dumps({s: round(v, 2) for s, v in rate.items()}), flush=True)
    setup["load_average_1min_at_end"] = os.getloadavg()[0]
    result = {"setup": setup, "rows": rows, "reading": reading(rows)}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "predict_decode.json").write_text(json.dumps(result, indent=2) + "\n")
    (a.out / "predict_decode.md").write_text(table(result))
    print(table(result))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
