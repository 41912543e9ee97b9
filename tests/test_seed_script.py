"""examples/seed_train.py, the script users arrive with, run for real in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from yolotrain.data import generate_shapes_dataset

SEED_SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "seed_train.py"


def variant(tmp_path: Path, data: Path, **replacements: str) -> Path:
    """The seed script with some literals replaced (CPU-sized model and images, the dataset path)."""
    text = SEED_SCRIPT.read_text().replace('db_root_dir="./datasets"', f'db_root_dir="{data}"')
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "seed_train.py"
    path.write_text(text)
    return path


def run(script: Path, timeout: float) -> subprocess.CompletedProcess:
    # The script does not seed torch; seed it first so the run is reproducible.
    code = f"import runpy, torch; torch.manual_seed(0); runpy.run_path({str(script)!r}, run_name='__main__')"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=script.parent)


def test_seed_script_runs_unchanged_and_bad_learning_rate_is_named(tmp_path):
    """The original script (lr=0.5): the weights diverge within a few steps; instead of NaN losses the
    loss raises an error naming the step and the learning rate."""
    data = generate_shapes_dataset(root=tmp_path / "shapes", n_train=64, n_val=4, img_size=64)
    script = variant(tmp_path, data, **{"version='l'": "version='n'",
                                        "num_classes=2)": "num_classes=2, img_size=64)"})
    result = run(script, timeout=600)
    assert result.returncode != 0
    assert re.search(r"DivergenceError: diverging at step \d+: head logits reach", result.stderr), result.stderr
    assert "learning rate far too high" in result.stderr
    assert "nan" not in result.stdout.lower()
    assert "modified by an inplace operation" not in result.stderr


def test_seed_script_learns_with_a_sane_learning_rate(tmp_path):
    """lr=1e-3 on the shapes dataset: 5 epochs run (under anomaly mode, as the script asks) and the
    epoch loss falls to under 0.6 of the first epoch's.

    yolov5n at 224 px: over torch seeds 0-3 the ratio is 0.534-0.550, well clear of 0.6 (at 96 px
    with yolov5s the same seeds spread over 0.58-0.64)."""
    data = generate_shapes_dataset(root=tmp_path / "shapes", n_train=80, n_val=4, img_size=224)
    script = variant(tmp_path, data, **{"version='l'": "version='n'", "lr=0.5": "lr=1e-3",
                                        "num_classes=2)": "num_classes=2, img_size=224)"})
    result = run(script, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    losses = [float(x) for x in re.findall(r"Epoch \d/5 \| Loss: ([0-9.]+)", result.stdout)]
    assert len(losses) == 5, result.stdout
    assert losses[-1] < 0.6 * losses[0], losses
