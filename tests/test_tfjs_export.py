"""TF.js export (a ``*_web_model`` folder): our SavedModel converted by ``tensorflowjs_converter`` from an environment
of its own (``make`` installs it in .venv-tfjs), offline; run under Node by TF.js (``make`` installs the packages in
.node-tfjs) as PyTorch runs the model, through `val` and `predict` too, with the metadata other tools read, and what
is missing or broken said in one line."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import (
    assert_decodes_as_pytorch,
    assert_scores_and_predicts_as_pytorch,
    detecting_yolov5n,
    network_refused,
    torch_output,
    untrained,
    yolov5_classifier,
    yolov5_segmenter,
)

from yolotrain.checkpoint import CheckpointError, save_checkpoint
from yolotrain.data import generate_shapes_dataset
from yolotrain.interop import add_export_arguments, export, load_exported, run_export
from yolotrain.interop.formats import _tensorflow, tfjs

ROOT = Path(__file__).resolve().parents[1]
CONVERTER = Path(os.environ.get(tfjs.CONVERTER_ENV) or ROOT / ".venv-tfjs" / "bin" / "tensorflowjs_converter")
NODE_MODULES = Path(os.environ.get(tfjs.NODE_MODULES_ENV) or ROOT / ".node-tfjs" / "node_modules")

pytestmark = [
    pytest.mark.tfjs,
    pytest.mark.skipif(_tensorflow.unavailable() is not None, reason="pip install 'yolotrain[tensorflow]'"),
    pytest.mark.skipif(not CONVERTER.is_file(),
                       reason=f"no TF.js converter at {CONVERTER}: make .venv-tfjs/.installed"),
    pytest.mark.skipif(shutil.which("node") is None or not (NODE_MODULES / "@tensorflow" / "tfjs-core").is_dir(),
                       reason=f"no node, or no TF.js packages in {NODE_MODULES}: make .node-tfjs/.installed"),
]

SIZE = 96
NAMES = ["circle", "rectangle"]


@pytest.fixture(scope="module", autouse=True)
def tfjs_tools():
    """The converter and the Node packages the format's settings name."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(tfjs.CONVERTER_ENV, str(CONVERTER))
        patch.setenv(tfjs.NODE_MODULES_ENV, str(NODE_MODULES))
        yield


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tfjs_tools):
    """A random-init YOLOv5 detector whose objectness is biased up (so it detects), exported by the command line
    to TF.js (with network connections refused in this process as in the converter's), and a shapes dataset."""
    model = detecting_yolov5n(NAMES)
    folder = tmp_path_factory.mktemp("tfjs")
    data = generate_shapes_dataset(root=folder / "shapes", n_train=2, n_val=4, img_size=SIZE)
    weights = save_checkpoint(folder / "best", model)
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    with network_refused():
        assert run_export(parser.parse_args(["--weights", str(weights), "--format", "tfjs",
                                             "--img-size", str(SIZE)])) == 0
    return model, data / "data.yaml", folder / "best_web_model"


def test_export_runs_under_node_like_torch(setup):
    model, _, path = setup
    runtime = load_exported(path)  # TF.js runs tensor operations only: no trust asked
    assert (runtime.names, runtime.img_size, runtime.precision, runtime.end_to_end) == (NAMES, (SIZE, SIZE), "fp32",
                                                                                          False)
    assert runtime.backend == "wasm"
    assert_decodes_as_pytorch(runtime, model, SIZE)
    process = runtime._process
    runtime.close()
    assert process.poll() is not None  # the Node process ends with its model


def test_val_and_predict_run_the_export_as_pytorch(setup):
    model, data, path = setup
    # The graph is fixed at one size: val letterboxes square, PyTorch's side too.
    assert_scores_and_predicts_as_pytorch(model, path, data, SIZE)


def test_metadata_is_kept_with_the_model_for_us_and_for_ultralytics(setup):
    _, _, path = setup
    files = {p.name for p in path.iterdir()}
    assert {"model.json", "metadata.yaml", "yolotrain.json"} <= files and any(f.endswith(".bin") for f in files)
    graph = json.loads((path / "model.json").read_text(encoding="utf-8"))
    assert graph["format"] == "graph-model" and list(graph["signature"]["inputs"]) == ["images"]
    assert graph["signature"]["outputs"]["output0"]["tensorShape"]["dim"] == [{"size": "1"}, {"size": "567"},
                                                                               {"size": "7"}]
    tools = yaml.safe_load((path / "metadata.yaml").read_text(encoding="utf-8"))
    # What ultralytics reads from a web model folder.
    assert (tools["names"], tools["stride"], tools["imgsz"], tools["task"], tools["batch"]) == (
        {0: "circle", 1: "rectangle"}, 32, [SIZE, SIZE], "detect", 1)
    ours = json.loads((path / "yolotrain.json").read_text(encoding="utf-8"))
    assert ours["producer"] == "yolotrain" and json.loads(ours["class_names"]) == NAMES
    assert json.loads(ours["img_size"]) == [SIZE, SIZE]


def test_per_image_latency_under_node_is_small(setup):
    """One persistent Node process per model: an image costs its inference, not a start of Node."""
    _, _, path = setup
    runtime = load_exported(path)
    image = torch.rand(1, 3, SIZE, SIZE)
    runtime(image)
    start = time.perf_counter()
    for _ in range(5):
        runtime(image)
    assert (time.perf_counter() - start) / 5 < 1.0


def test_a_missing_converter_is_one_line_naming_its_environment(setup, tmp_path, monkeypatch):
    model, _, _ = setup
    monkeypatch.setenv(tfjs.CONVERTER_ENV, str(tmp_path / "no_converter"))
    with pytest.raises(ImportError, match="^[^\n]*$") as error:
        export(model, "tfjs", out=tmp_path / "model_web_model", img_size=SIZE)
    assert "tensorflowjs_converter" in str(error.value) and ".venv-tfjs" in str(error.value)
    assert list(tmp_path.iterdir()) == []


def test_missing_node_packages_are_one_line(setup, tmp_path, monkeypatch):
    _, _, path = setup
    monkeypatch.setenv(tfjs.NODE_MODULES_ENV, str(tmp_path))
    with pytest.raises(CheckpointError, match="^[^\n]*$") as error:
        load_exported(path)
    assert "@tensorflow/tfjs-core" in str(error.value) and tfjs.NODE_MODULES_ENV in str(error.value)


@pytest.mark.parametrize("damage", ["not json", "no graph", "missing weights"])
def test_a_broken_web_model_is_one_line(setup, tmp_path, damage):
    _, _, path = setup
    broken = shutil.copytree(path, tmp_path / "broken_web_model")
    graph = json.loads((broken / "model.json").read_text(encoding="utf-8"))
    if damage == "not json":
        (broken / "model.json").write_text("{ not json", encoding="utf-8")
    elif damage == "no graph":
        del graph["modelTopology"]
        (broken / "model.json").write_text(json.dumps(graph), encoding="utf-8")
    else:
        for shard in graph["weightsManifest"][0]["paths"]:
            (broken / shard).unlink()
    with pytest.raises(CheckpointError, match="^[^\n]*$") as error:
        load_exported(broken)
    assert str(broken) in str(error.value)


def test_the_converter_runs_offline(setup, tmp_path, monkeypatch):
    """The converter's process refuses every network connection (an export never downloads): a converter that
    tries one fails the export in one line, leaving nothing."""
    model, _, _ = setup
    converter = tmp_path / "tools" / "tensorflowjs_converter"
    converter.parent.mkdir()
    converter.write_text(f"#!{sys.executable}\nimport socket\nsocket.create_connection(('127.0.0.1', 9))\n",
                         encoding="utf-8")
    converter.chmod(0o755)
    monkeypatch.setenv(tfjs.CONVERTER_ENV, str(converter))
    # The SavedModel step is tested above; here it writes an empty folder so that the converter runs at once.
    monkeypatch.setattr(tfjs, "convert", lambda job, kind, output: output.mkdir())
    out = tmp_path / "out" / "model_web_model"
    out.parent.mkdir()
    with pytest.raises(RuntimeError, match="network access is refused while converting to TF.js"):
        export(model, "tfjs", out=out, img_size=SIZE)
    assert list(out.parent.iterdir()) == []


def test_a_failing_converter_is_one_line_from_the_command(setup, tmp_path, monkeypatch, capsys):
    """``yolotrain export`` names the converter that failed and the last line it printed, leaving nothing."""
    converter = tmp_path / "tools" / "tensorflowjs_converter"
    converter.parent.mkdir()
    converter.write_text(f"#!{sys.executable}\nimport sys\nprint('reading the SavedModel')\n"
                         "sys.exit('ValueError: Unsupported Ops in the model: FancyOp')\n", encoding="utf-8")
    converter.chmod(0o755)
    monkeypatch.setenv(tfjs.CONVERTER_ENV, str(converter))
    monkeypatch.setattr(tfjs, "convert", lambda job, kind, output: output.mkdir())
    weights = save_checkpoint(tmp_path / "out" / "best", detecting_yolov5n(NAMES))
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    capsys.readouterr()
    assert run_export(parser.parse_args(["--weights", str(weights), "--format", "tfjs", "--img-size",
                                         str(SIZE)])) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.splitlines()[-1] == (
        "yolotrain export: error: tensorflowjs_converter could not convert the SavedModel to TF.js (ValueError: "
        "Unsupported Ops in the model: FancyOp)")
    assert not [p for p in weights.parent.iterdir() if "web_model" in p.name]


@pytest.mark.slow
@pytest.mark.parametrize("build", [lambda: untrained("yolov8n"), yolov5_segmenter, lambda: untrained("yolo11n-seg"),
                                   yolov5_classifier], ids=["yolov8n", "yolov5n-seg", "yolo11n-seg", "yolov5n-cls"])
def test_anchor_free_segmentation_and_classification_exports_give_the_outputs_of_pytorch(tmp_path, build):
    """Mask prototypes come out of TF.js channels-last and are turned back; logits are as they are."""
    model = build()
    size = 64 if model.task == "classify" else SIZE
    runtime = load_exported(export(model, "tfjs", out=tmp_path / "model_web_model", img_size=size))
    assert (runtime.task, runtime.names) == (model.task, model.names)
    imgs = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(4))
    actual, expected = runtime(imgs), torch_output(model, imgs)
    actual = actual if isinstance(actual, tuple) else (actual,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert [a.shape for a in actual] == [e.shape for e in expected]
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=1e-3, rtol=1e-4)
