"""The command line as users run it: subcommands present, data check end to end."""

import os
import re
import subprocess
import sys
from pathlib import Path


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yolotrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_help_lists_every_command(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0
    # The sub-command choices line, e.g. "{train,val,...}", names every command exactly once.
    choices = re.search(r"\{([a-z,]+)\}", result.stdout)
    assert choices is not None, result.stdout
    assert choices.group(1).split(",") == ["train", "tune", "val", "predict", "track", "export", "data", "info",
                                          "doctor"]
    # Export's help (wrapped over lines up to the next command's) names every format it writes.
    export_help = " ".join(result.stdout.split("\n    export ", 1)[1].split("\n    data ", 1)[0].split())
    for fmt in ("ONNX", "OpenVINO", "LiteRT", "Core ML", "TensorRT", "TorchScript"):
        assert fmt in export_help


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


def test_data_check_of_class_folders_prints_their_classes_and_writes_a_labelled_preview(tmp_path):
    from yolotrain.data.classify import write_shape_crops

    crops = write_shape_crops(tmp_path / "crops", n_train=3, n_val=2)
    result = run_cli("data", "check", str(crops), "--out", "check", "--img", "64", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert re.search(r"^ +class +train +val$", result.stdout, re.M) and "rectangle" in result.stdout
    preview = tmp_path / "check" / "train_preview.png"
    assert preview.stat().st_size > 0 and (tmp_path / "check" / "class_counts.png").stat().st_size > 0


def test_a_missing_optional_package_is_one_line_naming_the_extra(tmp_path):
    """Running an export whose runtime is not installed (here onnxruntime, made unimportable in the process)."""
    (tmp_path / "model.onnx").write_bytes(b"not read: the runtime is looked for first")
    (tmp_path / "images").mkdir()
    program = ("import sys; sys.modules['onnxruntime'] = None; from yolotrain.cli import main; "
               "sys.exit(main(['predict', '--weights', 'model.onnx', '--source', 'images']))")
    result = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "yolotrain predict: error: running ONNX models needs 'onnxruntime' (pip install 'yolotrain[export]')"]
