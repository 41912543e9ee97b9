"""ONNX / TorchScript export: valid graphs, metadata, and onnxruntime/TorchScript agreeing with PyTorch."""

from __future__ import annotations

import argparse
import ast
import copy
import json

import pytest
import torch
from conftest import YOLOV5N_WEIGHTS

from yolotrain import Yolov5
from yolotrain.checkpoint import CheckpointError, save_checkpoint
from yolotrain.interop import OnnxModel, add_export_arguments, export, load_exported, run_export

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def named_model() -> Yolov5:
    """An untrained yolov5n for three named classes (ant, bee, cow) in eval mode: exports carry the names."""
    torch.manual_seed(0)
    detector = Yolov5("n", num_classes=3).eval()
    detector.names = ["ant", "bee", "cow"]
    return detector


def assert_matches(actual: torch.Tensor, detector: Yolov5, imgs: torch.Tensor) -> None:
    """The ONNX output agrees with the fused PyTorch model in float32, and is as close as PyTorch's own
    float32 output to the exact (float64) result.

    Scores agree to 1e-4 absolute. Boxes are in pixels: a trained head at 640 px puts PyTorch's float32
    boxes up to ~1e-3 px from the float64 ones, so a 1e-4 px agreement between two float32 runtimes is
    below float32 resolution. Instead, onnxruntime's boxes must be no further from the float64 result
    than twice PyTorch's own float32 rounding, and within 1e-4 + 1e-5 relative of PyTorch's.
    """
    model32 = fused(detector)
    model64 = copy.deepcopy(model32).double()
    with torch.no_grad():
        expected, exact = model32(imgs), model64(imgs.double())
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual[..., 4:], expected[..., 4:], atol=1e-4, rtol=0)
    torch.testing.assert_close(actual[..., :4], expected[..., :4], atol=1e-4, rtol=1e-5)
    torch_rounding = (expected.double() - exact)[..., :4].abs().max().item()
    onnx_error = (actual.double() - exact)[..., :4].abs().max().item()
    assert onnx_error <= 2 * torch_rounding, \
        f"onnxruntime boxes are {onnx_error:.2e} px from exact, PyTorch float32's {torch_rounding:.2e}"


def fused(detector: Yolov5) -> Yolov5:
    return copy.deepcopy(detector).fuse()


@pytest.mark.parametrize(("dynamic_size", "raw", "run_size"), [(False, False, (128, 128)), (True, False, (96, 160)),
                                                               (True, True, (160, 64))])
def test_onnx_export_runs_in_onnxruntime_like_torch(tmp_path, named_model, dynamic_size, raw, run_size):
    path = export(named_model, "onnx", out=tmp_path / "m.onnx", img_size=128, dynamic_size=dynamic_size, raw=raw)
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    assert max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) >= 17
    meta = {p.key: p.value for p in proto.metadata_props}
    assert json.loads(meta["class_names"]) == ["ant", "bee", "cow"] and meta["nc"] == "3"
    assert json.loads(meta["strides"]) == [8, 16, 32] and json.loads(meta["img_size"]) == [128, 128]
    # The reference's fields, as its DetectMultiBackend reads them: int(stride), a names literal
    assert int(meta["stride"]) == 32 and ast.literal_eval(meta["names"]) == {0: "ant", 1: "bee", 2: "cow"}
    assert named_model.model[0].bn.__class__ is torch.nn.BatchNorm2d  # the caller's model is not fused

    runner = OnnxModel(path)
    assert (runner.names, runner.num_classes, runner.stride.tolist()) == (["ant", "bee", "cow"], 3, [8, 16, 32])
    imgs = torch.rand(2, 3, *run_size)  # batch 2: the batch axis is dynamic
    actual = runner(imgs)
    assert_matches(actual, named_model, imgs)
    # Negative control: a box error of 1e-4 relative (a 0.01% anchor or stride mistake) fails.
    with pytest.raises(AssertionError):
        assert_matches(torch.cat((actual[..., :4] * (1 + 1e-4), actual[..., 4:]), -1), named_model, imgs)


def test_static_onnx_export_runs_batches_image_by_image_and_rejects_other_sizes(tmp_path, named_model):
    path = export(named_model, "onnx", out=tmp_path / "s.onnx", img_size=(64, 96), dynamic_batch=False, simplify=False)
    runner = OnnxModel(path)
    imgs = torch.rand(3, 3, 64, 96)
    actual = runner(imgs)
    assert actual.shape == (3, 3 * (8 * 12 + 4 * 6 + 2 * 3), 8)
    assert_matches(actual, named_model, imgs)
    with pytest.raises(ValueError, match=r"expects images of shape \[1, 3, 64, 96\]"):
        runner(torch.rand(1, 3, 96, 64))


def test_onnx_files_that_are_not_our_exports_get_one_line_errors(tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a protobuf at all")
    foreign = tmp_path / "foreign.onnx"
    value = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 32, 32])
    output = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 3, 32, 32])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "identity", [value], [output])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), str(foreign))
    for path, expected in [(tmp_path / "absent.onnx", "no such file"), (garbage, "not a loadable ONNX model"),
                           (foreign, "ONNX file without yolotrain metadata")]:
        with pytest.raises(CheckpointError) as info:
            OnnxModel(path)
        message = str(info.value)
        assert message.startswith(str(path)) and expected in message and "\n" not in message, message


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")
def test_torchscript_export_matches_and_carries_metadata(tmp_path, named_model):
    path = export(named_model, "torchscript", out=tmp_path / "m.torchscript", img_size=64)
    files = {"config.json": ""}
    scripted = torch.jit.load(str(path), _extra_files=files)
    assert json.loads(json.loads(files["config.json"])["class_names"]) == ["ant", "bee", "cow"]
    imgs = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(scripted(imgs), fused(named_model)(imgs), atol=1e-5, rtol=0)


def test_raw_torchscript_export_is_decoded_by_its_runtime(tmp_path, named_model):
    """Raw head maps out of the TorchScript graph, decoded by the runtime like the model's own output."""
    runner = load_exported(export(named_model, "torchscript", out=tmp_path / "raw.torchscript", img_size=64, raw=True),
                           trust_code=True)
    assert runner.raw and runner.input_shape == [1, 3, 64, 64]
    imgs = torch.rand(3, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(runner(imgs), fused(named_model)(imgs), atol=1e-4, rtol=0)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    return parser.parse_args(argv)


def test_cli_exports_our_checkpoint_and_reports_errors_in_one_line(tmp_path, named_model, capsys):
    save_checkpoint(tmp_path / "best", named_model)
    assert run_export(parse(["--weights", str(tmp_path / "best.json"), "--img-size", "64", "96"])) == 0
    written = tmp_path / "best.onnx"
    assert capsys.readouterr().out.strip() == str(written)
    assert OnnxModel(written).img_size == (64, 96)

    assert run_export(parse(["--weights", str(tmp_path / "absent.pt")])) == 1
    err = capsys.readouterr().err
    assert err.startswith("yolotrain export: error: ") and "absent.pt: no such file" in err and err.count("\n") == 1
    assert run_export(parse(["--weights", str(tmp_path / "best"), "--img-size", "100"])) == 1
    assert "multiples of 32" in capsys.readouterr().err


def test_official_yolov5n_exports_and_matches(tmp_path):
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"official weights not found at {YOLOV5N_WEIGHTS}")
    from yolotrain.interop import load_model
    path = export(YOLOV5N_WEIGHTS, "onnx", out=tmp_path / "yolov5n.onnx", img_size=320, dynamic_size=True)
    runner = OnnxModel(path)
    assert runner.names[:2] == ["person", "bicycle"] and runner.num_classes == 80
    detector = load_model(YOLOV5N_WEIGHTS)
    for size in (320, 640):
        imgs = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(size))
        assert_matches(runner(imgs), detector, imgs)
