"""Outputs never overwrite inputs: every command checks the paths it writes against the ones it reads.

An output conflicts with an input when, both resolved (symbolic links followed), they are the same
path, the output lies inside an input folder, or an input lies inside an output folder (which the
command would write over). Inputs are what is actually read: every file of a checkpoint set, the
folders a dataset's images and labels are read from (not a dataset root, which may be the working
folder), the dataset YAML, the settings files of ``train`` and the source files of ``predict``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from .data.sources import img2label_path

Labelled = tuple[str, str | os.PathLike]


class OutputOverlapError(ValueError):
    """An output path is, is inside, or contains one of the command's inputs."""


def dataset_inputs(image_files: Iterable[str | os.PathLike], data: str | os.PathLike | None = None) -> list[Labelled]:
    """The folders a dataset is read from: those of its image files and of their label files, and the
    dataset YAML ``data`` when it is a file (a dataset given as a folder is read through those folders)."""
    image_folders = {Path(f).parent for f in image_files}
    inputs: list[Labelled] = [("dataset images", folder) for folder in sorted(image_folders)]
    inputs += [("dataset labels", folder) for folder in sorted({img2label_path(f / "x.jpg").parent
                                                                for f in image_folders})]
    if data is not None and Path(data).is_file():
        inputs.append(("dataset", Path(data)))
    return inputs


def refuse_overwriting_inputs(outputs: Iterable[Labelled], inputs: Iterable[Labelled]) -> None:
    """Raise :class:`OutputOverlapError` (one line) for the first output that is, is inside, or contains
    an input. ``outputs`` pair each path with the option that sets it; ``inputs`` with what it is."""
    resolved_inputs = [(label, path, Path(path).resolve()) for label, path in inputs]
    for option, out in outputs:
        target = Path(out).resolve()
        for label, path, source in resolved_inputs:
            if target == source:
                relation = "is"
            elif source in target.parents:
                relation = "is inside"
            elif target in source.parents:
                relation = "contains"
            else:
                continue
            raise OutputOverlapError(f"the output {out} {relation} the input {path} ({label}); outputs never "
                                     f"overwrite inputs: choose another {option}")
