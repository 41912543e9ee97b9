"""``yolotrain train --evolve N``: the reference's hyper-parameter evolution, resumable at any moment.

Each generation is a full training run with hyper-parameters mutated from one of the best earlier
generations (the reference's selection, gains and limits: :data:`~yolotrain.tuning.space.REFERENCE_META`, an
anchor-free model's loss gains within its family's limits);
its results are a row of ``evolve.csv`` in the reference's layout (seven results, then the
hyper-parameters), and ``hyp_evolve.yaml`` holds the best row's values. The folder is the state: a
generation counts once its row is in ``evolve.csv`` (the file is replaced atomically), so an evolution
killed at any moment and started again with the same command trains the missing generations only.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from tqdm import tqdm

from ..atomic import write_atomic
from ..engine.config import TrainConfig, read_settings_file, resolve_config
from ..engine.optim import DEFAULT_LR0
from ..engine.trainer import train
from ..messages import brief
from ..runs import RunLock, run_dir
from ..settings import ConfigError, flat_values
from .space import REFERENCE_META, UNUSED_REFERENCE_KEYS, evolution_limits

# evolve.csv's result columns, as the reference names them, and the TrainResult metrics they hold.
RESULT_COLUMNS = ("metrics/precision", "metrics/recall", "metrics/mAP_0.5", "metrics/mAP_0.5:0.95",
                  "val/box_loss", "val/obj_loss", "val/cls_loss")
RESULT_METRICS = ("precision", "recall", "mAP50", "mAP50-95", "val_box", "val_obj", "val_cls")
HYP_KEYS = tuple(REFERENCE_META)
# The reference's parent selection and mutation: the best 5 rows, a gene mutates with probability 0.8
# by a factor 1 + gain * N(0, 1) * U(0, 1) * 0.2 kept within 0.3..3.
PARENTS, MUTATION_PROBABILITY, SIGMA, FACTOR_RANGE = 5, 0.8, 0.2, (0.3, 3.0)
DEFAULT_PROJECT = "runs/evolve"
# Settings that may differ when the same evolution is continued (where it runs, not what it trains).
RUNTIME_SETTINGS = ("device", "workers", "project", "name", "exist_ok")


def fitness(results: np.ndarray) -> np.ndarray:
    """The reference's fitness of result rows (P, R, mAP50, mAP50-95, ...): 0.1 mAP50 + 0.9 mAP50-95."""
    return results[:, 2] * 0.1 + results[:, 3] * 0.9


def select_parent(rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One of the best :data:`PARENTS` rows, drawn with weights rising with fitness (the reference's
    'single' selection)."""
    best = rows[np.argsort(-fitness(rows), kind="stable")][:PARENTS]
    weights = fitness(best) - fitness(best).min() + 1e-6
    return best[rng.choice(len(best), p=weights / weights.sum())]


def mutate(parent: np.ndarray, gains: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``parent`` (hyper-parameters) times random factors; drawn again until at least one gene changes."""
    factors = np.ones(len(gains))
    while np.all(factors == 1):
        mutated = rng.random(len(gains)) < MUTATION_PROBABILITY
        factors = (gains * mutated * rng.standard_normal(len(gains)) * rng.random() * SIGMA + 1).clip(*FACTOR_RANGE)
    return parent * factors


def constrain(values: Mapping[str, float], limits: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """Values within their limits (:func:`~yolotrain.tuning.space.evolution_limits`), rounded to 5 decimals as the
    reference rounds them."""
    return {k: round(min(max(float(v), limits[k][0]), limits[k][1]), 5) for k, v in values.items()}


def read_rows(csv_path: Path) -> np.ndarray:
    """The rows of ``evolve.csv`` (results then hyper-parameters), ``[0, columns]`` when absent.

    Raises:
        ConfigError: the file is not an evolution of this layout, or a row is short, long, or holds a value
            that is not a finite number (named by its line and column).
    """
    columns = (*RESULT_COLUMNS, *HYP_KEYS)
    if not csv_path.exists():
        return np.zeros((0, len(columns)))
    lines = csv_path.read_text(errors="replace").splitlines()
    header = [name.strip() for name in lines[0].split(",")] if lines else []
    if header != list(columns):
        raise ConfigError(f"{csv_path}: not an evolution of this layout (columns {', '.join(header[:8]) or 'none'} "
                          f"...; expected {', '.join(columns[:3])} ...)")
    rows = []
    for line_number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split(",")
        if len(fields) != len(columns):
            raise ConfigError(f"{csv_path}, line {line_number}: {len(fields)} values, expected {len(columns)} "
                              "(the file was cut or edited; remove the line to train that generation again)")
        rows.append([_csv_number(csv_path, line_number, name, text) for name, text in zip(columns, fields)])
    return np.array(rows, dtype=float).reshape(-1, len(columns))


def _csv_number(csv_path: Path, line_number: int, column: str, text: str) -> float:
    """One value of ``evolve.csv``: a finite number, or a one-line error naming where it is."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not np.isfinite(value):
        raise ConfigError(f"{csv_path}, line {line_number}, column {column}: {brief(text.strip())} is not a finite "
                          "number (the file was edited; fix or remove the line to train that generation again)")
    return value


def append_row(csv_path: Path, results: Sequence[float], hyp: Mapping[str, float]) -> None:
    """One generation's row, in the reference's ``%20.5g`` columns; the file is replaced atomically, so a
    kill leaves it with or without the whole row."""
    columns = len(RESULT_COLUMNS) + len(HYP_KEYS)
    text = csv_path.read_text() if csv_path.exists() else \
        ("%20s," * columns % (*RESULT_COLUMNS, *HYP_KEYS)).rstrip(",") + "\n"
    row = ("%20.5g," * columns % (*results, *(hyp[k] for k in HYP_KEYS))).rstrip(",") + "\n"
    write_atomic(csv_path, lambda temp: temp.write_text(text + row))


def write_best_yaml(yaml_path: Path, rows: np.ndarray) -> int:
    """``hyp_evolve.yaml``: the best row's hyper-parameters (a flat ``--hyp`` file for yolotrain and the
    reference) under the reference's comment header. Returns the best row's index."""
    best = int(np.argmax(fitness(rows)))
    names = (*RESULT_COLUMNS, *HYP_KEYS)
    header = ("# YOLOv5 Hyperparameter Evolution Results\n"
              f"# Best generation: {best}\n# Last generation: {len(rows) - 1}\n"
              "# " + ", ".join(f"{name:>20s}" for name in names[:7]) + "\n"
              "# " + ", ".join(f"{value:>20.5g}" for value in rows[best, :7]) + "\n\n")
    values = {k: float(v) for k, v in zip(HYP_KEYS, rows[best, len(RESULT_COLUMNS):])}
    write_atomic(yaml_path, lambda temp: temp.write_text(header + yaml.safe_dump(values, sort_keys=False)))
    return best


def plot_evolution(csv_path: Path) -> Path:
    """``evolve.png``: fitness against each hyper-parameter, points coloured by density, the best marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_rows(csv_path)
    scores = fitness(rows)
    best = int(np.argmax(scores))
    columns = 5
    fig, axes = plt.subplots(-(-len(HYP_KEYS) // columns), columns, figsize=(10, 12), squeeze=False)
    for i, (ax, key) in enumerate(zip(axes.flat, HYP_KEYS)):
        values = rows[:, len(RESULT_COLUMNS) + i]
        ax.scatter(values, scores, c=_density(values, scores), cmap="viridis", alpha=0.8, edgecolors="none")
        ax.plot(values[best], scores[best], "k+", markersize=15)
        ax.set_title(f"{key} = {values[best]:.3g}", fontsize=9)
        if i % columns:
            ax.set_yticks([])
    for ax in list(axes.flat)[len(HYP_KEYS):]:
        ax.axis("off")
    fig.tight_layout()
    out = csv_path.with_suffix(".png")
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _density(x: np.ndarray, y: np.ndarray, bins: int = 20) -> np.ndarray:
    """How many points share each point's cell of a 2-D histogram (the colour of the scatter plots)."""
    counts, x_edges, y_edges = np.histogram2d(x, y, bins)
    xi = np.clip(np.digitize(x, x_edges) - 1, 0, counts.shape[0] - 1)
    yi = np.clip(np.digitize(y, y_edges) - 1, 0, counts.shape[1] - 1)
    return np.log(counts[xi, yi] + 1)


@dataclass
class EvolveResult:
    save_dir: Path
    generations: int
    best_generation: int
    best_fitness: float
    hyp_yaml: Path


def evolve(generations: int, config: TrainConfig | Mapping[str, Any] | str | os.PathLike | None = None, *,
           hyp: str | os.PathLike | Mapping[str, Any] | None = None, resume: bool | str | os.PathLike = False,
           **settings: Any) -> EvolveResult:
    """Evolve the hyper-parameters over ``generations`` training runs in ``project/name`` (default
    ``runs/evolve/exp``); the folder is continued when it holds fewer generations of the same settings.

    Each generation trains with validation and plots at the final epoch only, as the reference does.
    ``resume`` asks for an evolution that must already exist (``True``: this one; or its folder).
    """
    if generations < 1:
        raise ConfigError(f"--evolve: the number of generations must be at least 1, got {generations}")
    if isinstance(resume, (str, os.PathLike)):
        settings.update(project=str(Path(resume).parent), name=Path(resume).name)
    settings.setdefault("project", DEFAULT_PROJECT)
    base = resolve_config(config, hyp=hyp, **settings)
    save_dir = run_dir(base.project, base.name)
    csv_path = save_dir / "evolve.csv"
    if resume and not csv_path.exists():
        raise FileNotFoundError(f"nothing to resume: {csv_path} does not exist")
    with RunLock(_created(save_dir)):
        _check_same_evolution(save_dir / "config.yaml", base)
        rows = read_rows(csv_path)
        if len(rows) >= generations:
            tqdm.write(f"{save_dir} already holds {len(rows)} generations; give a larger --evolve to go on")
        gains = np.array([REFERENCE_META[k].gain if k not in UNUSED_REFERENCE_KEYS else 0.0 for k in HYP_KEYS])
        start = reference_values(base)
        limits = evolution_limits(base.model)
        while len(rows) < generations:
            generation = len(rows)
            hyp_values = start if generation == 0 else _offspring(rows, gains, base.seed, generation, limits)
            results = _train_generation(base, save_dir, generation, hyp_values)
            append_row(csv_path, results, hyp_values)
            rows = read_rows(csv_path)
            _report(generation, generations, results, hyp_values)
        best = write_best_yaml(save_dir / "hyp_evolve.yaml", rows)
        plot_evolution(csv_path)
    tqdm.write(f"Hyper-parameter evolution finished {len(rows)} generations; best: generation {best} (fitness "
               f"{fitness(rows)[best]:.5f}). Results in {save_dir}\n"
               f"Usage: yolotrain train --hyp {save_dir / 'hyp_evolve.yaml'}")
    return EvolveResult(save_dir, len(rows), best, float(fitness(rows)[best]), save_dir / "hyp_evolve.yaml")


def reference_values(config: TrainConfig) -> dict[str, float]:
    """The configuration's values of the reference's hyper-parameter keys (the first generation's)."""
    flat = flat_values(config)
    if flat.get("lr0") is None:
        # --optimizer auto fits lr0 in each run; evolution needs a value to mutate, and starts from that of AdamW,
        # which auto picks for runs as short as an evolution's.
        flat["lr0"] = DEFAULT_LR0["AdamW"]
    return constrain({k: flat[k] if k in flat else UNUSED_REFERENCE_KEYS[k] for k in HYP_KEYS},
                     evolution_limits(config.model))


def _offspring(rows: np.ndarray, gains: np.ndarray, seed: int, generation: int,
               limits: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """A mutation of a parent drawn from the best rows; seeded by (seed, generation), so a generation
    trained again after an interruption trains the same values."""
    rng = np.random.default_rng([seed, generation])
    parent = select_parent(rows, rng)[len(RESULT_COLUMNS):]
    return constrain(dict(zip(HYP_KEYS, mutate(parent, gains, rng))), limits)


def _train_generation(base: TrainConfig, save_dir: Path, generation: int,
                      hyp_values: Mapping[str, float]) -> list[float]:
    """One generation's training in ``generations/genN`` (a folder left by an interrupted try is
    replaced); its results in evolve.csv's order."""
    run_dir = save_dir / "generations" / f"gen{generation}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    hyp = {k: v for k, v in hyp_values.items() if k not in UNUSED_REFERENCE_KEYS}
    result = train(base, hyp=hyp, project=str(run_dir.parent), name=run_dir.name, exist_ok=True,
                   val=False, plots=False)
    return [float(result.metrics.get(name, 0.0)) for name in RESULT_METRICS]


def _created(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _comparable(config: TrainConfig) -> dict[str, Any]:
    tree = config.to_dict()
    for key in RUNTIME_SETTINGS:
        tree.pop(key, None)
    tree["data"].pop("workers", None)
    return tree


def _check_same_evolution(saved_path: Path, base: TrainConfig) -> None:
    """The folder's evolution must be of the same settings; a start before any generation finished
    records them."""
    if not saved_path.exists() or not (saved_path.parent / "evolve.csv").exists():
        write_atomic(saved_path, lambda temp: temp.write_text(yaml.safe_dump(base.to_dict(), sort_keys=False)))
        return
    saved = TrainConfig.from_dict(read_settings_file(saved_path, "evolution settings"))
    if _comparable(saved) != _comparable(base):
        changed = sorted(_differences(_comparable(saved), _comparable(base)))
        raise ConfigError(f"{saved_path.parent} holds an evolution of other settings ({', '.join(changed[:3])} "
                          f"differ): give another --name to start a new one")


def _differences(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[str]:
    found = []
    for key in a.keys() | b.keys():
        if isinstance(a.get(key), Mapping) and isinstance(b.get(key), Mapping):
            found += _differences(a[key], b[key], f"{prefix}{key}.")
        elif a.get(key) != b.get(key):
            found.append(f"{prefix}{key}")
    return found


def _report(generation: int, generations: int, results: Sequence[float], hyp: Mapping[str, float]) -> None:
    score = fitness(np.array([results]))[0]
    tqdm.write(f"evolve: generation {generation + 1}/{generations} done, fitness {score:.5f} "
               f"(mAP50 {results[2]:.4f}, mAP50-95 {results[3]:.4f}); "
               + ", ".join(f"{k} {v:g}" for k, v in hyp.items() if k not in UNUSED_REFERENCE_KEYS))
