"""Our exports in other tools: the reference's ``DetectMultiBackend`` (and so its ``val.py``) and ultralytics'
``AutoBackend`` read their metadata (``stride`` the largest stride, ``names`` ``{index: name}``; ultralytics'
``task``, ``imgsz``, ``batch``, ``args`` too) from each format where they look for it, and the reference's
``val.py`` scores our ONNX and OpenVINO exports as ``yolotrain val`` does."""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import sys
import types
import zipfile

import numpy as np
import pytest
import torch
from conftest import YOLOV5N_WEIGHTS, coco128_subset

from yolotrain.eval import val
from yolotrain.interop import export
from yolotrain.interop.backends import load_exported
from yolotrain.interop.formats import REGISTRY, export_metadata_of
from yolotrain.interop.formats.tflite import append_metadata

pytest.importorskip("onnxruntime")
IMG_SIZE = 320
# As in test_eval_val: the reference puts its val labels half a pixel off the letterboxed pixels when the
# padding is odd, which moves IoUs at the strict thresholds a little.
TOLERANCE, MAP50_95_TOLERANCE = 0.002, 0.004
OPENVINO = pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="pip install 'yolotrain[openvino]'")
NCNN = pytest.mark.skipif(importlib.util.find_spec("pnnx") is None or importlib.util.find_spec("ncnn") is None,
                          reason="pip install 'yolotrain[ncnn]'")
EXECUTORCH = pytest.mark.skipif(importlib.util.find_spec("executorch") is None,
                                reason="pip install 'yolotrain[executorch]'")
MNN = pytest.mark.skipif(importlib.util.find_spec("MNN") is None, reason="pip install 'yolotrain[mnn]'")
NAMES = ["circle", "rectangle"]


def _give_reference_openvino_runtime(monkeypatch) -> None:
    """The reference imports ``Core``, ``Layout`` and ``get_batch`` from ``openvino.runtime``, an alias OpenVINO
    2026 dropped (they are the package's own), and compiles for the CPU's default precision: bf16 on CPUs that
    have it, where ours compiles a float32 export in float32. This stand-in gives them, compiling in float32."""
    import openvino

    class Float32Core(openvino.Core):
        def compile_model(self, model, device_name="CPU", config=None):
            return super().compile_model(model, device_name, {"INFERENCE_PRECISION_HINT": "f32", **(config or {})})

    runtime = types.ModuleType("openvino.runtime")
    runtime.Core, runtime.Layout, runtime.get_batch = Float32Core, openvino.Layout, openvino.get_batch
    monkeypatch.setitem(sys.modules, "openvino.runtime", runtime)


def _export_where_tools_look(weights, fmt: str, folder, **options):
    """Export ``fmt`` as the tools lay it out, and the path they load: OpenVINO as a ``*_openvino_model``
    folder (the only OpenVINO path the reference accepts)."""
    if fmt == "openvino":
        export(weights, fmt, out=folder / "model_openvino_model" / "model.xml", **options)
        return folder / "model_openvino_model"
    return export(weights, fmt, out=folder / f"model{REGISTRY[fmt].suffix}", **options)


@pytest.mark.parametrize("fmt", ["onnx", pytest.param("openvino", marks=OPENVINO), "torchscript"])
def test_reference_and_ultralytics_read_our_metadata(fmt, model, reference, monkeypatch, tmp_path):
    from yolov5.models.common import DetectMultiBackend

    if fmt == "openvino":
        _give_reference_openvino_runtime(monkeypatch)
    model.names = NAMES
    loaded = _export_where_tools_look(model, fmt, tmp_path, img_size=(192, 256))

    backend = DetectMultiBackend(str(loaded), device=torch.device("cpu"))
    assert (backend.stride, dict(backend.names)) == (32, dict(enumerate(NAMES)))
    assert backend(torch.zeros(1, 3, 192, 256)).shape == (1, 3 * (24 * 32 + 12 * 16 + 6 * 8), 5 + len(NAMES))
    ultralytics = _ultralytics_view(loaded)
    assert (ultralytics.stride, ultralytics.names, ultralytics.task) == (32, dict(enumerate(NAMES)), "detect")
    # A free batch alone is not ultralytics' `dynamic` (batch and image size both free).
    assert (ultralytics.imgsz, ultralytics.batch, ultralytics.end2end, ultralytics.dynamic) == ([192, 256], 1, False,
                                                                                                 False)


@OPENVINO
def test_openvino_folder_metadata_only_in_a_folder_of_one_model(model, tmp_path):
    """Every OpenVINO export gets the reference's ``NAME.yaml``; ultralytics' ``metadata.yaml``, one per folder,
    is written only into a ``*_openvino_model`` folder holding no other IR."""
    model.names = NAMES
    export(model, "openvino", out=tmp_path / "plain" / "a.xml", img_size=64)
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == ["a.bin", "a.xml", "a.yaml"]
    shared = tmp_path / "shared_openvino_model"
    export(model, "openvino", out=shared / "a.xml", img_size=64)
    model.names = ["x", "y"]
    export(model, "openvino", out=shared / "b.xml", img_size=64)
    assert sorted(p.name for p in shared.iterdir()) == ["a.bin", "a.xml", "a.yaml", "b.bin", "b.xml", "b.yaml",
                                                        "metadata.yaml"]
    assert _ultralytics_view(shared / "a.xml").names == dict(enumerate(NAMES))  # a's, not replaced by b's


@pytest.mark.parametrize(("fmt", "files"), [
    pytest.param("ncnn", ["metadata.yaml", "model.ncnn.bin", "model.ncnn.json", "model.ncnn.param"], marks=NCNN),
    pytest.param("executorch", ["metadata.yaml", "model.pte", "model.pte.json"], marks=EXECUTORCH),
])
def test_ultralytics_reads_our_model_folder_and_we_run_it(model, tmp_path, fmt, files):
    """An NCNN or ExecuTorch export into a ``*_ncnn_model`` / ``*_executorch_model`` folder (ultralytics' layout: the
    folder is the model) carries ultralytics' ``metadata.yaml``; ours travels in the JSON file beside the model."""
    model.names = NAMES
    spec = REGISTRY[fmt]
    path = export(model, fmt, out=tmp_path / f"model_{fmt}_model" / f"model{spec.suffix}", img_size=(64, 96))
    assert sorted(p.name for p in path.parent.iterdir()) == files
    view = _ultralytics_view(path.parent)
    assert (view.stride, view.names, view.task, view.imgsz) == (32, dict(enumerate(NAMES)), "detect", [64, 96])
    runtime = load_exported(path)
    assert (runtime.names, runtime.img_size, runtime.precision) == (NAMES, (64, 96), "fp32")
    imgs = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = copy.deepcopy(model).eval().fuse()(imgs)  # the module's model stays unfused
    torch.testing.assert_close(runtime(imgs), expected, atol=1e-3, rtol=1e-4)


@MNN
def test_ultralytics_reads_our_mnn_metadata_and_we_run_it(model, tmp_path):
    """An MNN export's bizCode is the JSON of our metadata and of the fields ultralytics' MNN backend applies."""
    pytest.importorskip("ultralytics")
    from ultralytics.nn.autobackend import check_class_names
    from ultralytics.nn.backends.base import BaseBackend

    from yolotrain.interop.formats.mnn import MnnModel, read_metadata

    model.names = NAMES
    path = export(model, "mnn", out=tmp_path / "model.mnn", img_size=(64, 96))
    runtime = load_exported(path)
    assert isinstance(runtime, MnnModel) and (runtime.names, runtime.img_size) == (NAMES, (64, 96))
    # What ultralytics' MNN backend does with the model's info (nn/backends/mnn.py), on the same bizCode.
    view = types.SimpleNamespace(dynamic=False, metadata={})
    BaseBackend.apply_metadata(view, json.loads(runtime.net.get_info()["bizCode"]))
    assert (view.stride, check_class_names(view.names), view.task, view.imgsz) == (32, dict(enumerate(NAMES)),
                                                                                   "detect", [64, 96])
    assert read_metadata(path)["producer"] == "yolotrain"  # read as data, without the engine
    imgs = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = copy.deepcopy(model).eval().fuse()(imgs)
    torch.testing.assert_close(runtime(imgs), expected, atol=1e-3, rtol=1e-4)


def _ultralytics_view(path) -> types.SimpleNamespace:
    """What ultralytics' backends take from an export's metadata, read and applied as they do it."""
    pytest.importorskip("ultralytics")
    from ultralytics.nn.autobackend import check_class_names
    from ultralytics.nn.backends.base import BaseBackend

    view = types.SimpleNamespace(dynamic=False, metadata={})
    metadata = BaseBackend.read_metadata(path)
    assert metadata, f"ultralytics found no metadata in {path}"
    BaseBackend.apply_metadata(view, metadata)
    view.names = check_class_names(view.names)
    return view


def test_ultralytics_reads_nms_and_free_axes_from_onnx(model, tmp_path):
    model.names = NAMES
    dynamic = export(model, "onnx", out=tmp_path / "dynamic.onnx", img_size=64, dynamic_size=True)
    assert _ultralytics_view(dynamic).dynamic is True
    end_to_end = export(model, "onnx", out=tmp_path / "nms.onnx", img_size=64, nms=True, dynamic_batch=False)
    view = _ultralytics_view(end_to_end)
    assert (view.end2end, view.dynamic) == (True, False)


def test_litert_archive_reads_in_the_reference_ultralytics_and_ours(model, tmp_path):
    """The archive appended to a LiteRT flatbuffer (checked on a stand-in flatbuffer: the converter is optional)."""
    from yolotrain.interop.exporting.exporter import export_metadata, interop_metadata

    model.names = NAMES
    path = tmp_path / "model.tflite"
    path.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(64))
    metadata = export_metadata(model, (64, 64), False, False, False)
    append_metadata(path, metadata, interop_metadata(model, (64, 64), False, False))
    with zipfile.ZipFile(path) as archive:  # the reference reads the first entry as a Python literal
        first = ast.literal_eval(archive.read(archive.namelist()[0]).decode())
    assert (int(first["stride"]), first["names"]) == (32, dict(enumerate(NAMES)))
    view = _ultralytics_view(path)
    assert (view.stride, view.names, view.imgsz, view.task) == (32, dict(enumerate(NAMES)), [64, 64], "detect")
    assert export_metadata_of(path, REGISTRY["tflite"]) == metadata


def test_exports_before_the_tools_fields_still_load(model, tmp_path):
    """An ONNX export written before the tools' fields: ``stride`` a JSON list, ``names`` a JSON list."""
    import onnx

    model.names = NAMES
    path = export(model, "onnx", out=tmp_path / "model.onnx", img_size=64)
    proto = onnx.load(str(path))
    old = {entry.key: entry.value for entry in proto.metadata_props}
    old.update(stride=old.pop("strides"), names=old.pop("class_names"))
    for key in ("task", "imgsz", "batch", "args"):
        del old[key]
    del proto.metadata_props[:]
    for key, value in old.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(proto, str(path))
    assert json.loads(export_metadata_of(path, REGISTRY["onnx"])["stride"]) == [8, 16, 32]
    runner = load_exported(path)
    assert (runner.names, runner.stride.tolist(), runner.size_multiple) == (NAMES, [8, 16, 32], 32)


@pytest.mark.parametrize("fmt", ["onnx", pytest.param("openvino", marks=OPENVINO)])
def test_reference_val_reads_and_scores_our_export(fmt, reference, coco128, monkeypatch, tmp_path):
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"official weights not found at {YOLOV5N_WEIGHTS}")
    import yolov5.utils.general as general
    import yolov5.val as reference_val

    if fmt == "openvino":
        _give_reference_openvino_runtime(monkeypatch)
    loaded = _export_where_tools_look(YOLOV5N_WEIGHTS, fmt, tmp_path, img_size=IMG_SIZE)
    data = coco128_subset(tmp_path / "data", 16, coco128)
    monkeypatch.setattr(np, "trapz", np.trapezoid, raising=False)  # removed in numpy 2, same function
    monkeypatch.setattr(general, "check_font", lambda *a, **k: None)  # would download a font
    monkeypatch.setattr(general, "time", types.SimpleNamespace(time=lambda: 0.0))  # no NMS time limit
    (_, _, ref_map50, ref_map, *_), _, _, _ = reference_val.run(
        data=str(data), weights=str(loaded), imgsz=IMG_SIZE, batch_size=1, device="cpu", workers=0,
        plots=False, half=False, project=str(tmp_path), name="ref")
    ours_file = loaded / "model.xml" if fmt == "openvino" else loaded
    ours = val(ours_file, data, img_size=IMG_SIZE, device="cpu", workers=0, half=False, plots=False,
               save_dir=tmp_path / "ours", verbose=False, reduced_decode=False)
    assert ref_map50 > 0.2  # it read the file's classes and strides: a misread scores about nothing
    assert abs(ours.map50 - ref_map50) <= TOLERANCE, (ours.map50, ref_map50)
    assert abs(ours.map - ref_map) <= MAP50_95_TOLERANCE, (ours.map, ref_map)
