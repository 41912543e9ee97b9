"""Loader throughput (images/s, mosaic on) of yolotrain.data against the reference's
``yolov5.utils.dataloaders.LoadImagesAndLabels`` on coco128, at 640 and 320 px, workers 0 and 2, with
and without caches of decoded images.

Both loaders read the same copy of coco128 (a temporary folder, so neither writes its label cache
into the shared dataset) and use the scratch-low augmentations. Each setting runs one warm-up
epoch (workers start, caches fill) and then times ``--epochs`` epochs. yolotrain's batches are
already float32 0..1; the reference's are uint8, so its number excludes the conversion a trainer
still has to do. Caches: ``none`` decodes every image every time (yolotrain ``cache_mb=0``);
``ram`` keeps all decoded images (yolotrain ``cache="ram"``, the reference ``cache_images="ram"``);
``budget`` is yolotrain's default (a 512 MiB per-process store of decoded images, all of coco128).

Each row reports images/s on the wall clock (``img_s``, all the cores the loader used) and per core
(``img_per_core_s``): images per CPU-second, the timed epochs' CPU time of the main process plus its
loader workers (``/proc/<pid>/stat``). On an idle machine that is ``img_s / cores_used`` (``cores_used``:
CPU seconds over wall seconds; OpenCV runs single-threaded as the reference sets it); on a busy one it
still counts only the loader's own work. With workers 0 ours builds a batch's samples on threads of the process
as training does (``data.sample_threads``), the reference on one. Our batches are float32 0..1, the reference's
uint8: it is also timed with the ``imgs.float() / 255`` its ``train.py`` does before the model
(``reference_*_float``, ``ratio_*_vs_float``). Ratios are yolotrain over the reference.

Usage: python benchmarks/bench_loader.py [--data DIR] [--epochs N] [--sizes 640 320] [--workers 0 2] [--out FILE]
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

from common import COCO128, ROOT, copy_images, cpu_model, reference_env


def _worker_pids(loader) -> list[int]:
    """Process ids of a DataLoader's workers: torch's persistent iterator or the reference's infinite one."""
    iterator = getattr(loader, "_iterator", None) or getattr(loader, "iterator", None)
    return [w.pid for w in getattr(iterator, "_workers", [])]


def _cpu_seconds(pids: list[int]) -> float:
    """CPU time (user + system) of this process and the processes ``pids``."""
    tick = os.sysconf("SC_CLK_TCK")
    total = time.process_time()
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def _time_epochs(loader, epochs: int, set_epoch=None, to_float: bool = False) -> dict[str, float]:
    """Images/s, images per CPU-second and cores used over ``epochs`` epochs after one warm-up epoch; ``to_float``:
    each batch made float 0..1 as the reference's ``train.py`` does before the model (``imgs.float() / 255``)."""
    for e in range(epochs + 1):
        if e == 1:
            pids = _worker_pids(loader)
            start, cpu, n = time.perf_counter(), _cpu_seconds(pids), 0
        if set_epoch:
            set_epoch(e)
        for imgs, *_ in loader:  # the reference's (imgs, targets, paths, shapes), ours a Batch of (imgs, targets)
            if to_float:
                imgs = imgs.float() / 255
            if e >= 1:
                n += len(imgs)
    wall, cpu = time.perf_counter() - start, _cpu_seconds(pids) - cpu
    return {"img_s": round(n / wall, 1), "img_per_core_s": round(n / cpu, 1), "cores_used": round(cpu / wall, 2)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(COCO128))
    p.add_argument("--images", type=int, default=None, help="the first N images only (default: all)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--sizes", type=int, nargs="+", default=[640, 320])
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "loader.json"))
    a = p.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="bench-loader-"))
    try:
        os.environ.update(reference_env(tmp / "config"))
        os.environ["YOLOTRAIN_CACHE"] = str(tmp / "cache")
        images = copy_images(a.data, tmp / "coco128", a.images)

        warnings.simplefilter("ignore")
        import torch
        import yaml
        from torch.utils.data import DataLoader
        from yolov5.utils.dataloaders import InfiniteDataLoader, LoadImagesAndLabels, seed_worker

        from yolotrain.data.augment import AugmentConfig
        from yolotrain.data.dataset import DetectionDataset
        from yolotrain.data.loaders import make_loader
        from yolotrain.data.sample_threads import default_sample_threads
        from yolotrain.data.sources import list_images
        from yolotrain.data.verify import verify_split

        hyp_path = Path(sys.modules["yolov5"].__file__).parent / "data" / "hyps" / "hyp.scratch-low.yaml"
        ref_hyp = yaml.safe_load(hyp_path.read_text())
        index = verify_split(list_images(images), 80)

        results = []
        for size in a.sizes:
            for workers in a.workers:
                row = {"img_size": size, "workers": workers}
                for cache in ("none", "ram"):
                    ref_ds = LoadImagesAndLabels(str(images), size, a.batch_size, augment=True, hyp=ref_hyp,
                                                 workers=workers, cache_images=cache == "ram" and "ram")
                    ref_loader = (InfiniteDataLoader if workers else DataLoader)(
                        ref_ds, batch_size=a.batch_size, shuffle=True, num_workers=workers,
                        collate_fn=LoadImagesAndLabels.collate_fn, worker_init_fn=seed_worker)
                    row[f"reference_{cache}"] = _time_epochs(ref_loader, a.epochs)
                    row[f"reference_{cache}_float"] = _time_epochs(ref_loader, a.epochs, to_float=True)
                    del ref_loader
                for cache, settings in (("none", {"cache_mb": 0}), ("ram", {"cache": "ram"}), ("budget", {})):
                    ds = DetectionDataset(index, size, a.batch_size, augment=True, hyp=AugmentConfig(),
                                          threads=default_sample_threads(workers), **settings)
                    loader = make_loader(ds, a.batch_size, True, workers)
                    row[f"yolotrain_{cache}"] = _time_epochs(loader, a.epochs, ds.set_epoch)
                    del loader
                for cache in ("none", "ram"):
                    ours, ref = row[f"yolotrain_{cache}"], row[f"reference_{cache}"]
                    row[f"ratio_{cache}"] = round(ours["img_s"] / ref["img_s"], 2)
                    row[f"ratio_{cache}_per_core"] = round(ours["img_per_core_s"] / ref["img_per_core_s"], 2)
                    row[f"ratio_{cache}_vs_float"] = round(ours["img_s"] / row[f"reference_{cache}_float"]["img_s"], 2)
                print(json.dumps(row), flush=True)
                results.append(row)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    report = {
        "what": f"train loader throughput, mosaic on, scratch-low augmentations, coco128 ({len(index.files)} images), "
                "with and without caches of decoded images",
        "epochs_timed": a.epochs,
        "batch_size": a.batch_size,
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "per_core": "images per CPU-second: images / (user + system CPU time of the main process and its loader "
                    "workers over the timed epochs); with workers 0 ours builds a batch's samples on "
                    f"{default_sample_threads(0)} threads (the default), the reference on one",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "results": results,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
