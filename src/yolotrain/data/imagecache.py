"""``cache: disk``: every image decoded once and kept as a ``.npy`` array, read back without decoding.

The array goes beside its image (``IMAGE.npy``, as the reference does); when the image folder is
read-only it goes under the user cache folder instead (``<cache>/images/<folder digest>/``), with
one warning naming both folders. An array older than its image is rewritten.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
from tqdm import tqdm

from ..atomic import write_atomic
from .cachedir import cache_root
from .verify import DataWarning, _writable


def _fallback_folder(folder: Path) -> Path:
    digest = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
    return cache_root() / "images" / digest


def _is_current(array: Path, image: Path) -> bool:
    return array.is_file() and array.stat().st_mtime >= image.stat().st_mtime


def _write(array: Path, image: Path) -> None:
    im = cv2.imread(str(image), cv2.IMREAD_COLOR)
    if im is None:
        raise OSError(f"cannot read image {image}")

    def save(temp: Path) -> None:
        with temp.open("wb") as out:  # np.save on a path would append its own suffix
            np.save(out, im)

    write_atomic(array, save, durable=False)


def disk_cache(files: Sequence[Path]) -> list[Path]:
    """The ``.npy`` array of each image in ``files``, written first where missing or stale."""
    arrays: list[Path] = []
    fallbacks: dict[Path, Path] = {}
    missing = [f for f in files if not (_is_current(f.with_suffix(".npy"), f)
                                        or _is_current(_fallback_folder(f.parent) / (f.stem + ".npy"), f))]
    with tqdm(total=len(missing), desc="Caching decoded images to disk", disable=not missing, leave=False) as bar:
        for image in files:
            beside = image.with_suffix(".npy")
            elsewhere = _fallback_folder(image.parent) / (image.stem + ".npy")
            if _is_current(beside, image):
                arrays.append(beside)
                continue
            if _is_current(elsewhere, image):
                arrays.append(elsewhere)
                continue
            target = beside if image.parent not in fallbacks and _writable(image.parent) else elsewhere
            try:
                _write(target, image)
            except PermissionError:
                target = elsewhere
                _write(target, image)
            if target == elsewhere and image.parent not in fallbacks:
                fallbacks[image.parent] = elsewhere.parent
            arrays.append(target)
            bar.update()
    for folder, used in fallbacks.items():
        warnings.warn(f"{folder} is read-only: decoded images are cached under {used} instead", DataWarning,
                      stacklevel=2)
    return arrays
