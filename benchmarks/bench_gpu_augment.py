"""Training images/s of the tensor augmentation path (``--augment-device``) on a device, against the loader's
own augmentation, on coco128 with the scratch-low augmentations (mosaic on).

Rows:

- ``loader``: the training loader as it is by default (OpenCV in ``--workers`` processes, no image cache);
- ``tensor augment``: :class:`yolotrain.data.gpu_augment.DeviceAugmenter` alone on ``--device`` (decode,
  mosaic, warp, HSV, flips, boxes) over batches the loader processes already read: what the device side
  costs;
- ``tensor path``: the whole ``--augment-device`` loader, its processes reading file bytes and the device
  building the batches.

Each row runs one warm-up epoch, then times ``--epochs`` epochs. ``benchmarks/gpu_check.py`` runs it on
CUDA; on the CPU it is a smoke check of the path's speed (the tensor path is meant for GPUs).

Usage: python benchmarks/bench_gpu_augment.py [--device cpu|cuda] [--img 640] [--smoke] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import COCO128, ROOT
from torch.utils.data import DataLoader

from yolotrain.data.augment import AugmentConfig
from yolotrain.data.loaders import DataConfig, build_loaders
from yolotrain.data.sources import link_subset


def cpu_model() -> str:
    """The processor's name as Linux reports it."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.is_file() else []
    return names[0] if names else "unknown"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def images_per_second(batches, epochs: int, device: torch.device, set_epoch=None) -> float:
    """Images per second over ``epochs`` passes after one warm-up pass; ``batches()`` gives one pass."""
    for epoch in range(epochs + 1):
        if epoch == 1:
            synchronize(device)
            started, images = time.perf_counter(), 0
        if set_epoch:
            set_epoch(epoch)
        for imgs, _ in batches():
            if epoch >= 1:
                images += len(imgs)
    synchronize(device)
    return images / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(COCO128))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--img", type=int, default=640)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="32 images at 160 px, one timed epoch")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_augment.json"))
    args = parser.parse_args(argv)
    if args.smoke:
        args.img, args.epochs = 160, 1
    device = torch.device(args.device)

    folder = Path(tempfile.mkdtemp(prefix="bench-gpu-augment-"))
    try:
        os.environ["YOLOTRAIN_CACHE"] = str(folder / "cache")
        images = 32 if args.smoke else 128
        data = link_subset(Path(args.data) / "data.yaml", folder / "coco128", images)
        def loader(augment_device: str):
            config = DataConfig(path=str(data), img_size=args.img, batch_size=args.batch_size,
                                workers=args.workers, cache_mb=0, augment_device=augment_device)
            return build_loaders(config, AugmentConfig(), splits=("train",)).train

        rows = {}
        plain = loader("loader")
        rows["loader"] = images_per_second(lambda: plain, args.epochs, torch.device("cpu"),
                                           plain.batch_sampler.set_epoch)
        tensors = loader(args.device)
        reader = DataLoader(tensors.dataset, batch_sampler=tensors.batch_sampler, num_workers=args.workers,
                            collate_fn=tensors.collate_fn)
        encoded = list(reader)  # the processes' batches (file bytes and draws), read once
        rows["tensor augment"] = images_per_second(lambda: map(tensors.augmenter, encoded), args.epochs, device)
        rows["tensor path"] = images_per_second(lambda: tensors, args.epochs, device, tensors.batch_sampler.set_epoch)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    report = {
        "what": "training images/s, scratch-low augmentations (mosaic on), no image cache",
        "img_size": args.img, "batch_size": args.batch_size, "workers": args.workers, "images": images,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "cpu": cpu_model(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "images_per_s": {name: round(value, 1) for name, value in rows.items()},
    }
    if not args.smoke:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
