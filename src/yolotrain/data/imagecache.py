"""``cache: disk``: every image decoded once and kept as a ``.npy`` array, read back without decoding.

The array goes beside its image; when the image folder is read-only it goes under the user cache
folder instead (``<cache>/images/<folder digest>/``), with one warning naming both folders. Its name
is the image's whole file name and a key of the image's version (:func:`.cachedir.file_signature`:
size, modification and change times, inode): ``a.jpg.<key>.npy``. So ``a.jpg`` and ``a.png`` have
arrays of their own, and an image replaced or edited in place, even within the same second, is
decoded again instead of served stale; the array of its previous version is removed then.
"""

from __future__ import annotations

import glob
import hashlib
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
from tqdm import tqdm

from ..atomic import write_atomic
from .cachedir import cache_root, file_signature
from .verify import DataWarning, _writable

# Bump when the arrays' content changes (colour order, size), so older arrays are not read.
ARRAY_VERSION = 1
KEY_LENGTH = 16


def _fallback_folder(folder: Path) -> Path:
    digest = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
    return cache_root() / "images" / digest


def array_name(image: Path) -> str:
    """``IMAGE.<key>.npy``: the array of this version of ``image`` (``OSError`` when it cannot be looked at)."""
    key = hashlib.sha256(f"v{ARRAY_VERSION}\0{file_signature(image)}".encode()).hexdigest()[:KEY_LENGTH]
    return f"{image.name}.{key}.npy"


def _write(array: Path, image: Path) -> None:
    im = cv2.imread(str(image), cv2.IMREAD_COLOR)
    if im is None:
        raise OSError(f"cannot read image {image}")

    def save(temp: Path) -> None:
        with temp.open("wb") as out:  # np.save on a path would append its own suffix
            np.save(out, im)

    write_atomic(array, save, durable=False)
    _remove_older_versions(array, image)


def _remove_older_versions(array: Path, image: Path) -> None:
    """Arrays of earlier versions of ``image`` beside ``array`` (never those of other images)."""
    older = re.compile(re.escape(image.name) + rf"\.[0-9a-f]{{{KEY_LENGTH}}}\.npy")
    for other in array.parent.glob(f"{glob.escape(image.name)}.*.npy"):
        if other != array and older.fullmatch(other.name):
            other.unlink(missing_ok=True)


def disk_cache(files: Sequence[Path]) -> list[Path]:
    """The ``.npy`` array of each image in ``files``, written first where missing or stale."""
    names = [array_name(f) for f in files]
    beside = [f.with_name(name) for f, name in zip(files, names)]
    elsewhere = [_fallback_folder(f.parent) / name for f, name in zip(files, names)]
    arrays: list[Path] = []
    fallbacks: dict[Path, Path] = {}
    missing = sum(not (a.is_file() or b.is_file()) for a, b in zip(beside, elsewhere))
    with tqdm(total=missing, desc="Caching decoded images to disk", disable=not missing, leave=False) as bar:
        for image, here, there in zip(files, beside, elsewhere):
            current = next((a for a in (here, there) if a.is_file()), None)
            if current is not None:
                arrays.append(current)
                continue
            target = here if image.parent not in fallbacks and _writable(image.parent) else there
            try:
                _write(target, image)
            except PermissionError:
                target = there
                _write(target, image)
            if target == there and image.parent not in fallbacks:
                fallbacks[image.parent] = there.parent
            arrays.append(target)
            bar.update()
    for folder, used in fallbacks.items():
        warnings.warn(f"{folder} is read-only: decoded images are cached under {used} instead", DataWarning,
                      stacklevel=2)
    return arrays
