"""Rotated NMS at validation's thresholds: ours against ultralytics 8's ``non_max_suppression(rotated=True)`` on
the same candidates, and ours computing the ProbIoU of every pair of the same class (before it left far pairs out).

The candidates are an aerial image's at confidence 0.001: ``objects`` rotated boxes of 15 classes, 8 to 80 px,
on a 1024 px image, each proposed ``proposals`` times with jittered centre, sides and angle, with a score for
every class (the true one high, the others about the threshold), ``multi_label`` as validation runs it.

    python benchmarks/bench_rotated_nms.py              # 100 objects x 30 proposals: 3,000 boxes, ~6,800 candidates
    python benchmarks/bench_rotated_nms.py --no-save --objects 20

Prints the median seconds per image of each and checks that all three keep the same boxes; writes
``results/rotated_nms.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
from pathlib import Path

import torch
from common import latency

from yolotrain import nms as nms_module

RESULTS = Path(__file__).resolve().parent / "results" / "rotated_nms.json"
CLASSES = 15
OPTIONS = dict(conf=0.001, iou=0.7, multi_label=True, max_det=300)


def candidates(objects: int, proposals: int, seed: int = 0) -> torch.Tensor:
    """``[1, objects * proposals, 5 + CLASSES + 1]`` decoded rotated predictions (objectness 1)."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.rand(objects, 2, generator=generator) * 1024
    sides = 8 + torch.rand(objects, 2, generator=generator) * 72
    angles = torch.rand(objects, 1, generator=generator) * math.pi - math.pi / 4
    classes = torch.randint(CLASSES, (objects,), generator=generator)
    n = objects * proposals
    jitter = torch.randn(n, 5, generator=generator) * torch.tensor([0.15, 0.15, 0.15, 0.15, 0.1])
    truth = torch.cat((centres, sides, angles), 1).repeat_interleave(proposals, 0)
    boxes = torch.cat((truth[:, :2] + jitter[:, :2] * truth[:, 2:4], truth[:, 2:4] * jitter[:, 2:4].exp(),
                       truth[:, 4:] + jitter[:, 4:]), 1)
    scores = torch.rand(n, CLASSES, generator=generator) * 0.0011  # a tenth of the other classes above conf
    true_class = classes.repeat_interleave(proposals)
    scores[torch.arange(n), true_class] = 0.3 + 0.7 * torch.rand(n, generator=generator)
    return torch.cat((boxes[:, :4], torch.ones(n, 1), scores, boxes[:, 4:]), 1)[None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=100)
    parser.add_argument("--proposals", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as config_dir:
        os.environ.update(YOLO_OFFLINE="1", YOLO_CONFIG_DIR=config_dir, ULTRALYTICS_CONFIG_DIR=config_dir)
        from ultralytics.utils.nms import non_max_suppression as their_nms

        prediction = candidates(args.objects, args.proposals)
        their_layout = torch.cat((prediction[..., :4], prediction[..., 5:]), 2).transpose(1, 2)
        conf, iou = OPTIONS["conf"], OPTIONS["iou"]

        def ours():
            return nms_module.rotated_non_max_suppression(prediction, **OPTIONS)[0]

        def theirs():
            return their_nms(their_layout, conf, iou, multi_label=True, max_det=300, nc=CLASSES, rotated=True)[0]

        reach = nms_module._probiou_reach

        def every_pair():
            nms_module._probiou_reach = lambda iou: math.inf
            try:
                return ours()
            finally:
                nms_module._probiou_reach = reach

        kept = ours()
        same = bool(torch.equal(kept, theirs()) and torch.equal(kept, every_pair()))
        candidates_in = int((prediction[0, :, 5:-1] > conf).sum())
        seconds = {name: latency(fn, args.repeats) for name, fn in
                   (("ours", ours), ("ours_every_pair", every_pair), ("ultralytics", theirs))}
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
        "command": f"python benchmarks/bench_rotated_nms.py --objects {args.objects} --proposals {args.proposals}",
        "candidates": candidates_in, "kept": len(kept), "same_boxes": same,
        "seconds_per_image": {name: round(value, 4) for name, value in seconds.items()},
        "speedup_vs_ultralytics": round(seconds["ultralytics"] / seconds["ours"], 1),
        "speedup_vs_every_pair": round(seconds["ours_every_pair"] / seconds["ours"], 1),
    }
    print(json.dumps(result, indent=2))
    if not same:
        raise SystemExit("the three NMS runs kept different boxes")
    if not args.no_save:
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
