"""Where a training sample's CPU time goes: per-stage process CPU milliseconds per sample of the
yolotrain train loader and of the reference's ``LoadImagesAndLabels`` (mosaic on, scratch-low
augmentations, coco128, workers 0), at 640 and 320 px, written as a Markdown table.

Each stage is the *exclusive* CPU time of the functions that make it (a function wrapped for one stage
and called from another is charged to its own), measured with ``time.process_time`` so other processes
on a shared machine do not inflate it; what no stage claims (Python glue of ``__getitem__``, the
sampler) is "other". OpenCV runs single-threaded (the reference sets that on import), so process CPU
time is one core's time. File reading is timed apart (``Path.read_bytes`` of the same files, from the
page cache), as ``cv2.imread`` reads and decodes in one call.

Usage: python benchmarks/profile_loader.py [--data DIR] [--samples N] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import shutil
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
from common import COCO128, copy_images, cpu_model, reference_env

STAGES = ("file read", "JPEG decode", "resize", "mosaic canvas", "warp", "boxes/labels", "HSV", "flips",
          "HWC->CHW, float, collate", "other")


class StageClock:
    """Exclusive process CPU time per stage of wrapped functions (a stack: nested calls pause their caller)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._stack = ["other"]
        self._mark = time.process_time()

    def _switch(self, stage: str | None) -> None:
        now = time.process_time()
        self.seconds[self._stack[-1]] += now - self._mark
        self._mark = now
        if stage is None:
            self._stack.pop()
        else:
            self._stack.append(stage)

    def wrap(self, owner: object, name: str, stage: str, restore: list) -> None:
        """Replace ``owner.name`` by a timed version charged to ``stage`` (undone from ``restore``)."""
        original = getattr(owner, name)
        restore.append((owner, name, owner.__dict__[name] if isinstance(owner, type) else original))

        @functools.wraps(original)
        def timed(*args, **kwargs):
            self._switch(stage)
            try:
                return original(*args, **kwargs)
            finally:
                self._switch(None)

        setattr(owner, name, staticmethod(timed) if isinstance(owner, type) and _is_static(owner, name) else timed)

    def reset(self) -> None:
        self.seconds.clear()
        self._mark = time.process_time()

    def stop(self) -> dict[str, float]:
        self._switch("other")
        self._stack.pop()
        return dict(self.seconds)


def _is_static(cls: type, name: str) -> bool:
    return isinstance(cls.__dict__.get(name), staticmethod)


def _trainer_float(imgs):
    """What the reference's trainer does to each uint8 batch before the model (its ``train.py``)."""
    return imgs.float() / 255


def _file_read_ms(files: list[Path], reads_per_sample: float) -> float:
    """CPU ms per sample of reading the image files (page cache), ``reads_per_sample`` files each."""
    start = time.process_time()
    for f in files:
        f.read_bytes()
    return (time.process_time() - start) / len(files) * reads_per_sample * 1e3


def _run(clock: StageClock, sample: Callable[[int], object], collate: Callable[[list], object], n: int,
         batch: int) -> tuple[dict[str, float], float]:
    """Per-stage CPU ms per sample over ``n`` samples collated in batches, and the total."""
    collate([sample(i) for i in range(batch)])  # warm-up: imports, first allocations
    clock.reset()
    start = time.process_time()
    for b in range(0, n, batch):
        collate([sample(i) for i in range(b, min(n, b + batch))])
    total = time.process_time() - start
    seconds = clock.stop()
    return {k: v / n * 1e3 for k, v in seconds.items()}, total / n * 1e3


def profile(images: Path, size: int, n: int, batch: int) -> dict[str, dict[str, float]]:
    import cv2
    import torch
    import yaml
    from yolov5.utils import dataloaders as ref_dl

    from yolotrain.data import augment as A
    from yolotrain.data.augment import AugmentConfig
    from yolotrain.data.dataset import BatchBuffers, DetectionDataset
    from yolotrain.data.sources import list_images
    from yolotrain.data.verify import verify_split

    hyp = yaml.safe_load((Path(ref_dl.__file__).parents[1] / "data" / "hyps" / "hyp.scratch-low.yaml").read_text())
    files = list_images(images)
    rows: dict[str, dict[str, float]] = {}

    restore: list = []
    clock = StageClock()
    common = [(cv2, "imread", "JPEG decode"), (cv2, "imdecode", "JPEG decode"), (cv2, "resize", "resize"),
              (cv2, "warpAffine", "warp"), (cv2, "warpPerspective", "warp")]
    try:
        for owner, name, stage in common:
            clock.wrap(owner, name, stage, restore)
        ours = [(A, "mosaic_warp", "mosaic canvas"), (A, "warp_boxes", "boxes/labels"),
                (A, "random_warp_matrix", "boxes/labels"), (A, "random_perspective", "boxes/labels"),
                (A, "xyxy_to_xywhn", "boxes/labels"), (A, "xywhn_to_xyxy", "boxes/labels"),
                (A, "hsv_to_rgb", "HSV"), (A, "random_flips", "flips"),
                (DetectionDataset, "collate", "HWC->CHW, float, collate"), (DetectionDataset, "load_image", "other")]
        for owner, name, stage in ours:
            clock.wrap(owner, name, stage, restore)
        ds = DetectionDataset(verify_split(files, 80), size, batch, augment=True, hyp=AugmentConfig(), cache_mb=0)
        count = len(ds)
        collate = functools.partial(DetectionDataset.collate, buffers=BatchBuffers())  # as the loader does
        rows["yolotrain"], total = _run(clock, lambda i: ds[(i % count, i // count, True)], collate, n, batch)
        rows["yolotrain"]["total"] = total


        clock = StageClock()
        for owner, name, stage in common:
            clock.wrap(owner, name, stage, restore)
        ref = [(ref_dl, "random_perspective", "boxes/labels"), (ref_dl, "xyxy2xywhn", "boxes/labels"),
               (ref_dl, "xywhn2xyxy", "boxes/labels"), (ref_dl, "augment_hsv", "HSV"),
               (np, "flipud", "flips"), (np, "fliplr", "flips"),
               (np, "ascontiguousarray", "HWC->CHW, float, collate"),
               (ref_dl.LoadImagesAndLabels, "load_mosaic", "mosaic canvas"),
               (ref_dl.LoadImagesAndLabels, "load_image", "other"),
               (ref_dl.LoadImagesAndLabels, "collate_fn", "HWC->CHW, float, collate")]
        for owner, name, stage in ref:
            clock.wrap(owner, name, stage, restore)
        random.seed(0), np.random.seed(0), torch.manual_seed(0)
        ref_ds = ref_dl.LoadImagesAndLabels(str(images), size, batch, augment=True, hyp=hyp)
        clock.wrap(sys.modules[__name__], "_trainer_float", "float 0..1 in its trainer", restore)

        def collate_and_scale(items: list) -> None:
            _trainer_float(ref_dl.LoadImagesAndLabels.collate_fn(items)[0])

        rows["reference"], total = _run(clock, lambda i: ref_ds[i % len(ref_ds)], collate_and_scale, n, batch)
        rows["reference"]["total"] = total - rows["reference"].get("float 0..1 in its trainer", 0.0)
    finally:
        for owner, name, original in reversed(restore):
            setattr(owner, name, original)
    reads = _file_read_ms(files[:n], 4)
    for row in rows.values():  # imread reads and decodes: split off the read measured apart
        row["file read"] = reads
        row["JPEG decode"] = row.get("JPEG decode", 0.0) - reads
    return rows


def table(results: dict[int, dict[str, dict[str, float]]], samples: int) -> str:
    columns = [(size, who) for size in results for who in results[size]]
    lines = ["| stage | " + " | ".join(f"{who} {size}" for size, who in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for stage in (*STAGES, "total"):
        cells = [f"{results[size][who].get(stage, 0.0):.2f}" for size, who in columns]
        lines.append(f"| {'**total**' if stage == 'total' else stage} | " + " | ".join(cells) + " |")
    extra = "float 0..1 in its trainer"
    lines.append(f"| (not in total) {extra} | " + " | ".join(
        f"{results[size][who].get(extra, 0.0):.2f}" if who == "reference" else "in collate" for size, who in columns)
        + " |")
    lines.append("| reference total / this total (per core) | " + " | ".join(
        f"{results[size]['reference']['total'] / results[size][who]['total']:.2f}x" for size, who in columns) + " |")
    return "\n".join(lines) + (f"\n\nCPU ms per sample, mean over {samples} samples, workers 0 (one core), batches "
                               "of 16 collated.\n")


def ceilings(results: dict[int, dict[str, dict[str, float]]]) -> str:
    """What the decoding alone allows: the reference's total over ours were every other stage free."""
    lines = []
    for size, rows in results.items():
        ours, ref = rows["yolotrain"], rows["reference"]
        floor = ours["file read"] + ours["JPEG decode"]
        lines.append(f"- {size} px: reading and decoding take {floor:.2f} of our {ours['total']:.2f} ms per sample "
                     f"({floor / ours['total']:.0%}); with every other stage free we would reach "
                     f"{ref['total'] / floor:.2f}x the reference per core (it spends {ref['total']:.2f} ms, "
                     f"{ref['file read'] + ref['JPEG decode']:.2f} of them reading and decoding).")
    return "\n".join(lines) + "\n"


EXPLANATION = """
## What bounds the ratio without caches

A mosaic sample needs four images, and coco128's are 640 px JPEGs (about 640 x 480). Decoding one
costs about 2 ms of CPU with libjpeg-turbo on this machine, the same through OpenCV, torchvision and
Pillow: they share the library. Decoding at reduced scale (DCT scaling, used at 320 px) saves little,
because entropy (Huffman) decoding, which DCT scaling does not shrink, is most of the work at these
sizes. So both loaders spend about as much on decoding, and the ceilings above bound any ratio per
core: a loader doing nothing but reading and decoding its four images per sample reaches only those.

What this loader does about it: it draws the whole mosaic geometry (centre, scale, shift) before
touching pixels, and decodes only the tiles the warped output shows (about 10% of tiles are never
seen), builds only the part of the mosaic canvas the warp reads (a third of it on average, in a
reused buffer), applies the HSV gains in one LUT pass, and reuses (or, with CUDA, pins) batch memory
in the main process; its loader workers send uint8 images, turned to float32 in the main process.
It also does work the reference leaves to its trainer: float32 0..1 batches (the row "float 0..1 in
its trainer" is that cost on the reference's side, not counted in its total).

The levers left are beyond a CPU JPEG decoder: decoding fewer pixels (libjpeg-turbo 3's partial
decoding skips the inverse DCT outside a window but still entropy-decodes the rows before it), GPU
decoding (nvJPEG; see the GPU augmentation path), a cache of decoded images (`--cache ram|disk`, and the
default 512 MiB budget, which holds all of coco128), or uint8 batches converted on the device.
"""


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(COCO128))
    p.add_argument("--images", type=int, default=None, help="the first N images only (default: all)")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--sizes", type=int, nargs="+", default=[640, 320])
    p.add_argument("--out", default=None, help="write the table here (Markdown); default: print only")
    a = p.parse_args(argv)
    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="profile-loader-"))
    try:
        os.environ.update(reference_env(tmp / "config"))
        os.environ["YOLOTRAIN_CACHE"] = str(tmp / "cache")
        images = copy_images(a.data, tmp / "coco128", a.images)
        warnings.simplefilter("ignore")
        results = {size: profile(images, size, a.samples, a.batch_size) for size in a.sizes}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = ("# Loader profile: where a training sample's CPU time goes\n\n"
            "Made by `python benchmarks/profile_loader.py --out benchmarks/results/loader_profile.md` "
            f"(CPU: {cpu_model()}, {os.cpu_count()} cores, load average {load_before:.1f} before and "
            f"{os.getloadavg()[0]:.1f} after; Python {sys.version.split()[0]}; coco128, mosaic on, scratch-low). "
            "CPU time, not wall time, but a busy machine still slows every stage (shared caches and memory).\n\n"
            + table(results, a.samples) + "\n" + ceilings(results) + EXPLANATION)
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    return text


if __name__ == "__main__":
    main()
