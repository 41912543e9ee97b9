"""Warnings on the command line: one line each (``yolotrain COMMAND: Category: message``), without Python's
source file and line, each text once however many places raise it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings

import cv2

from yolotrain.cli import opencv_log_lines
from yolotrain.data import generate_shapes_dataset
from yolotrain.messages import one_line_warnings


def test_a_command_prints_a_dataset_warning_as_one_line_without_its_source(tmp_path):
    data = generate_shapes_dataset(root=tmp_path / "shapes", n_train=4, n_val=2, img_size=64) / "data.yaml"
    data.write_text(data.read_text().replace("- rectangle", "- circle"))  # two classes named alike
    env = {**os.environ, "YOLOTRAIN_CACHE": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-m", "yolotrain", "data", "check", str(data)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "DuplicateClassNamesWarning" in line]
    assert lines == [f"yolotrain data: DuplicateClassNamesWarning: {data}: 1 name given to several classes: "
                     "'circle' (ids 0, 1); results by name will not tell them apart"], result.stderr
    assert ".py:" not in result.stderr and "warnings.warn" not in result.stderr, result.stderr


def test_each_warning_text_is_shown_once_and_filters_still_apply():
    out = io.StringIO()
    with one_line_warnings("yolotrain val", out):
        warnings.warn("first\n  spread over lines", UserWarning, stacklevel=1)
        warnings.warn("first\n  spread over lines", UserWarning, stacklevel=1)  # another place, same text
        warnings.warn("second", RuntimeWarning, stacklevel=1)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.warn("filtered out", FutureWarning, stacklevel=1)
    assert out.getvalue().splitlines() == ["yolotrain val: UserWarning: first spread over lines",
                                           "yolotrain val: RuntimeWarning: second"]
    assert warnings.showwarning is not None and "filtered out" not in out.getvalue()


def test_a_camera_that_cannot_be_opened_is_our_one_line_without_opencvs_log(tmp_path):
    # OpenCV logs each video backend's failed probe of a missing camera (V4L2, FFmpeg, ...) on stderr;
    # without --verbose the user reads only the command's own line.
    env = {**os.environ, "YOLOTRAIN_CACHE": str(tmp_path / "cache"), "OPENCV_LOG_LEVEL": "INFO"}
    result = subprocess.run([sys.executable, "-m", "yolotrain", "predict", "--weights", "yolov5n", "--source", "99",
                             "--project", str(tmp_path / "runs")], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.splitlines() == ["yolotrain predict: error: cannot open stream 99"], result.stderr


def test_opencv_log_level_is_restored_after_a_command():
    before = cv2.utils.logging.getLogLevel()
    with opencv_log_lines(shown=False):
        assert cv2.utils.logging.getLogLevel() == cv2.utils.logging.LOG_LEVEL_SILENT
    assert cv2.utils.logging.getLogLevel() == before
    with opencv_log_lines(shown=True):
        assert cv2.utils.logging.getLogLevel() == before
