"""The command line as users run it: subcommands present, data check end to end."""

import os
import subprocess
import sys
from pathlib import Path


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yolotrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_help_lists_every_command(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0
    for command in ("train", "val", "predict", "export", "data", "doctor"):
        assert command in result.stdout


def test_data_check_writes_preview_and_statistics(tmp_path, coco_mini):
    result = run_cli("data", "check", str(coco_mini), "--out", "check", "--img", "320",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "check" / "mosaic_preview.png").stat().st_size > 0
    assert (tmp_path / "check" / "label_stats.png").stat().st_size > 0
    assert "train" in result.stdout + result.stderr


def test_data_check_on_a_missing_folder_is_one_line(tmp_path):
    result = run_cli("data", "check", "nowhere", cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "nowhere" in result.stderr
