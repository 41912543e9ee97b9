"""Synthetic shapes dataset: deterministic bytes, cached reuse, valid labels, command line."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import yaml

from yolotrain.cli import main
from yolotrain.data import generate_shapes_dataset, get_loaders
from yolotrain.data.sources import list_images
from yolotrain.data.verify import verify_split

SMALL = {"n_train": 6, "n_val": 3, "img_size": 64}
SRC = Path(__file__).resolve().parents[1] / "src"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_gives_identical_bytes_and_other_seed_differs(tmp_path):
    a = generate_shapes_dataset(tmp_path / "a", seed=1, **SMALL)
    b = generate_shapes_dataset(tmp_path / "b", seed=1, **SMALL)
    fa = _files(a)
    assert fa == _files(b)
    assert len([k for k in fa if k.startswith("images/train/")]) == 6
    assert len([k for k in fa if k.startswith("labels/val/")]) == 3
    c = generate_shapes_dataset(tmp_path / "a", seed=2, **SMALL)
    assert c != a and _files(c)["images/train/00000.jpg"] != fa["images/train/00000.jpg"]


def test_reuses_existing_folder_and_keys_by_parameters(tmp_path):
    a = generate_shapes_dataset(tmp_path, **SMALL)
    stamp = (a / "images" / "train" / "00000.jpg").stat().st_mtime_ns
    assert generate_shapes_dataset(tmp_path, **SMALL) == a
    assert (a / "images" / "train" / "00000.jpg").stat().st_mtime_ns == stamp
    assert generate_shapes_dataset(tmp_path, **{**SMALL, "n_val": 4}) != a
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]  # temp folders cleaned up


def test_labels_are_valid_and_varied(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLOTRAIN_CACHE", str(tmp_path / "cache"))
    root = generate_shapes_dataset(tmp_path, n_train=20, n_val=2, img_size=96)
    cfg = yaml.safe_load((root / "data.yaml").read_text())
    assert cfg["names"] == ["circle", "rectangle"] and cfg["train"] == "images/train"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # generator output needs no repair
        index = verify_split(list_images(root / "images" / "train"), 2)
    counts = np.array([len(lab) for lab in index.labels])
    assert counts.min() >= 1 and counts.max() <= 6 and len(set(counts)) > 2
    boxes = np.concatenate(index.labels)
    assert set(boxes[:, 0].astype(int)) == {0, 1}
    aspect = boxes[:, 3] / boxes[:, 4]
    assert aspect.min() < 0.7 and aspect.max() > 1.4 and boxes[:, 3].max() / boxes[:, 3].min() > 3
    assert (index.shapes == 96).all()


def test_default_root_and_command_line(tmp_path):
    env = {**os.environ, "YOLOTRAIN_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-m", "yolotrain", "data", "shapes", "--n-train", "4", "--n-val", "2",
                          "--img-size", "64"], capture_output=True, text=True, env=env, check=True)
    path = Path(out.stdout.strip())
    assert path.parent == tmp_path / "cache" / "shapes" and (path / "data.yaml").is_file()
    assert "RuntimeWarning" not in out.stderr


def test_main_with_root(tmp_path, capsys):
    argv = ["data", "shapes", "--root", str(tmp_path / "r"), "--n-train", "4", "--n-val", "2", "--img-size", "64"]
    assert main(argv) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.parent == tmp_path / "r" and (path / "labels" / "val" / "00001.txt").is_file()


def test_loads_through_get_loaders(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLOTRAIN_CACHE", str(tmp_path / "cache"))
    root = generate_shapes_dataset(**SMALL)
    assert root.parent == tmp_path / "cache" / "shapes"
    train, val = get_loaders(root, batch_size=3, num_classes=2, img_size=64, workers=0)
    imgs, targets = next(iter(train))
    assert imgs.shape == (3, 3, 64, 64) and len(targets) > 0
    assert len(val.dataset) == 3
