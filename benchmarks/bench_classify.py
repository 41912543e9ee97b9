"""Classification speed against the reference in the same run: a short fine-tune of yolov5n-cls on coco128-cls
(ours: ``yolotrain train``; the reference: ``classify/train.py``), each in a process of its own, both from one
checkpoint in the reference's layout (its ``ClassificationModel`` cut from the official yolov5n.pt, with a fresh
11-class head: the reference's own ``--model yolov5n.pt`` path fails in this version of the package), then
validation of one model (the reference's trained checkpoint, which both read) on its val split (ours:
``yolotrain.val``; the reference: ``classify/val.py``), timed after a warm-up pass.

    python benchmarks/bench_classify.py          # adds "speed" to benchmarks/results/classify.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, SHARED, YOLOV5N, reference_env

COCO128_CLS = SHARED / "datasets" / "coco128-cls"

# Each validation is timed inside its process after one warm-up pass; the script prints seconds and top-1.
OUR_VAL = """
import json, sys, time, yolotrain
weights, data, img, batch = sys.argv[1:5]
kwargs = dict(img_size=int(img), batch_size=int(batch), workers=0, verbose=False, plots=False, device="cpu")
yolotrain.val(weights, data, **kwargs)
t = time.perf_counter()
metrics = yolotrain.val(weights, data, **kwargs)
print(json.dumps({"seconds": time.perf_counter() - t, "top1": metrics.top1, "top5": metrics.top5}))
"""
REFERENCE_VAL = """
import json, sys, time
import numpy as np
np.trapz = getattr(np, "trapz", np.trapezoid)
from yolov5.classify import val
weights, data, img, batch, project = sys.argv[1:6]
kwargs = dict(weights=weights, data=data, imgsz=int(img), batch_size=int(batch), workers=0, device="cpu",
              project=project, exist_ok=True)
val.run(**kwargs)
t = time.perf_counter()
top1, top5, _ = val.run(**kwargs)
print(json.dumps({"seconds": time.perf_counter() - t, "top1": float(top1), "top5": float(top5)}))
"""
PREPARE = """
import sys, torch
from pathlib import Path
import numpy as np
np.trapz = getattr(np, "trapz", np.trapezoid)
import yolov5
from yolov5.models.yolo import ClassificationModel, DetectionModel
from yolotrain.interop import load_model
weights, data, out = sys.argv[1:4]
names = sorted(p.name for p in (Path(data) / "train").iterdir() if p.is_dir())
detector = DetectionModel(str(Path(yolov5.__file__).parent / "models" / "yolov5n.yaml"))
detector.load_state_dict(load_model(weights).state_dict())
torch.manual_seed(0)
model = ClassificationModel(model=detector, nc=len(names))
model.names = dict(enumerate(names))
torch.save({"model": model, "ema": None, "epoch": 0}, out)
"""
REFERENCE_TRAIN = """
import sys
import numpy as np
np.trapz = getattr(np, "trapz", np.trapezoid)
from yolov5.classify import train
model, data, epochs, img, batch, workers, project = sys.argv[1:8]
train.run(model=model, data=data, epochs=int(epochs), imgsz=int(img), batch_size=int(batch), workers=int(workers),
          device="cpu", project=project, name="exp")
"""


def run(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    """Wall seconds and standard output of ``command``; its error output when it fails."""
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command[:4])} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--img", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "classify.json"))
    a = parser.parse_args()
    if not (COCO128_CLS.is_dir() and YOLOV5N.is_file()):
        raise SystemExit(f"needs {COCO128_CLS} and {YOLOV5N}")
    with tempfile.TemporaryDirectory(prefix="bench-classify-") as folder:
        tmp = Path(folder)
        env = {**os.environ, **reference_env(tmp / "config")}
        start = tmp / "yolov5n-cls.pt"
        run([sys.executable, "-c", PREPARE, str(YOLOV5N), str(COCO128_CLS), str(start)], env, tmp)
        ours_train, _ = run([sys.executable, "-m", "yolotrain", "train", "--model", str(start), "--data",
                             str(COCO128_CLS), "--epochs", str(a.epochs), "--img", str(a.img), "--batch-size",
                             str(a.batch), "--workers", str(a.workers), "--device", "cpu", "--no-plots",
                             "--project", str(tmp / "ours")], env, tmp)
        reference_train, _ = run([sys.executable, "-c", REFERENCE_TRAIN, str(start), str(COCO128_CLS),
                                  str(a.epochs), str(a.img), str(a.batch), str(a.workers), str(tmp / "reference")],
                                 env, tmp)
        weights = tmp / "reference" / "exp" / "weights" / "best.pt"
        _, ours_out = run([sys.executable, "-c", OUR_VAL, str(weights), str(COCO128_CLS), str(a.img), str(a.batch)],
                          env, tmp)
        _, reference_out = run([sys.executable, "-c", REFERENCE_VAL, str(weights), str(COCO128_CLS), str(a.img),
                                str(a.batch), str(tmp / "reference-val")], env, tmp)
    ours_val, reference_val = json.loads(ours_out.splitlines()[-1]), json.loads(reference_out.splitlines()[-1])
    images = sum(1 for _ in (COCO128_CLS / "val").rglob("*.jpg"))
    speed = {
        "setup": {"model": "the reference's ClassificationModel cut from yolov5n.pt (fresh head)",
                  "data": "coco128-cls", "epochs": a.epochs, "img_size": a.img, "batch": a.batch,
                  "workers": a.workers, "device": "cpu", "machine": platform.processor() or platform.machine(),
                  "command": "python benchmarks/bench_classify.py"},
        "train_wall_seconds": {"ours": round(ours_train, 1), "reference": round(reference_train, 1),
                               "note": "whole processes: start-up, data scan, training, validation, checkpoints"},
        "val": {"ours": {**ours_val, "images_per_second": images / ours_val["seconds"]},
                "reference": {**reference_val, "images_per_second": images / reference_val["seconds"]},
                "model": "the reference's trained best.pt, read by both"},
    }
    out = Path(a.out)
    results = json.loads(out.read_text()) if out.is_file() else {}
    results["speed"] = speed
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(speed, indent=2))


if __name__ == "__main__":
    main()
