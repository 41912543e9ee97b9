"""Where a run goes on from: the checkpoint ``--resume`` names, the settings saved in it, the dataset it
recorded, and the run a torchrun elastic restart continues."""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..checkpoint import CheckpointError, read_metadata
from ..data.fingerprint import ResumeDataWarning, dataset_changes, record_problem
from ..data.loaders import DataConfig, run_class_names
from ..settings import ConfigError, setting
from . import distributed as D
from .config import TrainConfig
from .results import TrainingError, TrainResult

# The names of a run's last checkpoint set, the one --resume continues.
RESUME_NAMES = frozenset({"last", "last.json", "last.safetensors", "last.state.pt"})

# What may accompany ``resume``: where the run goes on, and where to look for it.
RESUME_SETTINGS = frozenset({"device", "workers", "project"})


@dataclass(frozen=True)
class ResumeOptions:
    """What ``resume`` may be told besides where the run goes on (device, workers)."""

    accept_changed_data: bool = setting(False, "with --resume: go on although the dataset changed since the "
                                        "checkpoint (class names, image count or labels)")


def find_resume_checkpoint(resume: str | os.PathLike | bool, project: str | os.PathLike = TrainConfig.project) -> Path:
    """``resume=True``: the newest ``weights/last`` under ``project``; else the given run folder or its
    ``weights/last`` checkpoint (any file of the set). Anything else is refused: the run folder a resume
    writes into is the checkpoint's grandparent, so it must be one."""
    if resume is not True and str(resume).lower() not in ("true", "1"):
        path = Path(resume)
        if path.is_dir():
            path = path / "weights" / "last.json"
        elif path.name not in RESUME_NAMES or path.parent.name != "weights":
            raise FileNotFoundError(f"--resume takes a run folder or the weights/last checkpoint inside one, "
                                    f"not {path}")
        path = path.with_name("last.json")
        if not path.is_file():
            raise FileNotFoundError(f"no checkpoint to resume at {path}")
        return path
    candidates = sorted(Path(project).glob("*/weights/last.json"), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise FileNotFoundError(f"no run to resume: no */weights/last.json under {project}")
    return candidates[-1]


def resumed_config(path: Path) -> TrainConfig:
    """The configuration the run of the ``last`` checkpoint at ``path`` goes on with: the one saved in it,
    on the dataset at the location it recorded (whatever the working folder is now)."""
    metadata, has_state = read_metadata(path)
    if not has_state:
        raise TrainingError(f"{path}: has no training state to resume from (is it a 'best' checkpoint?)")
    try:
        saved = TrainConfig.from_dict(metadata.get("train_args"))
    except ConfigError as error:
        raise CheckpointError(f"{path}: the saved run settings are not valid ({error})") from None
    if int(metadata["epoch"]) + 1 >= saved.epochs:
        raise TrainingError(f"{path}: that run already finished all {saved.epochs} epochs; nothing to resume")
    recorded = metadata.get("dataset")
    if recorded is not None and record_problem(recorded):
        raise CheckpointError(f"{path}: field 'dataset' {record_problem(recorded)}")
    if recorded is not None and recorded["path"] is not None and saved.data.path is not None:
        saved = dataclasses.replace(saved, data=dataclasses.replace(saved.data, path=recorded["path"]))
    return saved


def check_resumed_data(resume_from: Path, record: dict[str, Any], data_root: Path, names: list[str],
                       data: DataConfig, accept_changed_data: bool) -> None:
    """A resumed run goes on with the data its checkpoint recorded: a change stops it in one line,
    unless accepted (``accept_changed_data``); a change in the number of classes always does.
    ``record`` is the dataset record of the data found now, ``names`` the run's class names."""
    recorded = read_metadata(resume_from)[0].get("dataset")
    if recorded is None:
        warnings.warn(f"{resume_from}: saved without a record of its dataset (by an older yolotrain); "
                      f"resuming on {data_root} without checking it is the same", ResumeDataWarning,
                      stacklevel=2)
        return
    problem = record_problem(recorded)
    if problem:
        raise CheckpointError(f"{resume_from}: field 'dataset' {problem}")
    changes = dataset_changes(recorded, record)
    if not changes:
        return
    what = (f"the dataset {data_root} changed since {resume_from} was saved "
            f"({'; '.join(changes)})")
    if len(run_class_names(recorded["names"], data)) != len(names):
        raise TrainingError(f"{what}: a resumed run cannot change its number of classes; start a new run")
    if not accept_changed_data:
        raise TrainingError(f"{what}; continue on it anyway with --accept-changed-data, or start a new run")
    warnings.warn(f"{what}; continuing on it (--accept-changed-data)", ResumeDataWarning, stacklevel=2)


@dataclass(frozen=True)
class ElasticRestart:
    """Where the run of a job that torchrun's elastic agent restarted goes on."""

    run_dir: Path
    last: Path | None = None  # the checkpoint to continue from; None with no result: start the run again
    finished: TrainResult | None = None  # the run had finished all its epochs before the restart


def elastic_restart(project: str | os.PathLike) -> ElasticRestart | None:
    """When the elastic agent has restarted the group, the job's run: its last checkpoint to continue
    from (no ``--resume`` needed), none when no epoch was saved yet, or its result when it had finished
    all epochs before the restart (a process died on its way out); ``None`` on a first launch."""
    ctx = D.context_from_env()
    run_dir = D.elastic_run_dir(ctx, project)
    if run_dir is None:
        return None
    last = run_dir / "weights" / "last.json"
    if not last.is_file():
        return ElasticRestart(run_dir)
    metadata, _ = read_metadata(last)
    if int(metadata["epoch"]) + 1 < int(metadata["train_args"]["epochs"]):
        return ElasticRestart(run_dir, last=last)
    if not ctx.restart_count:
        return None  # a finished run of an earlier job under the same id: this launch starts its own
    if ctx.is_main:
        tqdm.write(f"{run_dir} finished all its epochs before the restart; nothing left to train")
    return ElasticRestart(run_dir, finished=TrainResult(run_dir, run_dir / "weights" / "last",
                                                        run_dir / "weights" / "best", 0,
                                                        dict(metadata.get("metrics") or {})))
