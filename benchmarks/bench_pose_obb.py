"""Do the pose and oriented-box tasks learn? A fine-tune of yolov5nu-obb on coco128-obb and of yolov5nu-pose on
coco8-pose, both started from the official yolov5n.pt's backbone and neck (their heads start fresh).

``model="yolov5nu-obb", pretrained="yolov5n.pt"`` keeps every backbone and neck tensor of the YOLOv5 checkpoint and
starts the OBB (or pose) head fresh, as ``yolotrain train --model yolov5nu-obb --weights yolov5n.pt`` does. The pose
runs take the family's ``--optimizer auto``, AdamW at 0.002 for a short run of 1 class; coco128-obb's is AdamW at
0.002 as well, given (auto would pick 0.002 * 5 / (4 + 80) = 1.2e-4 for its 80 classes, too little to train a fresh
head in 130 steps). Each step is one batch (``nominal_batch`` equal to the batch: the default 64 would accumulate 8
batches, one or two steps an epoch on these small sets), without warm-up (its 100-step floor would span most of a
run). Every epoch is validated: coco128-obb on its own train images (its YAML's val split is its train split),
coco8-pose on its 4 val images, which it never trains on ("pose"), and on its 4 training images ("pose-fit"). The
sizes and epochs are cut to what a 2-core CPU shared with other jobs trains in about half an hour.

    python benchmarks/bench_pose_obb.py                       # all three runs, one after the other
    python benchmarks/bench_pose_obb.py --only pose           # one task, keeping the other's recorded results
    python benchmarks/bench_pose_obb.py --smoke               # 1 epoch at 128 px each: it runs; nothing written

It prints each task's metrics after the first and the last epoch and writes them with every epoch's curve to
``results/pose_obb.json`` and ``results/pose_obb.md``.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import tempfile
import time
from pathlib import Path

import torch
import yaml
from common import ROOT, SHARED, YOLOV5N

from yolotrain import train

DATASETS = SHARED / "datasets"
# Each task's run: its data, the architecture, the settings over its family's recipe, and the metric columns of
# results.csv to record (box rows for both; keypoint rows for pose). "pose-fit" validates on coco8-pose's 4 training
# images (as coco128-obb's run does on its own): whether the keypoints are learnt at all, apart from generalising.
RUNS = {
    "obb": {"data": DATASETS / "coco128-obb" / "data.yaml", "model": "yolov5nu-obb",
            "settings": {"epochs": 20, "img_size": 256, "batch_size": 8, "optimizer": "AdamW", "lr0": 0.002},
            "metrics": ("mAP50", "mAP50-95")},
    "pose": {"data": DATASETS / "coco8-pose" / "coco8-pose.yaml", "model": "yolov5nu-pose",
             "settings": {"epochs": 250, "img_size": 256, "batch_size": 4},
             "metrics": ("mAP50", "mAP50-95", "pose_mAP50", "pose_mAP50-95")},
    "pose-fit": {"data": DATASETS / "coco8-pose" / "coco8-pose.yaml", "model": "yolov5nu-pose", "val_on_train": True,
                 "settings": {"epochs": 250, "img_size": 256, "batch_size": 4},
                 "metrics": ("mAP50", "mAP50-95", "pose_mAP50", "pose_mAP50-95")},
}
RESULTS = ROOT / "benchmarks" / "results" / "pose_obb"


def fine_tune(task: str, project: str, smoke: bool) -> dict:
    """Train one task's run into ``project``; its settings, seconds, and metrics after every epoch."""
    run = RUNS[task]
    settings = {**run["settings"], **({"epochs": 1, "img_size": 128} if smoke else {})}
    data = run["data"]
    if run.get("val_on_train"):  # a copy of the YAML, in the run's folder, whose val split is the train one
        config = yaml.safe_load(data.read_text())
        config.update(path=str(data.parent), val=config["train"])
        Path(project).mkdir(parents=True, exist_ok=True)
        data = Path(project) / f"{data.stem}-val-on-train.yaml"
        data.write_text(yaml.safe_dump(config, sort_keys=False))
    start = time.perf_counter()
    result = train(model=run["model"], pretrained=str(YOLOV5N), data=str(data),
                   nominal_batch=settings["batch_size"], warmup_epochs=0, workers=2, device="cpu", project=project,
                   name=task, plots=False, **settings)
    seconds = round(time.perf_counter() - start, 1)
    with (result.save_dir / "results.csv").open(newline="") as f:
        rows = [row for row in csv.DictReader(f) if row[run["metrics"][0]] != ""]
    curve = {name: [float(row[name]) for row in rows] for name in run["metrics"]}
    shown = data.name if run.get("val_on_train") else f"../{data.relative_to(SHARED.parent)}"
    command = (f"yolotrain train --model {run['model']} --weights {YOLOV5N.name} --data {shown} "
               f"--img {settings['img_size']} --batch {settings['batch_size']} --epochs {settings['epochs']} "
               + (f"--optimizer {settings['optimizer']} --lr0 {settings['lr0']} " if "optimizer" in settings else "")
               + (f"--conf {settings['conf']} " if "conf" in settings else "")
               + f"--nominal-batch {settings['batch_size']} --warmup-epochs 0 --workers 2 "
               "--device cpu")
    return {"command": command, **settings, "seconds": seconds,
            "first_epoch": {name: values[0] for name, values in curve.items()},
            "last_epoch": {name: values[-1] for name, values in curve.items()},
            "best": {name: max(values) for name, values in curve.items()}, "curve": curve}


def markdown(results: dict) -> str:
    lines = ["# Pose and OBB fine-tunes from yolov5n.pt", "",
             f"CPU `{results['cpu']}`, {results['threads']} threads (shared with other jobs); "
             "`python benchmarks/bench_pose_obb.py`.", "",
             "| task | command | metric | after epoch 1 | last epoch (epochs run) | best epoch | wall |",
             "|---|---|---|---|---|---|---|"]
    for task, run in results["runs"].items():
        for i, name in enumerate(run["first_epoch"]):
            head = (f"| {task} | `{run['command']}` |" if i == 0 else "| | |")
            wall = f"{run['seconds'] / 60:.1f} min" if i == 0 else ""
            lines.append(f"{head} {name} | {run['first_epoch'][name]:.3f} | {run['last_epoch'][name]:.3f} "
                         f"({len(run['curve'][name])}) | {run['best'][name]:.3f} | {wall} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(RUNS), help="run one task, keeping the other's recorded results")
    parser.add_argument("--smoke", action="store_true", help="1 epoch at 128 px each; nothing written")
    parser.add_argument("--project", help="folder for the runs (kept); a temporary one by default")
    args = parser.parse_args()
    tasks = [args.only] if args.only else list(RUNS)
    missing = [str(p) for p in [YOLOV5N, *(RUNS[t]["data"] for t in tasks)] if not p.is_file()]
    if missing:
        raise SystemExit(f"needs {', '.join(missing)}")
    out = RESULTS.with_suffix(".json")
    with tempfile.TemporaryDirectory() as folder:
        for task in tasks:
            run = fine_tune(task, args.project or folder, args.smoke)
            print(f"{task}: " + "  ".join(f"{name} {run['first_epoch'][name]:.3f} -> {run['last_epoch'][name]:.3f}"
                                          for name in run["first_epoch"]) + f"  ({run['seconds']:.0f} s)")
            if not args.smoke:  # read again: a run of the other task may have written its results meanwhile
                results = json.loads(out.read_text()) if out.is_file() else {"runs": {}}
                results.update(cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads())
                results["runs"][task] = run
                out.write_text(json.dumps(results, indent=2) + "\n")
                RESULTS.with_suffix(".md").write_text(markdown(results))
    if not args.smoke:
        print(f"written {out} and {RESULTS.with_suffix('.md')}")


if __name__ == "__main__":
    main()
