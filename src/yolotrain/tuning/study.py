"""``yolotrain tune``: hyper-parameter search as an Optuna study shared by any number of processes.

Each trial is a real training run in ``trials/trialN`` of the tune folder; its fitness (0.1 mAP50 +
0.9 mAP50-95) is reported to the study every epoch through an ``on_fit_epoch_end`` callback, and a
pruner ends hopeless trials after the epoch in progress (``trainer.stop``). The study lives in a SQLite
file of the tune folder by default, or in any database Optuna supports (``--storage URL``): every
process given the same storage and study name works on the same study, taking the next trial from
it. A process killed mid-trial leaves that trial running in the storage: the next start on the same
machine marks it failed at once (its process is gone) and queues it again with the same values, and
any other process does so after the heartbeat has been silent for :data:`GRACE_PERIOD_S`.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import fcntl
import os
import socket
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from tqdm import tqdm

from ..atomic import write_atomic
from ..engine.config import HYP_SECTIONS, TrainConfig, add_weights_option, model_settings, resolve_config
from ..engine.results import TrainingError
from ..engine.trainer import train
from ..loss import DivergenceError
from ..runs import process_alive, run_dir
from ..settings import add_arguments, flat_values, from_mapping, leaves, setting
from .evolve import RUNTIME_SETTINGS
from .space import Parameter, default_space, read_space

if TYPE_CHECKING:
    import optuna

DEFAULT_PROJECT = "runs/tune"
HEARTBEAT_INTERVAL_S = 30  # a running trial's process writes a heartbeat this often
GRACE_PERIOD_S = 120  # a trial whose heartbeat is older is failed and queued again by any process
MAX_RETRIES = 3  # times one trial's values are queued again after its process died
MAX_FAILED_IN_A_ROW = 3  # trials ending in a training error, one after another, that end the tuning
STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")


class TuneError(RuntimeError):
    """Tuning cannot start or go on (Optuna missing, a study of other settings, trials failing)."""


@dataclass(frozen=True)
class TuneOptions:
    """The search: how many trials, over what, sampled and pruned how, stored where."""

    trials: int = setting(20, "trials to finish in the study, over all processes sharing it", min=1)
    space: str | None = setting(None, "search space YAML: the settings to search (setting: [low, high], or "
                                "choices); default: the reference's evolved hyper-parameters within its limits")
    sampler: Literal["tpe", "cmaes", "genetic"] = setting(
        "tpe", "tpe (Optuna's TPE), cmaes (CMA-ES) or genetic (the reference's --evolve mutation)")
    pruner: Literal["median", "hyperband", "none"] = setting(
        "median", "end trials whose per-epoch fitness falls behind: median (of earlier trials at the same "
        "epoch) or hyperband")
    storage: str | None = setting(None, "Optuna storage URL shared by every tuning process (postgresql://..., "
                                  "mysql://..., sqlite:///file.db); default: study.db in the tune folder")
    study: str | None = setting(None, "study name in the storage (default: the tune folder's --name)")


@dataclass
class TuneResult:
    """Where a study is and what it found; ``default_fitness`` is the first trial's, the settings as given."""

    save_dir: Path
    storage: str
    study_name: str
    trials: dict[str, int]
    best_trial: int | None = None
    best_fitness: float | None = None
    best_params: dict[str, Any] = field(default_factory=dict)
    best_hyp: Path | None = None
    default_fitness: float | None = None


def import_optuna() -> Any:
    """Optuna, or a one-line :class:`TuneError` naming the extra that installs it."""
    try:
        import optuna
    except ImportError:
        raise TuneError("tuning needs Optuna: pip install 'yolotrain[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # each trial's line is printed here, with its folder
    return optuna


def tune(config: TrainConfig | Mapping[str, Any] | str | os.PathLike | None = None, *,
         hyp: str | os.PathLike | Mapping[str, Any] | None = None, trials: int = TuneOptions.trials,
         space: str | os.PathLike | Mapping[str, Any] | Sequence[Parameter] | None = None,
         sampler: str | optuna.samplers.BaseSampler = TuneOptions.sampler,
         pruner: str | optuna.pruners.BasePruner = TuneOptions.pruner, storage: str | None = None,
         study: str | None = None, **settings: Any) -> TuneResult:
    """Search hyper-parameters: ``yolotrain.tune(data="data.yaml", model="yolov5n", epochs=10, trials=30)``.

    ``config``, ``hyp`` and ``settings`` are the fixed settings of every trial, as for
    :func:`yolotrain.train` (``project``/``name`` name the tune folder, default ``runs/tune/exp``).
    ``space`` (a YAML file, its mapping, or :class:`Parameter` s) names the settings searched and their
    ranges (default: :func:`~yolotrain.tuning.space.default_space` of the model);
    ``sampler`` and ``pruner`` are names (see :class:`TuneOptions`) or Optuna objects. The study continues
    where it stands: trials already finished count towards ``trials``.
    """
    optuna = import_optuna()
    options = from_mapping(TuneOptions, {"trials": trials, "storage": storage, "study": study,
                                         **({"sampler": sampler} if isinstance(sampler, str) else {}),
                                         **({"pruner": pruner} if isinstance(pruner, str) else {})})
    settings.setdefault("project", DEFAULT_PROJECT)
    base = resolve_config(config, hyp=hyp, **settings)
    parameters = default_space(base.model) if space is None else tuple(space) if _is_parameters(space) \
        else read_space(space)
    save_dir = run_dir(base.project, base.name)
    save_dir.mkdir(parents=True, exist_ok=True)
    url = options.storage or f"sqlite:///{(save_dir / 'study.db').resolve()}"
    name = options.study or base.name
    with _trial_slot(save_dir):  # one process at a time creates the tables and the study
        storage = _storage(optuna, url)
        the_study = optuna.create_study(storage=storage, study_name=name, direction="maximize",
                                        sampler=_sampler(optuna, sampler, parameters, base),
                                        pruner=_pruner(optuna, pruner, base), load_if_exists=True)
        _check_same_study(the_study, base, parameters, url)
        if not the_study.get_trials(deepcopy=False):  # the settings as given are the first trial
            the_study.enqueue_trial(_defaults(base, parameters), user_attrs={"defaults": True})
    tqdm.write(f"tune: study {name!r} in {url}: {_counts(the_study)}; {options.trials} trials asked")
    _run_trials(optuna, the_study, storage, base, parameters, save_dir, options.trials)
    return summarise(the_study, base, save_dir, url)


def _is_parameters(space: Any) -> bool:
    return isinstance(space, Sequence) and not isinstance(space, str) and all(isinstance(p, Parameter) for p in space)


def _storage(optuna: Any, url: str) -> Any:
    """The study's database; a URL that names no reachable database (or whose driver is missing) is a
    one-line :class:`TuneError`."""
    from sqlalchemy.exc import SQLAlchemyError

    # SQLite allows one writer at a time: wait for the lock rather than failing at once.
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None
    with warnings.catch_warnings():  # the heartbeat has been in Optuna since 2.8, still marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            return optuna.storages.RDBStorage(
                url, engine_kwargs=engine, heartbeat_interval=HEARTBEAT_INTERVAL_S, grace_period=GRACE_PERIOD_S,
                heartbeat_stale_trial_callback=_retry(optuna))
        except (SQLAlchemyError, ImportError, ValueError) as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise TuneError(f"--storage {url}: cannot open the study's database ({reason})") from None


def _retry(optuna: Any) -> Any:
    """Queues a failed trial again with the same values (and records which trial it retries)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES)


def _sampler(optuna: Any, sampler: Any, parameters: Sequence[Parameter], base: TrainConfig) -> Any:
    if not isinstance(sampler, str):
        return sampler
    if sampler == "cmaes":  # choices are drawn independently, as CMA-ES searches numbers only
        return optuna.samplers.CmaEsSampler(warn_independent_sampling=False)
    if sampler == "genetic":
        from .samplers import ReferenceMutationSampler  # needs Optuna, which is imported only when tuning

        return ReferenceMutationSampler(parameters)
    return optuna.samplers.TPESampler(multivariate=True, constant_liar=True)


def _pruner(optuna: Any, pruner: Any, base: TrainConfig) -> Any:
    if not isinstance(pruner, str):
        return pruner
    if pruner == "median":  # after 3 finished trials, from the second epoch on
        return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=1)
    if pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=base.epochs)
    return optuna.pruners.NopPruner()


def _defaults(base: TrainConfig, parameters: Sequence[Parameter]) -> dict[str, Any]:
    """The searched settings' values as given, for those within the searched ranges."""
    values = flat_values(base)
    return {p.name: values[p.name] for p in parameters if p.contains(values[p.name])}


def _comparable(base: TrainConfig) -> dict[str, Any]:
    tree = base.to_dict()
    for key in RUNTIME_SETTINGS:
        tree.pop(key, None)
    tree["data"].pop("workers", None)
    return tree


def _check_same_study(study: Any, base: TrainConfig, parameters: Sequence[Parameter], url: str) -> None:
    """Every process of a study trains with the same fixed settings over the same space; the first
    records them in the study."""
    recorded = {"settings": _comparable(base), "space": [dataclasses.asdict(p) for p in parameters]}
    recorded = yaml.safe_load(yaml.safe_dump(recorded))  # as the storage gives it back (lists, not tuples)
    saved = study.user_attrs.get("yolotrain")
    if saved is None:
        study.set_user_attr("yolotrain", recorded)
    elif saved != recorded:
        what = "another search space" if saved["settings"] == recorded["settings"] else "other settings"
        raise TuneError(f"study {study.study_name!r} in {url} was started with {what}: give another --study "
                        f"(or --name) to start a new one")


@contextlib.contextmanager
def _trial_slot(save_dir: Path) -> Iterator[Callable[[], None]]:
    """The tune folder's lock, held while a process counts the trials and starts one, so processes of one
    machine never start more trials than asked; yields a function that releases it early."""
    fd = os.open(save_dir / ".trials.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.lockf(fd, fcntl.LOCK_EX)

    def release() -> None:
        nonlocal fd
        if fd >= 0:
            os.close(fd)  # closing drops the lock
            fd = -1

    try:
        yield release
    finally:
        release()


def _run_trials(optuna: Any, study: Any, storage: Any, base: TrainConfig, parameters: Sequence[Parameter],
                save_dir: Path, trials: int) -> None:
    failed_in_a_row = 0
    while True:
        with _trial_slot(save_dir) as release:
            _requeue_dead_trials(optuna, study, storage)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(study)
            if _counted(optuna, study) >= trials:
                return
            before = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)))
            study.optimize(lambda trial: _objective(optuna, trial, base, parameters, save_dir, release),
                           n_trials=1, catch=(TrainingError, DivergenceError), gc_after_trial=True)
        failed = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))) > before
        failed_in_a_row = failed_in_a_row + 1 if failed else 0
        if failed_in_a_row >= MAX_FAILED_IN_A_ROW:
            raise TuneError(f"{failed_in_a_row} trials in a row ended in a training error; see their runs in "
                            f"{save_dir / 'trials'}")


def _counted(optuna: Any, study: Any) -> int:
    """Trials that finished or are running: those that count towards the asked number."""
    state = optuna.trial.TrialState
    return len(study.get_trials(deepcopy=False, states=(state.COMPLETE, state.PRUNED, state.RUNNING)))


def _requeue_dead_trials(optuna: Any, study: Any, storage: Any) -> None:
    """Running trials of this machine whose process is gone (killed): failed, and their values queued again,
    without waiting for their heartbeat to go stale."""
    host = socket.gethostname()
    study_id = storage.get_study_id_from_name(study.study_name)
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        pid = trial.user_attrs.get("pid")
        if trial.user_attrs.get("host") != host or pid is None or process_alive(pid):
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        try:
            storage.set_trial_state_values(trial_id, state=optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another process got there first
        tqdm.write(f"tune: trial {trial.number} was left running by process {pid}, which is gone: queued again")
        _retry(optuna)(study, storage.get_trial(trial_id))


def _objective(optuna: Any, trial: Any, base: TrainConfig, parameters: Sequence[Parameter], save_dir: Path,
               release_slot: Callable[[], None]) -> float:
    from .samplers import suggest  # needs Optuna, which is imported only when tuning

    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("pid", os.getpid())
    release_slot()  # the trial is in the storage: other processes may count it and start theirs
    values = suggest(trial, parameters)
    pruned_at: list[int] = []

    def report(trainer: Any, epoch: int, row: Mapping[str, Any], fitness: float) -> None:
        if row.get("mAP50", "") == "":  # not validated this epoch (--no-val): nothing new to judge
            return
        trial.report(fitness, epoch)
        if epoch + 1 < trainer.config.epochs and trial.should_prune():  # a finished run is kept whole
            pruned_at.append(epoch)
            trainer.stop = True

    tqdm.write(f"tune: trial {trial.number}: " + ", ".join(f"{k} {v:.5g}" if isinstance(v, float) else f"{k} {v}"
                                                            for k, v in values.items()))
    try:
        result = train(base, hyp=values, project=str(save_dir / "trials"), name=f"trial{trial.number}",
                       exist_ok=True, callbacks={"on_fit_epoch_end": report})
    except KeyboardInterrupt:  # Optuna records the trial as failed; its values are tried again next time
        trial.study.enqueue_trial(values, user_attrs={"retry_of": trial.number})
        raise
    score = 0.1 * result.metrics.get("mAP50", 0.0) + 0.9 * result.metrics.get("mAP50-95", 0.0)
    if pruned_at:
        tqdm.write(f"tune: trial {trial.number} pruned after epoch {pruned_at[0] + 1}: fitness {score:.5f} falls "
                   f"behind the earlier trials")
        raise optuna.TrialPruned(f"fitness {score:.5f} after epoch {pruned_at[0] + 1}")
    tqdm.write(f"tune: trial {trial.number} finished: fitness {score:.5f}")
    return score


def _counts(study: Any) -> str:
    counts = _state_counts(study)
    return ", ".join(f"{n} {state.lower()}" for state, n in counts.items() if n) or "no trials yet"


def _state_counts(study: Any) -> dict[str, int]:
    counts = dict.fromkeys(STATES, 0)
    for trial in study.get_trials(deepcopy=False):
        counts[trial.state.name] = counts.get(trial.state.name, 0) + 1
    return counts


def summarise(study: Any, base: TrainConfig, save_dir: Path, url: str) -> TuneResult:
    """The study's outputs in the tune folder (trials.csv, best_hyp.yaml, the plots) and its summary."""
    trials = study.get_trials(deepcopy=False)
    write_trials_table(save_dir / "trials.csv", trials)
    result = TuneResult(save_dir, url, study.study_name, _state_counts(study))
    complete = [t for t in trials if t.state.name == "COMPLETE" and t.value is not None]
    defaults = [t for t in complete if t.user_attrs.get("defaults")]
    result.default_fitness = defaults[0].value if defaults else None
    if complete:
        best = max(complete, key=lambda t: t.value)
        result.best_trial, result.best_fitness, result.best_params = best.number, best.value, dict(best.params)
        result.best_hyp = write_best_hyp(save_dir / "best_hyp.yaml", base, best, study.study_name)
        write_plots(study, save_dir)
    tqdm.write(f"tune: {_counts(study)}; trials: {save_dir / 'trials.csv'}; dashboard: optuna-dashboard {url}")
    if result.best_hyp is not None:
        as_given = "not finished" if result.default_fitness is None else f"{result.default_fitness:.5f}"
        tqdm.write(f"tune: best trial {result.best_trial}: fitness {result.best_fitness:.5f} (the settings as "
                   f"given: {as_given}); usage: yolotrain train --hyp {result.best_hyp}")
    return result


def write_trials_table(path: Path, trials: Sequence[Any]) -> None:
    """One row per trial: number, state, fitness, epochs reported, duration and the searched values."""
    names = list(dict.fromkeys(name for t in trials for name in t.params))

    def write(temp: Path) -> None:
        with temp.open("w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["trial", "state", "fitness", "epochs", "seconds", *names])
            for t in trials:
                seconds = (t.datetime_complete - t.datetime_start).total_seconds() \
                    if t.datetime_complete and t.datetime_start else ""
                epochs = max(t.intermediate_values) + 1 if t.intermediate_values else 0
                out.writerow([t.number, t.state.name.lower(), "" if t.value is None else f"{t.value:.5f}", epochs,
                              f"{seconds:.1f}" if seconds != "" else "", *(t.params.get(n, "") for n in names)])

    write_atomic(path, write)


def write_best_hyp(path: Path, base: TrainConfig, best: Any, study_name: str) -> Path:
    """The best trial's hyper-parameters (every setting of the hyp sections) as a flat ``--hyp`` file."""
    config = resolve_config(base, hyp=best.params)
    values = flat_values(config)
    hyp = {f.name: values[f.name] for p, f, _ in leaves(TrainConfig) if p.split(".")[0] in HYP_SECTIONS}
    header = f"# yolotrain tune: best trial {best.number} of study {study_name!r}, fitness {best.value:.5f}\n"
    text = header + yaml.safe_dump({k: list(v) if isinstance(v, tuple) else v for k, v in hyp.items()},
                                   sort_keys=False)
    write_atomic(path, lambda temp: temp.write_text(text))
    return path


def write_plots(study: Any, save_dir: Path) -> None:
    """optimization_history.png, and param_importances.png once two trials have finished."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as plots

    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    figures = [("optimization_history.png", plots.plot_optimization_history)]
    if len(complete) >= 2 and len({tuple(sorted(t.params.items())) for t in complete}) >= 2:
        figures.append(("param_importances.png", plots.plot_param_importances))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        for name, plot in figures:
            try:
                axes = plot(study)
            except (ValueError, RuntimeError) as error:  # e.g. importances of values that never varied
                tqdm.write(f"tune: {name} not drawn: {error}")
                continue
            axes.figure.set_size_inches(10, 6)
            axes.figure.tight_layout()
            write_atomic(save_dir / name, lambda temp, fig=axes.figure: fig.savefig(temp, format="png", dpi=120))
            plt.close(axes.figure)


def add_tune_arguments(parser: Any) -> None:
    """``yolotrain tune``: the search options, then every ``train`` setting, fixed for all trials."""
    parser.add_argument("--config", help="a run's config.yaml (nested settings) every trial starts from")
    parser.add_argument("--hyp", help="hyper-parameter YAML (flat) every trial starts from")
    add_arguments(parser, TuneOptions)
    add_arguments(parser, TrainConfig)
    add_weights_option(parser)
    for action in parser._actions:
        if action.dest == "project":
            action.help = f"parent of the tune folder (default {DEFAULT_PROJECT})"
        elif action.dest == "name":
            action.help = "tune folder name (default exp); the same name continues its study"
    parser.set_defaults(run=run_tune)


def run_tune(args: Any) -> int:
    settings = {k: v for k, v in vars(args).items() if k not in ("command", "run", "config", "hyp", "argv")}
    options = {k: settings.pop(k) for k in [f.name for f in dataclasses.fields(TuneOptions)] if k in settings}
    tune(args.config, hyp=args.hyp, **options, **model_settings(settings))
    return 0
