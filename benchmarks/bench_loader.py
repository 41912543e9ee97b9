"""Loader throughput (images/s, mosaic on) of yolotrain.data against the reference's
``yolov5.utils.dataloaders.LoadImagesAndLabels`` on coco128, at 640 and 320 px, workers 0 and 2.

Both loaders read the same copy of coco128 (a temporary folder, so neither writes its label cache
into the shared dataset) and use the scratch-low augmentations. Each setting runs one warm-up
epoch (workers start, caches fill) and then times ``--epochs`` epochs. yolotrain's batches are
already float32 0..1; the reference's are uint8, so its number excludes the conversion a trainer
still has to do. yolotrain is timed with and without its in-memory image cache.

Usage: python benchmarks/bench_loader.py [--data DIR] [--epochs N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

from common import COCO128, ROOT, reference_env


def _time_epochs(loader, epochs: int, set_epoch=None) -> float:
    """Images per second over ``epochs`` epochs after one warm-up epoch."""
    for e in range(epochs + 1):
        if e == 1:
            start, n = time.perf_counter(), 0
        if set_epoch:
            set_epoch(e)
        for batch in loader:
            if e >= 1:
                n += len(batch[0])
    return n / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(COCO128))
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "loader.json"))
    a = p.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="bench-loader-"))
    try:
        os.environ.update(reference_env(tmp / "config"))
        os.environ["YOLOTRAIN_CACHE"] = str(tmp / "cache")
        data = tmp / "coco128"
        shutil.copytree(Path(a.data) / "images", data / "images")
        shutil.copytree(Path(a.data) / "labels", data / "labels")
        images = data / "images" / "train2017"

        warnings.simplefilter("ignore")
        import torch
        import yaml
        from torch.utils.data import DataLoader
        from yolov5.utils.dataloaders import InfiniteDataLoader, LoadImagesAndLabels, seed_worker

        from yolotrain.data.augment import AugmentConfig
        from yolotrain.data.dataset import DetectionDataset
        from yolotrain.data.loaders import make_loader
        from yolotrain.data.sources import list_images
        from yolotrain.data.verify import verify_split

        hyp_path = Path(sys.modules["yolov5"].__file__).parent / "data" / "hyps" / "hyp.scratch-low.yaml"
        ref_hyp = yaml.safe_load(hyp_path.read_text())
        index = verify_split(list_images(images), 80)

        results = []
        for size in (640, 320):
            for workers in (0, 2):
                ref_ds = LoadImagesAndLabels(str(images), size, a.batch_size, augment=True, hyp=ref_hyp,
                                             workers=workers)
                ref_loader = (InfiniteDataLoader if workers else DataLoader)(
                    ref_ds, batch_size=a.batch_size, shuffle=True, num_workers=workers,
                    collate_fn=LoadImagesAndLabels.collate_fn, worker_init_fn=seed_worker)
                ref = _time_epochs(ref_loader, a.epochs)
                row = {"img_size": size, "workers": workers, "reference_img_s": round(ref, 1)}
                for label, cache_mb in (("yolotrain_img_s", 512), ("yolotrain_nocache_img_s", 0)):
                    ds = DetectionDataset(index, size, a.batch_size, augment=True, hyp=AugmentConfig(),
                                          cache_mb=cache_mb)
                    ours = _time_epochs(make_loader(ds, a.batch_size, True, workers), a.epochs, ds.set_epoch)
                    row[label] = round(ours, 1)
                    row[label.replace("_img_s", "_ratio")] = round(ours / ref, 2)
                print(json.dumps(row), flush=True)
                results.append(row)
                del ref_loader
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    report = {
        "what": "train loader throughput, mosaic on, scratch-low augmentations, coco128 (128 images)",
        "epochs_timed": a.epochs,
        "batch_size": a.batch_size,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "results": results,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
