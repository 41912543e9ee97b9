"""What the benchmarks share: where the shared data lies, a latency timer, and the settings that run
the reference implementation offline."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
COCO128 = SHARED / "datasets" / "coco128"
WEIGHTS_DIR = SHARED / "weights"
YOLOV5N = WEIGHTS_DIR / "yolov5n.pt"


def latency(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``fn()`` after two warm-up calls."""
    fn(), fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def reference_env(config_dir: str | os.PathLike) -> dict[str, str]:
    """Environment variables that keep the reference offline, writing its settings into ``config_dir``
    and loading its pickled checkpoints."""
    config_dir = str(config_dir)
    return {"YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": config_dir, "YOLOV5_CONFIG_DIR": config_dir,
            "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}


def alias_numpy_trapz() -> None:
    """The reference calls ``np.trapz``, which numpy 2 renamed ``np.trapezoid``."""
    np.trapz = getattr(np, "trapz", np.trapezoid)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def copy_images(data: str | os.PathLike, root: Path, n: int | None = None, split: str = "train2017") -> Path:
    """The first ``n`` images (all: ``None``) of a YOLO dataset's split, copied with their labels under
    ``root`` (so no tool writes caches into the shared folder); returns the image folder."""
    import shutil

    images, labels = root / "images" / split, root / "labels" / split
    images.mkdir(parents=True), labels.mkdir(parents=True)
    for image in sorted((Path(data) / "images" / split).iterdir())[:n]:
        shutil.copy(image, images / image.name)
        label = Path(data) / "labels" / split / f"{image.stem}.txt"
        if label.is_file():
            shutil.copy(label, labels / label.name)
    return images
