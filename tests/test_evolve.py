"""``train --evolve``: the reference's evolution table, mutation and files, and continuing an interrupted one."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from yolotrain.data import generate_shapes_dataset
from yolotrain.engine.config import IgnoredSettingWarning, TrainConfig, resolve_config
from yolotrain.settings import ConfigError, check_value, leaves
from yolotrain.tuning.evolve import (
    HYP_KEYS,
    RESULT_COLUMNS,
    append_row,
    evolve,
    fitness,
    mutate,
    read_rows,
    select_parent,
    write_best_yaml,
)
from yolotrain.tuning.space import REFERENCE_META, UNUSED_REFERENCE_KEYS

FAST = {"epochs": 1, "img_size": 32, "batch_size": 4, "nominal_batch": 4, "workers": 0, "autoanchor": False,
        "plots": False, "tensorboard": False}
CLI_FAST = ["--epochs", "1", "--img", "32", "--batch", "4", "--workers", "0", "--noautoanchor", "--no-tensorboard",
            "--no-plots"]


@pytest.fixture(scope="module")
def tune_data(tmp_path_factory) -> Path:
    """A smaller shapes dataset than conftest's tiny_data (4 training, 2 validation images of 32 px): every
    trial or generation trains on it."""
    root = generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=4, n_val=2, img_size=32)
    return root / "data.yaml"


def reference_meta(reference) -> dict[str, tuple[float, float, float]]:
    """The ``meta`` table of the reference's train.py, read from its source."""
    tree = ast.parse((Path(reference.__file__).parent / "train.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "meta" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("no meta table in the reference's train.py")


def test_the_evolution_table_is_the_reference_one(reference):
    meta = reference_meta(reference)
    del meta["anchors"]  # anchor counts are not evolved here (the reference drops it too under --noautoanchor)
    assert {k: (g.gain, g.low, g.high) for k, g in REFERENCE_META.items()} == meta
    hyp = yaml.safe_load((Path(reference.__file__).parent / "data/hyps/hyp.scratch-low.yaml").read_text())
    assert HYP_KEYS == tuple(hyp)  # evolve.csv's hyper-parameter columns, in the reference's order


def test_the_reference_limits_are_valid_settings():
    fields = {f.name: (path, f, tp) for path, f, tp in leaves(TrainConfig)}
    for key, gene in REFERENCE_META.items():
        if key not in UNUSED_REFERENCE_KEYS:
            path, f, tp = fields[key]
            for value in {gene.low, gene.high} - {0.0} if f.metadata.get("above") == 0 else (gene.low, gene.high):
                check_value(path, f, tp, value)


@given(st.lists(st.floats(0.01, 10), min_size=len(HYP_KEYS), max_size=len(HYP_KEYS)), st.integers(0, 2**32 - 1))
def test_a_mutation_changes_some_genes_by_bounded_factors(parent, seed):
    gains = np.array([REFERENCE_META[k].gain for k in HYP_KEYS])
    child = mutate(np.array(parent), gains, np.random.default_rng(seed))
    factors = child / np.array(parent)
    assert np.all((factors >= 0.3 - 1e-9) & (factors <= 3 + 1e-9))
    assert np.all(factors[gains == 0] == 1) and np.any(factors != 1)


def test_parents_are_drawn_from_the_five_best_rows():
    rows = np.zeros((8, len(RESULT_COLUMNS) + 1))
    rows[:, 3] = np.arange(8) / 10  # mAP50-95: row 7 is best
    rows[:, -1] = np.arange(8)
    drawn = {int(select_parent(rows, np.random.default_rng(seed))[-1]) for seed in range(200)}
    assert drawn <= {3, 4, 5, 6, 7} and 7 in drawn and len(drawn) >= 3


def test_evolve_files_match_the_reference_print_mutation(reference, tmp_path):
    from yolov5.utils.general import print_mutation

    hyp = {k: REFERENCE_META[k].low + (REFERENCE_META[k].high - REFERENCE_META[k].low) / 3 for k in HYP_KEYS}
    results = [(0.5, 0.4, 0.3, 0.2, 0.05, 0.02, 0.01), (0.6, 0.5, 0.45, 0.25, 0.04, 0.02, 0.01)]
    (tmp_path / "ours").mkdir()
    (tmp_path / "theirs").mkdir()
    for result in results:
        append_row(tmp_path / "ours" / "evolve.csv", result, hyp)
        print_mutation(RESULT_COLUMNS, result, dict(hyp), tmp_path / "theirs", "")
    assert (tmp_path / "ours" / "evolve.csv").read_text() == (tmp_path / "theirs" / "evolve.csv").read_text()
    assert write_best_yaml(tmp_path / "ours" / "hyp_evolve.yaml", read_rows(tmp_path / "ours" / "evolve.csv")) == 1
    ours, theirs = ((tmp_path / side / "hyp_evolve.yaml").read_text() for side in ("ours", "theirs"))
    assert ours.split("\n\n")[0] == theirs.split("\n\n")[0]  # the comment header
    assert yaml.safe_load(ours) == pytest.approx(yaml.safe_load(theirs))


def test_a_folder_of_another_evolution_is_refused(tune_data, tmp_path):
    project = tmp_path / "runs"
    save_dir = project / "exp"
    save_dir.mkdir(parents=True)
    (save_dir / "config.yaml").write_text(yaml.safe_dump(resolve_config(data=str(tune_data), **FAST).to_dict()))
    append_row(save_dir / "evolve.csv", [0.1] * 7, dict.fromkeys(HYP_KEYS, 0.5))
    with pytest.raises(ConfigError, match=r"holds an evolution of other settings \(.*epochs.*\): give another --name"):
        evolve(2, data=str(tune_data), project=str(project), **{**FAST, "epochs": 2})


def test_an_interrupted_generation_is_trained_again_and_counted_once(tune_data, tmp_path):
    project = tmp_path / "runs"
    save_dir = project / "exp"
    save_dir.mkdir(parents=True)
    (save_dir / "config.yaml").write_text(yaml.safe_dump(resolve_config(data=str(tune_data), **FAST).to_dict()))
    first = dict.fromkeys(HYP_KEYS, 0.5) | {"lr0": 0.01, "momentum": 0.9, "anchor_t": 4.0, "warmup_epochs": 0.0}
    append_row(save_dir / "evolve.csv", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], first)
    leftover = save_dir / "generations" / "gen1"  # a generation killed before its row was written
    leftover.mkdir(parents=True)
    (leftover / "partial").write_text("")
    result = evolve(2, data=str(tune_data), project=str(project), **FAST)
    rows = read_rows(save_dir / "evolve.csv")
    assert result.generations == 2 and rows.shape == (2, len(RESULT_COLUMNS) + len(HYP_KEYS))
    assert rows[0, :7].tolist() == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    assert not (leftover / "partial").exists() and (leftover / "results.csv").is_file()
    assert (save_dir / "evolve.png").is_file() and result.best_generation == int(np.argmax(fitness(rows)))
    assert evolve(2, data=str(tune_data), project=str(project), **FAST).generations == 2  # nothing left to do


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "yolotrain", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_evolve_three_generations_writes_the_reference_files(tune_data, tmp_path, reference):
    done = run_cli("train", "--evolve", "3", "--data", str(tune_data), *CLI_FAST, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    save_dir = tmp_path / "runs" / "evolve" / "exp"
    lines = (save_dir / "evolve.csv").read_text().splitlines()
    assert len(lines) == 4 and [c.strip() for c in lines[0].split(",")] == [*RESULT_COLUMNS, *HYP_KEYS]
    assert all(len(line.split(",")) == len(RESULT_COLUMNS) + len(HYP_KEYS) for line in lines)
    best = save_dir / "hyp_evolve.yaml"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = resolve_config(hyp=best, data=str(tune_data))
    # iou_t alone is the reference's and not ours (copy_paste is segmentation's augmentation here).
    assert [str(w.message).split("'")[1] for w in caught if w.category is IgnoredSettingWarning] == ["iou_t"]
    values = yaml.safe_load(best.read_text())
    assert config.optim.lr0 == pytest.approx(values["lr0"]) and config.augment.mosaic == pytest.approx(values["mosaic"])
    # The reference's train.py reads a hyp file as a flat mapping and needs every key of its own files.
    reference_hyp = yaml.safe_load((Path(reference.__file__).parent / "data/hyps/hyp.scratch-low.yaml").read_text())
    assert set(values) == set(reference_hyp) and all(isinstance(v, float) for v in values.values())
    assert (save_dir / "evolve.png").is_file() and "Usage: yolotrain train --hyp" in done.stdout


@pytest.mark.slow
def test_evolve_killed_in_generation_two_ends_with_three_rows(tune_data, tmp_path):
    args = [sys.executable, "-m", "yolotrain", "train", "--evolve", "3", "--data", str(tune_data), *CLI_FAST]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    save_dir = tmp_path / "runs" / "evolve" / "exp"
    process = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (save_dir / "generations" / "gen1" / "config.yaml").exists():
            assert process.poll() is None and time.monotonic() < deadline, "generation 2 never started"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait()
    finally:
        process.kill()
    assert len(read_rows(save_dir / "evolve.csv")) == 1
    first = (save_dir / "evolve.csv").read_text().splitlines()[1]
    done = run_cli("train", "--evolve", "3", "--data", str(tune_data), *CLI_FAST, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (save_dir / "evolve.csv").read_text().splitlines()
    assert len(lines) == 4 and lines[1] == first


def test_evolve_alone_means_300_generations_as_in_the_reference():
    from yolotrain.cli import build_parser

    assert build_parser().parse_args(["train", "--evolve"]).evolve == 300
    assert build_parser().parse_args(["train", "--evolve", "3"]).evolve == 3
    assert build_parser().parse_args(["train"]).evolve is None


def _replace_value(text: str, line: int, column: int, value: str) -> str:
    lines = text.splitlines()
    fields = lines[line - 1].split(",")
    fields[column] = f"{value:>20}"
    lines[line - 1] = ",".join(fields)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("corrupt, message", [
    # NaN in a fitness column: numpy's "probabilities contain NaN" when the next parent was drawn.
    (lambda text: _replace_value(text, 3, 2, "nan"), "line 3, column metrics/mAP_0.5: 'nan' is not a finite number"),
    (lambda text: _replace_value(text, 2, 0, "inf"), "line 2, column metrics/precision: 'inf' is not a finite number"),
    # Text: numpy's "could not convert string to float", naming neither the file nor the row.
    (lambda text: _replace_value(text, 2, len(RESULT_COLUMNS), "fast"), "line 2, column lr0: 'fast' is not a finite"),
    (lambda text: text.rsplit(",", 3)[0] + "\n", "line 3: 32 values, expected 35 (the file was cut or edited"),
    (lambda text: "", "not an evolution of this layout (columns none"),
])
def test_a_corrupt_evolve_csv_is_one_line_naming_its_line_and_column(tune_data, tmp_path, capsys, corrupt, message):
    from yolotrain.cli import main

    save_dir = tmp_path / "runs" / "exp"
    save_dir.mkdir(parents=True)
    csv_path = save_dir / "evolve.csv"
    hyp = dict.fromkeys(HYP_KEYS, 0.5) | {"lr0": 0.01, "momentum": 0.9, "anchor_t": 4.0, "warmup_epochs": 0.0}
    append_row(csv_path, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], hyp)
    append_row(csv_path, [0.2, 0.3, 0.4, 0.5, 0.5, 0.6, 0.7], hyp)
    csv_path.write_text(corrupt(csv_path.read_text()))
    code = main(["train", "--evolve", "3", "--data", str(tune_data), *CLI_FAST, "--project", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"yolotrain train: error: {csv_path}") and message in err[0], err[0]
    assert not (save_dir / "generations").exists()  # nothing trained
