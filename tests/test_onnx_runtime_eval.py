"""`val` and `predict` accept an exported ONNX file and run it through onnxruntime."""

import pytest
import torch

pytest.importorskip("onnxruntime", reason="needs the export extra: pip install 'yolotrain[export]'")

from yolotrain import Yolov5, export, predict, val  # noqa: E402
from yolotrain.data import generate_shapes_dataset  # noqa: E402


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2, names=["circle", "rectangle"]).eval()
    # Objectness biases up so an untrained model still produces detections to compare.
    with torch.no_grad():
        for conv in model.head.m:
            conv.bias.view(3, 7)[:, 4].add_(6.0)
    folder = tmp_path_factory.mktemp("onnx")
    path = export(model, "onnx", out=folder / "model.onnx", img_size=96, dynamic_size=True)
    data = generate_shapes_dataset(root=folder / "shapes", n_train=2, n_val=6, img_size=96)
    return model, path, data


def test_val_on_onnx_equals_val_on_torch(exported):
    model, path, data = exported
    ours = val(model, str(data / "data.yaml"), img_size=96, batch_size=4, workers=0, verbose=False)
    onnx = val(str(path), str(data / "data.yaml"), img_size=96, batch_size=4, workers=0, verbose=False)
    for a, b in ((ours.mp, onnx.mp), (ours.mr, onnx.mr), (ours.map50, onnx.map50), (ours.map, onnx.map)):
        assert a == pytest.approx(b, abs=1e-3)


def test_predict_on_onnx_equals_predict_on_torch(exported):
    model, path, data = exported
    images = sorted((data / "images" / "val").iterdir())[:3]
    ours = predict(model, images, img_size=96, conf=0.3)
    onnx = predict(path, images, img_size=96, conf=0.3)
    assert sum(len(r.boxes) for r in ours) > 0
    for a, b in zip(ours, onnx):
        assert b.names == ["circle", "rectangle"]
        assert len(a.boxes) == len(b.boxes)
        torch.testing.assert_close(b.boxes, a.boxes, atol=0.05, rtol=1e-4)
        assert torch.equal(a.classes, b.classes)
