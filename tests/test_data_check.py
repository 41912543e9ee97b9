"""Dataset check: summary, preview image and label statistics plot."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import cv2
import numpy as np

from yolotrain.data.check import check_dataset
from yolotrain.data.verify import DataWarning

FIXTURES = Path(__file__).parent / "fixtures" / "data"


def test_check_writes_preview_and_stats(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("YOLOTRAIN_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "coco_mini"
    shutil.copytree(FIXTURES / "coco_mini", root)
    result = check_dataset(root / "data.yaml", tmp_path / "out", img_size=128)
    out = capsys.readouterr().out
    assert "train: 6 images, 6 labelled" in out
    preview = cv2.imread(str(result.preview))
    assert preview.shape == (256, 256, 3)
    assert preview.std() > 10  # real content, not a blank canvas
    stats = cv2.imread(str(result.stats))
    assert stats is not None and stats.shape[0] > 200 and stats.shape[1] > 400
    assert result.train.rows == result.val.rows > 0


def test_check_reports_bad_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("YOLOTRAIN_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "bad"
    shutil.copytree(FIXTURES / "bad", root)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)  # printed once, not repeated as a warning
        result = check_dataset(root / "data.yaml", tmp_path / "out", img_size=64)
    out = capsys.readouterr().out
    assert "4 corrupt skipped" in out and "lab_columns.txt:2" in out
    assert result.train.corrupt == 4
    assert np.asarray(cv2.imread(str(result.preview))).size > 0
