"""Evaluation speed against the reference on the same weights and images, in one process.

Measures (1) ``val`` end to end on coco128 (images/s, loading included) and (2) single-image
predict latency (letterbox → model → NMS → boxes in original pixels) for ours (float32, and with
``half``: bfloat16 on the CPU, the default on CPUs with native bf16) and for the reference ``val.run`` /
detect path (float32: its ``half`` is CUDA-only), and writes the ratios to ``benchmarks/results/eval.json``.

The first val pass in a process pays one-off costs (lazy imports, oneDNN kernel set-up for each new
input shape, a cold file cache) that would all fall on whichever side ran first, and other work on a
shared machine adds noise; so val runs ``--rounds`` times per side in alternating order (ours first
in odd rounds, the reference first in even ones) and each side's fastest pass is reported.

    python benchmarks/bench_eval.py [--img 640] [--images 128] [--rounds 2] [--repeats 20]
    python benchmarks/bench_eval.py --smoke --out /tmp/eval.json   # tiny run: checks the script works
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from common import COCO128, ROOT, alias_numpy_trapz, latency, reference_env
from common import YOLOV5N as WEIGHTS

from yolotrain.data.sources import link_subset


def import_reference(config_dir: str):
    """The reference package, offline, with its NMS time limit off and no font download."""
    os.environ.update(reference_env(config_dir))
    alias_numpy_trapz()
    import yolov5.utils.general as general
    import yolov5.val as reference_val

    general.check_font = lambda *a, **k: None
    general.time = types.SimpleNamespace(time=lambda: 0.0)  # else its NMS drops boxes on a slow CPU
    return reference_val


def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def alternating_passes(sides: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[tuple[float, object]]]:
    """``(seconds, result)`` of each side's passes; the order of the sides flips every round."""
    passes: dict[str, list[tuple[float, object]]] = {name: [] for name in sides}
    names = list(sides)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            passes[name].append(timed(sides[name]))
    return passes


def val_contenders(weights: Path, data: Path, img_size: int, work: Path, reference_val,
                   batch_size: int = 32) -> dict[str, Callable[[], object]]:
    """One ``val`` pass each of ours (float32, and ``half``: bfloat16 on the CPU) and of the reference's
    ``val.run`` (float32) on ``weights`` and ``data``; ``reference_val`` from :func:`import_reference`."""
    from yolotrain.eval import val

    common = dict(batch_size=batch_size, device="cpu")
    return {
        "ours": lambda: val(str(weights), data, img_size=img_size, workers=0, verbose=False, half=False, **common),
        "ours_half": lambda: val(str(weights), data, img_size=img_size, workers=0, verbose=False, half=True,
                                 **common),
        "reference": lambda: reference_val.run(data=str(data), weights=str(weights), imgsz=img_size, workers=0,
                                               plots=False, half=False, project=str(work), name="ref",
                                               exist_ok=True, **common),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--img", type=int, default=640)
    p.add_argument("--images", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2, help="val passes per side, in alternating order")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--smoke", action="store_true", help="128 px, 8 images, one round, 2 repeats")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "eval.json"))
    a = p.parse_args()
    if a.smoke:
        a.img, a.images, a.rounds, a.repeats = 128, 8, 1, 2
    if not (COCO128.is_dir() and WEIGHTS.is_file()):
        sys.exit(f"needs {COCO128} and {WEIGHTS}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-eval-"))
    data = link_subset(COCO128 / "data.yaml", tmp / "data", a.images)  # the subset the parity tests use
    reference_val = import_reference(str(tmp / "config"))

    import cv2
    from yolov5.models.experimental import attempt_load
    from yolov5.utils.augmentations import letterbox
    from yolov5.utils.general import non_max_suppression, scale_boxes

    from yolotrain.prediction.run import Predictor

    sides = val_contenders(WEIGHTS, data, a.img, tmp, reference_val)
    load_before = os.getloadavg()[0]
    passes = alternating_passes(sides, a.rounds)
    ours_s, ours_m = min(passes["ours"], key=lambda p: p[0])
    half_s, half_m = min(passes["ours_half"], key=lambda p: p[0])
    ref_s, ref_r = min(passes["reference"], key=lambda p: p[0])

    image = cv2.imread(str(sorted((COCO128 / "images" / "train2017").glob("*.jpg"))[0]))
    predictor = Predictor(str(WEIGHTS), img_size=a.img, device="cpu", half=False)
    half_predictor = Predictor(str(WEIGHTS), img_size=a.img, device="cpu", half=True)
    ref_model = attempt_load(str(WEIGHTS), device="cpu", fuse=True).eval()

    def reference_detect():
        im = letterbox(image, a.img, stride=32, auto=True)[0].transpose((2, 0, 1))[::-1]
        x = torch.from_numpy(np.ascontiguousarray(im)).float()[None] / 255
        with torch.no_grad():
            det = non_max_suppression(ref_model(x)[0], 0.25, 0.45, max_det=1000)[0]
        det[:, :4] = scale_boxes(x.shape[2:], det[:, :4], image.shape).round()
        return det

    ours_lat = latency(lambda: predictor.predict_image(image), a.repeats)
    half_lat = latency(lambda: half_predictor.predict_image(image), a.repeats)
    ref_lat = latency(reference_detect, a.repeats)

    result = {
        "setup": {"img_size": a.img, "images": a.images, "batch_size": 32, "device": "cpu", "workers": 0,
                  "load_average_1min_at_start": load_before,
                  "torch_threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
                  "torch": torch.__version__},
        "val": {"ours_images_per_s": a.images / ours_s, "reference_images_per_s": a.images / ref_s,
                "speedup": ref_s / ours_s, "rounds": a.rounds,
                "ours_half_images_per_s": a.images / half_s, "half_speedup": ref_s / half_s,
                "ours_pass_s": [round(t, 2) for t, _ in passes["ours"]],
                "reference_pass_s": [round(t, 2) for t, _ in passes["reference"]],
                "ours_half_pass_s": [round(t, 2) for t, _ in passes["ours_half"]],
                "ours_mAP50-95": ours_m.map, "ours_half_mAP50-95": half_m.map,
                "reference_mAP50-95": float(ref_r[0][3])},
        "predict_latency_ms": {"ours": ours_lat * 1e3, "ours_half": half_lat * 1e3, "reference": ref_lat * 1e3,
                               "ours_over_reference": ours_lat / ref_lat, "half_over_reference": half_lat / ref_lat},
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
