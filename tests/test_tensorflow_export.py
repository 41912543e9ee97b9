"""TensorFlow exports (SavedModel folder, frozen GraphDef): converted by onnx2tf without any network access, run by
TensorFlow as PyTorch runs the model, through `val` and `predict` too, with the metadata other tools read, and what
they cannot do refused in one line."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
import yaml
from conftest import (
    assert_anchor_free_export_as_pytorch,
    assert_decodes_as_pytorch,
    assert_scores_and_predicts_as_pytorch,
    assert_segments_or_classifies_as_pytorch,
    detecting_yolov5n,
    network_refused,
    torch_output,
    untrained,
    yolov5_classifier,
    yolov5_segmenter,
)

from yolotrain.checkpoint import save_checkpoint
from yolotrain.data import generate_shapes_dataset
from yolotrain.interop import add_export_arguments, export, load_exported, run_export
from yolotrain.interop.formats import _tensorflow
from yolotrain.interop.trust import UntrustedModelError
from yolotrain.outputs import OutputExistsError

pytestmark = pytest.mark.skipif(_tensorflow.unavailable() is not None, reason="pip install 'yolotrain[tensorflow]'")

SIZE = 96
SUFFIX = {"saved_model": "_saved_model", "pb": ".pb"}
NAMES = ["circle", "rectangle"]


def export_parser():
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    return parser


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A random-init YOLOv5 detector whose objectness is biased up (so it detects), its exports to both formats
    (written with network connections refused in this process as in the converter's), and a shapes dataset."""
    model = detecting_yolov5n(NAMES)
    folder = tmp_path_factory.mktemp("tensorflow")
    data = generate_shapes_dataset(root=folder / "shapes", n_train=2, n_val=4, img_size=SIZE)
    paths = {}
    with network_refused():
        for fmt, suffix in SUFFIX.items():
            paths[fmt] = export(model, fmt, out=folder / f"model{suffix}", img_size=SIZE)
    return model, data / "data.yaml", paths


@pytest.mark.parametrize("fmt", list(SUFFIX))
def test_export_runs_in_tensorflow_like_torch(setup, fmt):
    model, _, paths = setup
    runtime = load_exported(paths[fmt], trust_code=True)
    assert (runtime.names, runtime.img_size, runtime.precision, runtime.end_to_end) == (NAMES, (SIZE, SIZE), "fp32",
                                                                                          False)
    assert_decodes_as_pytorch(runtime, model, SIZE)


@pytest.mark.parametrize("fmt", list(SUFFIX))
def test_val_and_predict_run_the_export_as_pytorch(setup, fmt):
    model, data, paths = setup
    # The graph is fixed at one size: val letterboxes square, PyTorch's side too.
    assert_scores_and_predicts_as_pytorch(model, paths[fmt], data, SIZE, trust_code=True)


def test_metadata_is_kept_with_the_model_for_us_and_for_ultralytics(setup):
    _, _, paths = setup
    folder = paths["saved_model"]
    assert {"saved_model.pb", "variables", "metadata.yaml", "yolotrain.json"} <= {p.name for p in folder.iterdir()}
    tools = yaml.safe_load((folder / "metadata.yaml").read_text(encoding="utf-8"))
    # What ultralytics' AutoBackend reads from a SavedModel folder.
    assert (tools["names"], tools["stride"], tools["imgsz"], tools["task"], tools["batch"]) == (
        {0: "circle", 1: "rectangle"}, 32, [SIZE, SIZE], "detect", 1)
    ours = json.loads((folder / "yolotrain.json").read_text(encoding="utf-8"))
    beside = json.loads(paths["pb"].with_name("model.pb.json").read_text(encoding="utf-8"))
    assert ours == beside and ours["producer"] == "yolotrain" and json.loads(ours["class_names"]) == NAMES


@pytest.mark.parametrize("fmt", list(SUFFIX))
def test_a_tensorflow_graph_loads_only_when_trusted(setup, fmt):
    """TensorFlow graphs are programs (their operations read and write files): refused unless trusted."""
    _, _, paths = setup
    with pytest.raises(UntrustedModelError, match="a TensorFlow graph is a program") as info:
        load_exported(paths[fmt])
    assert "\n" not in str(info.value) and "yolotrain export of" in str(info.value)


def test_the_conversion_refuses_to_download_its_image_sample(setup, tmp_path, monkeypatch):
    """onnx2tf fetches its image sample from GitHub when its working folder lacks it; the converter process refuses
    every connection, so an export without the sample fails (in one line, leaving nothing) instead of downloading."""
    model, _, _ = setup
    monkeypatch.setattr(_tensorflow, "SAMPLE_FILE", "not_what_onnx2tf_looks_for.npy")
    with pytest.raises(RuntimeError, match="network access is refused while converting to TensorFlow"):
        export(model, "pb", out=tmp_path / "model.pb", img_size=SIZE)
    assert list(tmp_path.iterdir()) == []


def test_the_sample_onnx2tf_checks_on_is_the_same_every_time():
    first, second = _tensorflow.sample_images(), _tensorflow.sample_images()
    assert first.shape == _tensorflow.SAMPLE_SHAPE and first.dtype == "float32"
    assert (first == second).all() and 0.0 <= first.min() < 0.2 and 0.8 < first.max() <= 1.0


def test_keras_writes_a_savedmodel_that_keras_loads_and_that_runs_like_torch(setup, tmp_path):
    """``--keras`` (the reference's): the SavedModel is written by Keras, so it loads again as a Keras model, which
    computes what PyTorch does; our runtime runs its serving signature as the plain SavedModel's."""
    import tf_keras

    model, _, _ = setup
    path = tmp_path / "keras_saved_model"
    assert run_export(export_parser().parse_args([
        "--weights", str(save_checkpoint(tmp_path / "best", model)), "--format", "saved_model", "--keras",
        "--img-size", str(SIZE), "--output", str(path)])) == 0
    imgs = torch.rand(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    expected = torch_output(model, imgs)
    keras_model = tf_keras.models.load_model(str(path))
    assert isinstance(keras_model, tf_keras.Model)
    actual = torch.cat([torch.from_numpy(keras_model(image.permute(1, 2, 0)[None].numpy()).numpy()) for image in imgs])
    torch.testing.assert_close(actual, expected, atol=1e-3, rtol=1e-5)
    torch.testing.assert_close(load_exported(path, trust_code=True)(imgs), expected, atol=1e-3, rtol=1e-5)
    refusal = r"^a Keras SavedModel \(--keras\) export is available for saved_model, not pb"
    with pytest.raises(ValueError, match=refusal):
        export(model, "pb", out=tmp_path / "model.pb", img_size=SIZE, keras=True)


@pytest.mark.parametrize(("options", "message"), [
    ({"half": True}, "fp16 (--half) export is available for coreml, engine, mnn, ncnn, onnx, openvino, tflite, "
                     "not saved_model"),
    ({"nms": True}, "NMS inside (--nms) export is available for onnx, openvino, not saved_model"),
    ({"raw": True}, "raw outputs (--raw) export is available for "),
])
def test_what_tensorflow_exports_cannot_do_is_one_line(setup, tmp_path, options, message):
    model, _, _ = setup
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        export(model, "saved_model", out=tmp_path / f"model{SUFFIX['saved_model']}", img_size=SIZE, **options)
    assert list(tmp_path.iterdir()) == []


def test_anchor_free_detector_export_gives_the_decoded_predictions_of_pytorch(tmp_path, capfd):
    """... and neither the conversion nor TensorFlow's loading and running print anything."""
    assert_anchor_free_export_as_pytorch("saved_model", tmp_path / "yolov8n_saved_model", SIZE, capfd)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", list(SUFFIX))
@pytest.mark.parametrize("build", [yolov5_segmenter, lambda: untrained("yolo11n-seg"), yolov5_classifier],
                         ids=["yolov5n-seg", "yolo11n-seg", "yolov5n-cls"])
def test_segmentation_and_classification_exports_give_the_outputs_of_pytorch(tmp_path, fmt, build):
    """Mask prototypes come out of TensorFlow channels-last and are turned back; logits are as they are."""
    model = build()
    size = 64 if model.task == "classify" else SIZE
    runtime = load_exported(export(model, fmt, out=tmp_path / f"model{SUFFIX[fmt]}", img_size=size), trust_code=True)
    assert_segments_or_classifies_as_pytorch(runtime, model, size)


@pytest.mark.slow
def test_the_same_model_converts_to_the_same_graph(setup, tmp_path):
    model, _, paths = setup
    again = export(model, "pb", out=tmp_path / "again.pb", img_size=SIZE)
    assert again.read_bytes() == paths["pb"].read_bytes()


def test_a_folder_that_is_not_an_earlier_export_is_never_replaced(setup, tmp_path):
    model, _, _ = setup
    mine = tmp_path / "photos_saved_model"
    mine.mkdir()
    (mine / "holiday.jpg").write_bytes(b"not a model")
    with pytest.raises(OutputExistsError, match="exists and is not an export to TensorFlow SavedModel"):
        export(model, "saved_model", out=mine, img_size=SIZE)
    with pytest.raises(ValueError, match="^saved_model output must end in _saved_model, got model$"):
        export(model, "saved_model", out=tmp_path / "model", img_size=SIZE)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["holiday.jpg", "photos_saved_model"]
