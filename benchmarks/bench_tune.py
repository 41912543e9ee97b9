"""A short ``yolotrain tune`` on coco128: the best trial's fitness against the settings as given.

The official yolov5n weights are fine-tuned for a few epochs per trial at a small image size; the
study's first trial is the settings as given (the defaults), so both fitness values come from the
same run, data and budget. Fitness is the reference's: 0.1 mAP50 + 0.9 mAP50-95 (coco128's training
images are also its validation images, so this measures the search, not generalisation).

    python benchmarks/bench_tune.py                 # writes benchmarks/results/tune.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from common import COCO128, ROOT, YOLOV5N

# A space for a short fine-tune: the learning rate, the warm-up (epochs of it eat a short run) and
# the two augmentations that change the images most.
SPACE = {"lr0": {"low": 0.001, "high": 0.02, "log": True}, "warmup_epochs": [0.0, 3.0], "mosaic": [0.0, 1.0],
         "scale": [0.2, 0.7]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--img", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "tune.json"))
    a = parser.parse_args()

    from yolotrain import tune
    from yolotrain.data.sources import link_subset

    with tempfile.TemporaryDirectory() as tmp:
        data = link_subset(COCO128 / "data.yaml", Path(tmp) / "data", a.images)
        started = time.perf_counter()
        result = tune(data=str(data), model=str(YOLOV5N), epochs=a.epochs, img_size=a.img, batch_size=a.batch,
                      workers=min(2, os.cpu_count() or 1), trials=a.trials, space=SPACE, sampler="tpe",
                      pruner="median", project=str(Path(tmp) / "tune"), tensorboard=False, plots=False, seed=0,
                      autoanchor=False)  # refitted anchors would undo the pretrained head at this size
        seconds = time.perf_counter() - started
        table = (result.save_dir / "trials.csv").read_text().splitlines()
    report = {
        "setup": {"weights": "official yolov5n.pt (fine-tuned)", "data": f"coco128 ({a.images} images)",
                  "epochs_per_trial": a.epochs, "img_size": a.img, "batch": a.batch, "trials": a.trials,
                  "sampler": "tpe", "pruner": "median", "autoanchor": False, "space": SPACE,
                  "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (shared)"},
        "default_fitness": result.default_fitness,
        "best_fitness": result.best_fitness,
        "best_trial": result.best_trial,
        "best_params": result.best_params,
        "gain": None if result.default_fitness is None or result.best_fitness is None
        else result.best_fitness - result.default_fitness,
        "trial_states": {k: v for k, v in result.trials.items() if v},
        "trials_csv": table,
        "seconds": round(seconds, 1),
    }
    Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("default_fitness", "best_fitness", "gain", "seconds")}))


if __name__ == "__main__":
    main()
