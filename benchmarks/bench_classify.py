"""Classification speed against the reference in the same run: a short fine-tune of yolov5n-cls on coco128-cls
(ours: ``yolotrain train``; the reference: ``classify/train.py``), each in a process of its own, both from one
checkpoint in the reference's layout (its ``ClassificationModel`` cut from the official yolov5n.pt, with a fresh
11-class head: the reference's own ``--model yolov5n.pt`` path fails in this version of the package), then
validation of one model (the reference's trained checkpoint, which both read; ours: ``yolotrain.val``, the
reference: ``classify/val.py``) on two image sets: the val split (36 crops, where start-up weighs most: reading
the model, listing the images) and the train split read as a val set (161 crops); ours with its defaults (half
precision where the CPU computes it natively: bfloat16 with AVX512-BF16 or AMX) and in float32. Each validation runs
in a process of its own: a warm-up pass, then ``--passes`` timed passes, each a whole ``val`` call (model file read,
loader built, every image decoded and classified); the medians of wall and process CPU time are reported (CPU
time, all threads of the process, is what to compare on a machine busy with other work).

    python benchmarks/bench_classify.py          # about 1.5 minutes on 2 idle cores; adds "speed" to classify.json
    python benchmarks/bench_classify.py --threads 1   # CPU times that other work on the machine disturbs least
    python benchmarks/bench_classify.py --smoke --out /tmp/classify.json   # tiny: checks the script runs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import ROOT, SHARED, YOLOV5N, reference_env

COCO128_CLS = SHARED / "datasets" / "coco128-cls"

# Each validation process runs a warm-up pass, then the timed passes; the script prints the wall and process CPU
# seconds of each pass and the last pass's top-1/top-5. VALIDATE is the one line that differs between the sides.
TIMED_VAL = """
import json, sys, time
import numpy as np
np.trapz = getattr(np, "trapz", np.trapezoid)
weights, data, img, batch, passes, project = sys.argv[1:7]
{setup}
walls, cpus = [], []
for _ in range(int(passes) + 1):
    wall, cpu = time.perf_counter(), time.process_time()
    top1, top5 = validate()
    walls.append(time.perf_counter() - wall)
    cpus.append(time.process_time() - cpu)
print(json.dumps({{"wall_s": walls[1:], "cpu_s": cpus[1:], "top1": float(top1), "top5": float(top5)}}))
"""
OUR_VAL = TIMED_VAL.format(setup="""
import yolotrain
kwargs = dict(img_size=int(img), batch_size=int(batch), workers=0, verbose=False, plots=False, device="cpu")
def validate():
    metrics = yolotrain.val(weights, data, **kwargs)
    return metrics.top1, metrics.top5
""")
# Ours in float32 (the defaults run in bfloat16 on CPUs with native bf16 instructions).
OUR_VAL_FP32 = OUR_VAL.replace('device="cpu")', 'device="cpu", half=False)')
REFERENCE_VAL = TIMED_VAL.format(setup="""
from yolov5.classify import val
kwargs = dict(weights=weights, data=data, imgsz=int(img), batch_size=int(batch), workers=0, device="cpu",
              project=project, exist_ok=True)
def validate():
    return val.run(**kwargs)[:2]
""")
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
# Its GenericLogger reads opt.neptune_token whenever the neptune package is installed (our loggers extra brings
# it), and its classify options have none: no token, as when the option is not given.
train.run(model=model, data=data, epochs=int(epochs), imgsz=int(img), batch_size=int(batch), workers=int(workers),
          device="cpu", project=project, name="exp", neptune_token=None)
"""


def run(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    """Wall seconds and standard output of ``command``; its error output when it fails."""
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command[:4])} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started, done.stdout


def timed_val(script: str, weights: Path, data: Path, a: argparse.Namespace, env: dict[str, str], tmp: Path,
              images: int) -> dict[str, float]:
    """Median wall and CPU seconds of one ``val`` pass in a process of its own, images/s, top-1/top-5."""
    _, out = run([sys.executable, "-c", script, str(weights), str(data), str(a.img), str(a.batch), str(a.passes),
                  str(tmp / "reference-val")], env, tmp)
    result = json.loads(out.splitlines()[-1])
    wall, cpu = statistics.median(result["wall_s"]), statistics.median(result["cpu_s"])
    return {"wall_s": round(wall, 4), "cpu_s": round(cpu, 4), "images_per_second": round(images / wall, 1),
            "top1": round(result["top1"], 4), "top5": round(result["top5"], 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--img", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--passes", type=int, default=5, help="timed validation passes of each side (median)")
    parser.add_argument("--threads", type=int, help="torch threads of every process, both sides (default: torch's); "
                        "1 keeps CPU times comparable on a machine busy with other work")
    parser.add_argument("--smoke", action="store_true", help="1 epoch at 64 px, 1 timed pass: checks the script runs")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "classify.json"))
    a = parser.parse_args()
    if a.smoke:
        a.epochs, a.img, a.passes = 1, 64, 1
    if not (COCO128_CLS.is_dir() and YOLOV5N.is_file()):
        raise SystemExit(f"needs {COCO128_CLS} and {YOLOV5N}")
    with tempfile.TemporaryDirectory(prefix="bench-classify-") as folder:
        tmp = Path(folder)
        env = {**os.environ, **reference_env(tmp / "config")}
        if a.threads:
            env["OMP_NUM_THREADS"] = str(a.threads)
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
        train_as_val = tmp / "train-as-val"
        train_as_val.mkdir()
        (train_as_val / "val").symlink_to(COCO128_CLS / "train", target_is_directory=True)
        val_sets = {}
        for name, data, split in (("val_split", COCO128_CLS, "val"), ("train_split_as_val", train_as_val, "train")):
            images = sum(1 for _ in (COCO128_CLS / split).rglob("*.jpg"))
            ours = timed_val(OUR_VAL, weights, data, a, env, tmp, images)
            reference = timed_val(REFERENCE_VAL, weights, data, a, env, tmp, images)
            ours_fp32 = timed_val(OUR_VAL_FP32, weights, data, a, env, tmp, images)
            val_sets[name] = {"images": images, "ours": ours, "ours_fp32": ours_fp32, "reference": reference,
                              "speedup_wall": round(reference["wall_s"] / ours["wall_s"], 2),
                              "speedup_cpu": round(reference["cpu_s"] / ours["cpu_s"], 2),
                              "fp32_speedup_wall": round(reference["wall_s"] / ours_fp32["wall_s"], 2),
                              "fp32_speedup_cpu": round(reference["cpu_s"] / ours_fp32["cpu_s"], 2)}
    speed = {
        "setup": {"model": "the reference's ClassificationModel cut from yolov5n.pt (fresh head)",
                  "data": "coco128-cls", "epochs": a.epochs, "img_size": a.img, "batch": a.batch,
                  "workers": a.workers, "device": "cpu", "machine": platform.processor() or platform.machine(),
                  "threads": a.threads or torch.get_num_threads(), "command": "python benchmarks/bench_classify.py"},
        "train_wall_seconds": {"ours": round(ours_train, 1), "reference": round(reference_train, 1),
                               "note": "whole processes: start-up, data scan, training, validation, checkpoints"},
        "val": {"model": "the reference's trained best.pt, read by both", "passes": a.passes,
                "note": "median of the timed passes after a warm-up, each a whole val call in the same process; "
                        "speedups are the reference's seconds over ours", **val_sets},
    }
    out = Path(a.out)
    results = json.loads(out.read_text()) if out.is_file() else {}
    results["speed"] = speed
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(speed, indent=2))


if __name__ == "__main__":
    main()
