"""Outputs never overwrite inputs: every command checks the paths it writes against the ones it reads.

An output conflicts with an input when, both resolved (symbolic links followed), they are the same
path, the output lies inside an input folder, or an input lies inside an output folder (which the
command would write over). Inputs are what is actually read: every file of a checkpoint set, the
folders a dataset's images and labels are read from (not a dataset root, which may be the working
folder), the dataset YAML, the settings files of ``train`` and the source files of ``predict``.

Outputs replace only earlier outputs: a command writes into its own run folder (``--project``/``--name``,
made by :func:`yolotrain.runs.run_dir`), or into a file named for it (``export --output``) that does not
exist yet or is an earlier output of the same kind (an export of the same format, recognised by the
metadata our exports carry); any other existing file there is refused unless the command is told to
replace it (``--force``), and an input never is. Inputs of equal names get outputs of distinct names
(:func:`unique_stems`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from .data.sources import img2label_path

Labelled = tuple[str, str | os.PathLike]


class OutputOverlapError(ValueError):
    """An output path is, is inside, or contains one of the command's inputs."""


class OutputExistsError(ValueError):
    """A named output file exists and is not an earlier output of the same kind."""


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


def refuse_replacing_others(outputs: Iterable[Labelled], earlier_output: Callable[[Path], bool], kind: str,
                            force_flag: str) -> None:
    """Raise :class:`OutputExistsError` (one line) for the first output that exists (a broken symbolic link
    too) and is not an earlier output of the same ``kind`` by ``earlier_output``: a file the command did
    not write is never replaced unless ``force_flag`` says so (the caller then skips this check)."""
    for option, out in outputs:
        path = Path(out)
        if (path.exists() or path.is_symlink()) and not earlier_output(path):
            raise OutputExistsError(f"the output {out} exists and is not {kind}; outputs replace only earlier "
                                    f"outputs of their kind: choose another {option}, or pass {force_flag} to "
                                    "replace it")


def unique_stems(stems: Sequence[str]) -> list[str]:
    """``stems`` made distinct in order, ignoring case (as some file systems do): a stem seen before
    becomes ``STEM_2``, ``STEM_3`` ... (the first free one), so inputs of equal names never share outputs."""
    taken: set[str] = set()
    out = []
    for stem in stems:
        candidate, n = stem, 2
        while candidate.casefold() in taken:
            candidate, n = f"{stem}_{n}", n + 1
        taken.add(candidate.casefold())
        out.append(candidate)
    return out
