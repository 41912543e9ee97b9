"""DVC, through DVCLive: the settings as ``params.yaml``, each epoch's values as DVC metrics and plots, the
final validation images as DVC image plots, all under ``dvclive`` in the run folder."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import LoggerError, best_weights, error_line, import_package, tagged
from .tracker import Tracker


class DVCLiveLogger(Tracker):
    """One DVCLive folder per training run, ``dvclive`` in the run folder, with ``dvc.yaml`` beside it so that
    ``dvc metrics show``, ``dvc plots show`` and ``dvc exp show`` read it inside a DVC repository. Each
    epoch is a DVCLive step (step = epoch); a resumed run continues the same files. Nothing is committed:
    the best weights become a DVC model artifact only inside a DVC repository (DVCLive says so otherwise)."""

    def __init__(self, save_dir: Path, config: Mapping[str, Any], saved: Mapping[str, Any],
                 log: Callable[[str], None]) -> None:
        dvclive = import_package("dvclive", "dvc")
        self.folder = save_dir / "dvclive"
        try:
            self.live = dvclive.Live(dir=str(self.folder), resume=bool(saved), save_dvc_exp=False,
                                     dvcyaml=str(save_dir / "dvc.yaml"))
        except Exception as error:  # a broken DVC repository or settings: one line, training not started
            raise LoggerError(f"--logger dvc could not start DVCLive ({error_line(error)})") from None
        # DVC parameters are YAML: the settings as JSON values (tuples as lists).
        self.live.log_params(json.loads(json.dumps(dict(config), default=str)))
        log(f"DVCLive: metrics and plots in {self.folder}")

    def state(self) -> dict[str, str]:
        return {"dir": str(self.folder)}

    def log_row(self, epoch: int, values: Mapping[str, float]) -> None:
        self.live.step = epoch
        for tag, value in tagged(values).items():
            self.live.log_metric(tag, value)
        self.live.next_step()

    def log_images(self, files: Sequence[Path], epoch: int) -> None:
        for file in files:
            self.live.log_image(f"val_predictions/{file.name}", file)

    def finish(self, weights: Path, failed: bool) -> None:
        files = best_weights(weights)
        if not failed and files:
            self.live.log_artifact(str(files[0]), type="model", name="best",
                                   desc=f"best weights of {weights.parent.name}")
        self.live.end()
