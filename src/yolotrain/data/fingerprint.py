"""What a checkpoint records of the data it was trained on, so that a resumed run can tell it is the same.

The record (the ``dataset`` field of a checkpoint's JSON) holds the dataset's absolute location (its
YAML or folder; ``None`` for the built-in shapes dataset, which is generated again wherever it is
missing), its class names, the number of verified images of each split, and a SHA-256 of the label
index: every verified image's path relative to the dataset's folder, its size and its verified label
rows, in file order. The rows are the ones training reads (from the label cache, which is keyed by each
file's version), so the hash costs no file reads, stays the same when the dataset is copied or moved
elsewhere, and changes with any label that training would see differently.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .verify import DataWarning, LabelIndex

# How many differing class names a change message shows, and how much of each.
SHOWN_NAMES = 3
SHOWN_NAME_CHARS = 40
SPLITS = ("train", "val")


class ResumeDataWarning(DataWarning):
    """A resumed run's data could not be checked against its checkpoint (an older one without a record),
    or changed and the change was accepted."""


def dataset_location(spec: str | os.PathLike) -> Path:
    """The absolute path of a dataset YAML or folder as the working folder resolves it now (links kept, so
    a YAML's relative ``path`` keeps meaning what it meant)."""
    return Path(spec).expanduser().absolute()


def labels_digest(folder: Path, splits: Mapping[str, LabelIndex]) -> str:
    """SHA-256 over each split's images (relative to ``folder``), their sizes and verified label rows."""
    digest = hashlib.sha256()
    for split, index in sorted(splits.items()):
        digest.update(f"split {split} {len(index.files)}\n".encode())
        for file, rows, shape in zip(index.files, index.labels, index.shapes):
            digest.update(f"{os.path.relpath(file, folder)}\0{int(shape[0])}x{int(shape[1])}\0".encode())
            digest.update(rows.astype("<f4").tobytes())
    return digest.hexdigest()


def dataset_record(spec: str | os.PathLike, names: Sequence[str], splits: Mapping[str, LabelIndex],
                   generated: bool = False) -> dict[str, Any]:
    """The ``dataset`` record of a checkpoint for the data at ``spec`` (``generated``: the shapes dataset)."""
    location = dataset_location(spec)
    folder = location if location.is_dir() else location.parent
    return {"path": None if generated else str(location), "names": list(names),
            "images": {split: len(index.files) for split, index in sorted(splits.items())},
            "labels_sha256": labels_digest(folder, splits)}


def record_problem(record: Any) -> str | None:
    """Why a checkpoint's ``dataset`` field is not a record (None when it is one)."""
    if not isinstance(record, dict):
        return "must be a mapping"
    if not (record.get("path") is None or isinstance(record.get("path"), str)):
        return "'path' must be a path or null"
    names = record.get("names")
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        return "'names' must be a list of class names"
    images = record.get("images")
    if not (isinstance(images, dict) and set(images) <= set(SPLITS)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in images.values())):
        return "'images' must map train and val to image counts"
    digest = record.get("labels_sha256")
    if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
        return "'labels_sha256' must be a SHA-256 digest"
    return None


def _names_change(before: list[str], after: list[str]) -> str | None:
    if before == after:
        return None
    if len(before) != len(after):
        return f"{len(before)} classes -> {len(after)}"
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    shown = ", ".join(f"{i}: {before[i][:SHOWN_NAME_CHARS]!r} -> {after[i][:SHOWN_NAME_CHARS]!r}"
                      for i in changed[:SHOWN_NAMES])
    more = f" and {len(changed) - SHOWN_NAMES} more" if len(changed) > SHOWN_NAMES else ""
    return f"class names {shown}{more}"


def dataset_changes(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs between a checkpoint's record and the data's record now, each as a short phrase."""
    changes = []
    names = _names_change(recorded["names"], current["names"])
    if names:
        changes.append(names)
    counts = [f"{split} images {recorded['images'].get(split)} -> {current['images'].get(split)}"
              for split in sorted(set(recorded["images"]) | set(current["images"]))
              if recorded["images"].get(split) != current["images"].get(split)]
    changes += counts
    if recorded["labels_sha256"] != current["labels_sha256"] and not counts:
        changes.append("image files or labels differ")
    return changes
