"""Our exports in the reference's own tools: its ``val.py`` (``DetectMultiBackend``) reads the metadata of
our ONNX files (``stride`` as the largest stride, ``names`` as a ``{index: name}`` literal) and scores them
as ``yolotrain val`` does."""

from __future__ import annotations

import types

import numpy as np
import pytest
from conftest import YOLOV5N_WEIGHTS, coco128_subset

from yolotrain.eval import val
from yolotrain.interop import export

pytest.importorskip("onnxruntime")
IMG_SIZE = 320
# As in test_eval_val: the reference puts its val labels half a pixel off the letterboxed pixels when the
# padding is odd, which moves IoUs at the strict thresholds a little.
TOLERANCE, MAP50_95_TOLERANCE = 0.002, 0.004


def test_reference_val_reads_and_scores_our_onnx_export(reference, coco128, monkeypatch, tmp_path):
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"official weights not found at {YOLOV5N_WEIGHTS}")
    import yolov5.utils.general as general
    import yolov5.val as reference_val

    onnx_file = export(YOLOV5N_WEIGHTS, "onnx", out=tmp_path / "yolov5n.onnx", img_size=IMG_SIZE)
    data = coco128_subset(tmp_path / "data", 16, coco128)
    monkeypatch.setattr(np, "trapz", np.trapezoid, raising=False)  # removed in numpy 2, same function
    monkeypatch.setattr(general, "check_font", lambda *a, **k: None)  # would download a font
    monkeypatch.setattr(general, "time", types.SimpleNamespace(time=lambda: 0.0))  # no NMS time limit
    (_, _, ref_map50, ref_map, *_), _, _, _ = reference_val.run(
        data=str(data), weights=str(onnx_file), imgsz=IMG_SIZE, batch_size=1, device="cpu", workers=0,
        plots=False, half=False, project=str(tmp_path), name="ref")
    ours = val(onnx_file, data, img_size=IMG_SIZE, device="cpu", workers=0, half=False, plots=False,
               save_dir=tmp_path / "ours", verbose=False)
    assert ref_map50 > 0.2  # it read the file's classes and strides: a misread scores about nothing
    assert abs(ours.map50 - ref_map50) <= TOLERANCE, (ours.map50, ref_map50)
    assert abs(ours.map - ref_map) <= MAP50_95_TOLERANCE, (ours.map, ref_map)
