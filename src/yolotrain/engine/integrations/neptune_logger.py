"""Neptune: one run per training run with the settings as parameters, each epoch's values under the
reference's tags as series, the final validation images and the best weights as files."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import LoggerError, best_weights, error_line, import_package, new_run_key, tagged
from .tracker import Tracker


class NeptuneLogger(Tracker):
    """One Neptune run per training run, named after the run folder, in ``$NEPTUNE_PROJECT``. Without
    ``$NEPTUNE_API_TOKEN`` (or with ``NEPTUNE_MODE=offline``) the run is offline: its data stay in
    ``.neptune`` in the run folder (``$NEPTUNE_DATA_DIRECTORY`` when set) for
    ``neptune sync --path <run folder>``. The run's custom id is chosen here and kept in ``loggers.json``,
    so a resumed run logs into the same Neptune run."""

    def __init__(self, save_dir: Path, config: Mapping[str, Any], saved: Mapping[str, Any],
                 log: Callable[[str], None]) -> None:
        neptune = import_package("neptune", "neptune")
        self.custom_run_id = saved.get("custom_run_id") or new_run_key()
        mode = os.environ.get("NEPTUNE_MODE") or ("async" if os.environ.get("NEPTUNE_API_TOKEN") else "offline")
        data_dir = os.environ.get("NEPTUNE_DATA_DIRECTORY")
        # Neptune reads its data folder from the environment when the run starts.
        os.environ["NEPTUNE_DATA_DIRECTORY"] = data_dir or str(save_dir / ".neptune")
        try:
            # Progress bars are the console's; the values are logged as results.csv has them.
            self.run = neptune.init_run(name=save_dir.name, custom_run_id=self.custom_run_id, mode=mode,
                                        capture_stdout=False, capture_stderr=False, source_files=[])
        except Exception as error:  # no project or token, no network: one line, training not started
            raise LoggerError(f"--logger neptune could not start a run ({error_line(error)}); "
                              f"NEPTUNE_MODE=offline logs without an account") from None
        finally:
            if data_dir is None:
                del os.environ["NEPTUNE_DATA_DIRECTORY"]
        if not saved:
            self.run["parameters"] = neptune.utils.stringify_unsupported(dict(config))
        log(f"Neptune: run {self.custom_run_id} ({mode}), data in {data_dir or save_dir / '.neptune'}")

    def state(self) -> dict[str, str]:
        return {"custom_run_id": self.custom_run_id}

    def log_row(self, epoch: int, values: Mapping[str, float]) -> None:
        for tag, value in tagged(values).items():
            self.run[tag].append(value, step=epoch)

    def log_images(self, files: Sequence[Path], epoch: int) -> None:
        for file in files:
            self.run[f"val_predictions/{file.stem}"].upload(str(file))

    def finish(self, weights: Path, failed: bool) -> None:
        files = best_weights(weights)
        if not failed and files:
            self.run["weights/best"].upload_files([str(f) for f in files])
        if failed:
            self.run["sys/failed"] = True
        self.run.stop()
