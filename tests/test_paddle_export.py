"""PaddlePaddle exports (a ``*_paddle_model`` folder): converted by X2Paddle in a child process that refuses every
network connection, run by ``paddle.inference`` as PyTorch runs the model, through `val` and `predict` too, with
the metadata other tools read, and what they cannot do refused in one line."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
import warnings

import numpy as np
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
    offline_ultralytics,
    torch_output,
    untrained,
    yolov5_classifier,
    yolov5_segmenter,
)

from yolotrain import predict, val
from yolotrain.checkpoint import CheckpointError
from yolotrain.data import generate_shapes_dataset
from yolotrain.interop import export, load_exported
from yolotrain.interop.formats import paddle
from yolotrain.interop.trust import UntrustedModelError
from yolotrain.outputs import OutputExistsError

# `make test` runs these in a pytest process of their own: Paddle crashes in a process that loaded TensorFlow or
# coremltools (other tests load both).
pytestmark = [pytest.mark.paddle,
              pytest.mark.skipif(paddle.unavailable() is not None, reason="pip install 'yolotrain[paddle]'")]

SIZE = 96
NAMES = ["circle", "rectangle"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A random-init YOLOv5 detector whose objectness is biased up (so it detects), its export (written with network
    connections refused in this process as in the converter's), and a shapes dataset."""
    model = detecting_yolov5n(NAMES)
    folder = tmp_path_factory.mktemp("paddle")
    data = generate_shapes_dataset(root=folder / "shapes", n_train=2, n_val=4, img_size=SIZE)
    with network_refused():
        path = export(model, "paddle", out=folder / "model_paddle_model", img_size=SIZE)
    return model, data / "data.yaml", path


@pytest.mark.parametrize("clashing", sorted(paddle.CLASHING_MODULES))
def test_a_process_that_loaded_a_clashing_library_gets_one_line_instead_of_a_crash(setup, clashing):
    """Paddle's native library crashes the process (a segmentation fault) as it loads after TensorFlow's or Core ML
    tools': loading a Paddle model there stops in one line instead."""
    if importlib.util.find_spec(clashing) is None:
        pytest.skip(f"{clashing} is not installed")
    _, _, path = setup
    # yolotrain (torch, torchvision) first, as in any yolotrain process: TensorFlow loaded before them crashes their
    # import instead.
    script = (f"import sys\nfrom yolotrain.interop import load_exported\nimport {clashing}\n"
              "try:\n    load_exported(sys.argv[1], trust_code=True)\nexcept ImportError as error:\n"
              "    sys.exit(f'error: {error}')\n")
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]  # coremltools loads TensorFlow too where it is installed
    loaded = line.removeprefix("error: PaddlePaddle cannot be loaded into a process that has loaded ").split(" (")[0]
    assert clashing in loaded.split(", ") and line.endswith(
        " (its native library crashes there): run the Paddle model in a process of its own")


def test_export_runs_in_paddle_like_torch(setup):
    model, _, path = setup
    runtime = load_exported(path, trust_code=True)
    assert (runtime.names, runtime.img_size, runtime.precision, runtime.end_to_end) == (NAMES, (SIZE, SIZE), "fp32",
                                                                                          False)
    assert_decodes_as_pytorch(runtime, model, SIZE)


def test_val_and_predict_run_the_export_as_pytorch(setup):
    model, data, path = setup
    # The graph is fixed at one size: val letterboxes square, PyTorch's side too.
    assert_scores_and_predicts_as_pytorch(model, path, data, SIZE, trust_code=True)


def test_the_folder_is_laid_out_for_us_and_for_ultralytics(setup):
    _, _, path = setup
    assert sorted(p.relative_to(path).as_posix() for p in path.rglob("*")) == [
        "inference_model", "inference_model/model.json", "inference_model/model.pdiparams", "metadata.yaml"]
    # X2Paddle's generated code and pickled parameters stay behind, and no other JSON file joins the program:
    # ultralytics' AutoBackend takes the folder's first *.json for it.
    tools = yaml.safe_load((path / "metadata.yaml").read_text(encoding="utf-8"))
    # What ultralytics' AutoBackend reads from a *_paddle_model folder.
    assert (tools["names"], tools["stride"], tools["imgsz"], tools["task"], tools["batch"]) == (
        {0: "circle", 1: "rectangle"}, 32, [SIZE, SIZE], "detect", 1)
    ours = tools["yolotrain"]  # ours, under a key of its own
    assert ours["producer"] == "yolotrain" and json.loads(ours["class_names"]) == NAMES
    assert paddle.read_metadata(path) == ours


def test_ultralytics_finds_the_program_and_reads_the_metadata(setup, tmp_path_factory):
    """What ultralytics' PaddleBackend takes from the folder: the first ``*.json`` and ``*.pdiparams`` under it
    (nn/backends/paddle.py), and the metadata applied as its backends apply it. (Its own run of the program stops in
    Paddle 3.3's oneDNN, which it leaves on; it pins Paddle below 3.3.)"""
    _, _, path = setup
    with offline_ultralytics(tmp_path_factory):
        from ultralytics.nn.autobackend import check_class_names
        from ultralytics.nn.backends.base import BaseBackend

        view = types.SimpleNamespace(dynamic=False, metadata={})
        BaseBackend.apply_metadata(view, BaseBackend.read_metadata(path))
    assert next(path.rglob("*.json")) == path / "inference_model" / "model.json"
    assert next(path.rglob("*.pdiparams")) == path / "inference_model" / "model.pdiparams"
    assert (view.stride, check_class_names(view.names), view.task, view.imgsz, view.batch) == (
        32, dict(enumerate(NAMES)), "detect", [SIZE, SIZE], 1)


def test_a_paddle_program_loads_only_when_trusted(setup):
    """A Paddle program's operators include ones that write and read files: refused unless trusted."""
    _, _, path = setup
    with pytest.raises(UntrustedModelError, match="a Paddle program's operators can write and read files") as info:
        load_exported(path)
    assert "\n" not in str(info.value) and "yolotrain export of" in str(info.value)


def test_the_converter_process_refuses_the_report_x2paddle_sends_home(tmp_path):
    """X2Paddle reports each conversion to Baidu unless told not to; should it ever try, the converter's process
    refuses the connection (the report, sent as X2Paddle sends it, reaches no socket)."""
    probe = f"""
import runpy, socket
converter = runpy.run_path({str(paddle._CONVERTER)!r}, run_name="probe")
converter["block_network"]()
tried = []
refuse = socket.getaddrinfo
def record(*args, **kwargs):
    tried.append(args[0])
    return refuse(*args, **kwargs)
socket.getaddrinfo = record
from x2paddle.utils import ConverterCheck
ConverterCheck(task="PyTorch", time_info=0, convert_state="Start").run()
try:
    socket.create_connection(("127.0.0.1", 9))
except OSError as error:
    print(error)
print(tried)
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    refused, tried = done.stdout.strip().splitlines()[-2:]
    assert refused == "network access is refused while converting to PaddlePaddle"
    assert tried == "['paddlepaddle.org.cn']"  # X2Paddle's statistics server: tried, and refused


@pytest.mark.parametrize("damage", ["program", "weights", "missing weights", "foreign metadata"])
def test_a_damaged_model_is_one_line(setup, tmp_path, damage):
    _, _, path = setup
    broken = tmp_path / "broken_paddle_model"
    broken.mkdir()
    (broken / "inference_model").mkdir()
    tools = yaml.safe_load((path / "metadata.yaml").read_text(encoding="utf-8"))
    if damage == "foreign metadata":  # another program's export: ultralytics' fields alone
        del tools["yolotrain"]
    (broken / "metadata.yaml").write_text(yaml.safe_dump(tools), encoding="utf-8")
    for name in ("model.json", "model.pdiparams"):
        content = (path / "inference_model" / name).read_bytes()
        if damage.removeprefix("missing ") == ("program" if name.endswith(".json") else "weights"):
            if damage.startswith("missing"):
                continue
            content = content[: len(content) // 2]
        (broken / "inference_model" / name).write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        load_exported(broken, trust_code=True)(torch.zeros(1, 3, SIZE, SIZE))
    assert str(info.value).startswith(str(broken)) and "\n" not in str(info.value)


@pytest.mark.parametrize(("options", "message"), [
    ({"half": True}, "fp16 (--half) export is available for "),
    ({"nms": True}, "NMS inside (--nms) export is available for onnx, openvino, not paddle"),
    ({"raw": True}, "raw outputs (--raw) export is available for "),
])
def test_what_paddle_exports_cannot_do_is_one_line(setup, tmp_path, options, message):
    model, _, _ = setup
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        export(model, "paddle", out=tmp_path / "model_paddle_model", img_size=SIZE, **options)
    assert list(tmp_path.iterdir()) == []


def test_anchor_free_detector_export_gives_the_decoded_predictions_of_pytorch(tmp_path, capfd):
    """... and neither the conversion nor Paddle's loading and running print anything."""
    assert_anchor_free_export_as_pytorch("paddle", tmp_path / "yolov8n_paddle_model", SIZE, capfd)


@pytest.mark.parametrize("build", [yolov5_segmenter, lambda: untrained("yolo11n-seg"), yolov5_classifier],
                         ids=["yolov5n-seg", "yolo11n-seg", "yolov5n-cls"])
def test_segmentation_and_classification_exports_give_the_outputs_of_pytorch(tmp_path, build):
    """Mask prototypes come out as the second output, in PyTorch's layout; logits are as they are."""
    model = build()
    size = 64 if model.task == "classify" else SIZE
    path = export(model, "paddle", out=tmp_path / "model_paddle_model", img_size=size)
    runtime = load_exported(path, trust_code=True)
    assert_segments_or_classifies_as_pytorch(runtime, model, size)


def test_pose_export_gives_the_keypoints_of_pytorch_and_scores_them_as_pytorch(tmp_path):
    """The keypoint decoding (aten::unflatten, which the converter teaches X2Paddle) comes out as PyTorch's, and
    val and predict on the export give PyTorch's keypoints. The validation labels are PyTorch's own three best
    predictions per image, so its keypoints score high and a difference of the export's shows in the scores."""
    model = untrained("yolov8n-pose", kpt_shape=(4, 3))
    root = generate_shapes_dataset(root=tmp_path / "shapes", n_train=2, n_val=4, img_size=SIZE, labels="pose")
    path = export(model, "paddle", out=tmp_path / "pose_paddle_model", img_size=SIZE)
    runtime = load_exported(path, trust_code=True)
    assert (runtime.task, runtime.kpt_shape, runtime.names) == ("pose", (4, 3), model.names)
    imgs = torch.rand(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(5))
    actual, expected = runtime(imgs), torch_output(model, imgs)
    assert actual.shape == expected.shape == (2, 189, 5 + 2 + 4 * 3)
    torch.testing.assert_close(actual[..., 4:7], expected[..., 4:7], atol=1e-4, rtol=0)  # objectness 1, scores
    torch.testing.assert_close(actual[..., :4], expected[..., :4], atol=1e-3, rtol=1e-5)  # pixels
    torch.testing.assert_close(actual[..., 7:], expected[..., 7:], atol=1e-3, rtol=1e-5)  # x, y pixels, visibility
    images = sorted((root / "images" / "val").iterdir())
    expected_results = predict(model, images, img_size=SIZE, conf=0.5, max_det=3, half=False)
    for image, result in zip(images, expected_results):
        # class, box and keypoints; each keypoint labelled visible (2) in place of its visibility score, and the
        # detection's score dropped
        rows = [" ".join("2" if i > 5 and i % 3 == 1 else v for i, v in enumerate(line.split()[:-1]))
                for line in result.yolo_lines()]
        (root / "labels" / "val" / f"{image.stem}.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    # val keeps what predict kept (its threshold and NMS)
    options = {"img_size": SIZE, "batch_size": 4, "workers": 0, "conf": 0.5, "iou": 0.45, "max_det": 3,
               "verbose": False, "plots": False}
    ours = val(model, str(root / "data.yaml"), rect=False, half=False, **options)
    theirs = val(str(path), str(root / "data.yaml"), trust_code=True, **options)
    assert ours.keypoints.map > 0.5
    assert (theirs.map, theirs.map50, theirs.keypoints.map, theirs.keypoints.map50) == (
        pytest.approx(ours.map, abs=1e-3), pytest.approx(ours.map50, abs=1e-3),
        pytest.approx(ours.keypoints.map, abs=1e-3), pytest.approx(ours.keypoints.map50, abs=1e-3))
    actual_results = predict(path, images, img_size=SIZE, conf=0.5, max_det=3, trust_code=True)
    assert sum(len(r.boxes) for r in expected_results) > 0
    for a, b in zip(expected_results, actual_results):
        assert len(b.boxes) == len(a.boxes) and torch.equal(a.classes, b.classes)
        torch.testing.assert_close(b.boxes, a.boxes, atol=0.05, rtol=1e-4)
        np.testing.assert_allclose(b.keypoints, a.keypoints, atol=0.05, rtol=1e-4)


@pytest.mark.parametrize(("shape", "dim", "sizes"), [((1, 12, 5), 1, (4, 3)), ((1, 6, 4, 5), 1, (2, 3)),
                                                   ((1, 3, 8), -1, (2, -1)), ((1, 3, 4, 6), -2, (2, 2))],
                         ids=["pose-rows", "middle", "last-inferred", "from-the-end"])
def test_the_converter_splits_a_side_as_pytorch_unflattens_it(tmp_path, shape, dim, sizes):
    """aten::unflatten, which X2Paddle 1.6 lacks, translated for any side, counted from either end, with a size
    left to infer (-1), whichever sides follow."""
    class Split(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(2.0))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.unflatten(dim, sizes) * self.scale

    example = torch.rand(shape, generator=torch.Generator().manual_seed(6))
    traced = tmp_path / "split.torchscript"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
        torch.jit.save(torch.jit.trace(Split(), example), str(traced))
    converted = tmp_path / "converted"
    done = subprocess.run([sys.executable, str(paddle._CONVERTER), str(traced), ",".join(map(str, shape)),
                           str(converted)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    inference = paddle.paddle_inference()
    model = converted / paddle.MODEL_FOLDER
    config = inference.Config(str(model / paddle.PROGRAM_FILE), str(model / paddle.WEIGHTS_FILE))
    config.disable_gpu()
    predictor = inference.create_predictor(config)
    given = predictor.get_input_handle(predictor.get_input_names()[0])
    given.reshape(list(shape))
    given.copy_from_cpu(example.numpy())
    predictor.run()
    actual = predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()
    expected = example.unflatten(dim, sizes) * 2
    assert actual.shape == tuple(expected.shape)
    np.testing.assert_allclose(actual, expected.numpy(), rtol=1e-6, atol=0)


def test_a_folder_that_is_not_an_earlier_export_is_never_replaced(setup, tmp_path):
    model, _, _ = setup
    mine = tmp_path / "photos_paddle_model"
    mine.mkdir()
    (mine / "holiday.jpg").write_bytes(b"not a model")
    with pytest.raises(OutputExistsError, match="exists and is not an export to PaddlePaddle"):
        export(model, "paddle", out=mine, img_size=SIZE)
    with pytest.raises(ValueError, match="^paddle output must end in _paddle_model, got model$"):
        export(model, "paddle", out=tmp_path / "model", img_size=SIZE)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["holiday.jpg", "photos_paddle_model"]
