"""The cheapest upgrade path for a YOLOv5 user: YOLOv5u (YOLOv5's backbone and neck with the anchor-free head)
started from the official yolov5n.pt, against the same fine-tune of yolov5n itself, on coco128.

``--model yolov5nu --pretrained yolov5n.pt`` keeps every backbone and neck tensor of the YOLOv5 checkpoint (the
same layers, ``model.0`` … ``model.23``) and starts only the head fresh; each run takes its family's loss gains and
augmentation recipe (YOLOv5u: Ultralytics' gains and ``close_mosaic``), both SGD at 0.01. Both train for the same
epochs at the same size and batch on coco128 and are validated on it (its val split is its train split: this
measures how fast each learns, not how well it generalises).

    python benchmarks/bench_transfer.py                 # 30 epochs at 320 px; about 20 minutes on 2 idle CPU cores
    python benchmarks/bench_transfer.py --epochs 1 --img 160 --no-save   # a quick check that it runs

It prints each run's mAP50 and mAP50-95 after every epoch and writes them to ``results/transfer.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import tempfile
import time

import torch
from common import COCO128, ROOT, YOLOV5N

from yolotrain import train

# Both with SGD at 0.01 (YOLOv5's fine-tune): on coco128's 80 classes the anchor-free recipe's --optimizer auto
# picks AdamW at 0.01 / 84 = 1.2e-4 for a run this short (2 optimiser steps an epoch), too little to train a fresh
# head in a few dozen steps (measured: mAP50 0.000 after 10 epochs), as it would under Ultralytics.
RUNS = {"yolov5n (from yolov5n.pt)": {"model": str(YOLOV5N)},
        "yolov5nu (backbone and neck from yolov5n.pt)": {"model": "yolov5nu", "pretrained": str(YOLOV5N),
                                                         "optimizer": "SGD"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--img", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--no-save", action="store_true", help="print only; leave results/transfer.json as it is")
    args = parser.parse_args()
    if not (COCO128 / "images").is_dir() or not YOLOV5N.is_file():
        raise SystemExit(f"needs {COCO128} and {YOLOV5N}")
    results = {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
               "epochs": args.epochs, "img_size": args.img, "batch_size": args.batch, "runs": {}}
    with tempfile.TemporaryDirectory() as folder:
        for label, settings in RUNS.items():
            start = time.perf_counter()
            run = train(data=str(COCO128 / "data.yaml"), epochs=args.epochs, img_size=args.img,
                        batch_size=args.batch, workers=2, device="cpu", project=folder, plots=False, **settings)
            with (run.save_dir / "results.csv").open(newline="") as f:
                rows = list(csv.DictReader(f))
            curve = [(float(r["mAP50"]), float(r["mAP50-95"])) for r in rows if r["mAP50"] != ""]
            results["runs"][label] = {"mAP50": curve[-1][0], "mAP50-95": curve[-1][1], "curve": curve,
                                      "seconds": round(time.perf_counter() - start, 1)}
            print(f"{label}: mAP50 {curve[-1][0]:.3f}  mAP50-95 {curve[-1][1]:.3f}  "
                  f"({results['runs'][label]['seconds']:.0f} s)")
    if not args.no_save:
        out = ROOT / "benchmarks" / "results" / "transfer.json"
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"written {out}")


if __name__ == "__main__":
    main()
