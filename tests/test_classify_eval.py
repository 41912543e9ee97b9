"""Classifier validation and prediction: accuracy equal to the reference's classify/val.py, per-class table,
confusion matrix, loss; top-5 predictions printed, saved and drawn."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import SHARED, YOLOV5N_WEIGHTS
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import yolotrain
from yolotrain.data.classify import build_classify_loaders, write_shape_crops
from yolotrain.eval.classify import ClassifyMetrics, accuracy_metrics
from yolotrain.interop import load_model
from yolotrain.model.classify import Classifier
from yolotrain.prediction.classify import ClassifyResult

COCO128_CLS = SHARED / "datasets" / "coco128-cls"


@pytest.fixture(scope="module")
def crops(tmp_path_factory) -> Path:
    return write_shape_crops(tmp_path_factory.mktemp("crops") / "shapes-cls", n_train=4, n_val=4)


def trained_like(model: Classifier) -> Classifier:
    """Non-trivial BatchNorm statistics, so the outputs depend on every tensor."""
    torch.manual_seed(0)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean = torch.randn_like(module.running_mean) * 0.1
            module.running_var = torch.rand_like(module.running_var) + 0.5
    return model.eval()


def test_accuracies_per_class_and_confusion_are_counted_from_the_top_k():
    top = torch.tensor([[0, 1, 2], [2, 1, 0], [1, 2, 0], [2, 0, 1]])
    labels = torch.tensor([0, 1, 1, 1])
    metrics = accuracy_metrics(top, labels, ["a", "b", "c"])
    assert (metrics.top1, metrics.top5) == (0.5, 1.0)
    assert metrics.images.tolist() == [1, 3, 0]
    np.testing.assert_allclose(metrics.class_top1[:2], [1.0, 1 / 3])
    assert np.isnan(metrics.class_top1[2])
    # Rows: predicted class; columns: true class.
    assert metrics.confusion.tolist() == [[1, 0, 0], [0, 1, 0], [0, 2, 0]]
    table = metrics.table()
    assert table.splitlines()[1].split() == ["all", "4", "0.5", "1"]
    assert table.splitlines()[-1].split() == ["b", "3", "0.333", "1"] and " c " not in table


@settings(max_examples=50, deadline=None)
@given(nc=st.integers(1, 12), n=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_accuracies_equal_the_reference_formula_on_any_logits(nc, n, seed):
    g = torch.Generator().manual_seed(seed)
    logits, labels = torch.randn(n, nc, generator=g), torch.randint(0, nc, (n,), generator=g)
    metrics = accuracy_metrics(logits.topk(min(5, nc), 1).indices, labels, [str(i) for i in range(nc)])
    # classify/val.py: argsort, then the first column and any of the first five.
    correct = (labels[:, None] == logits.argsort(1, descending=True)[:, :5]).float()
    assert metrics.top1 == pytest.approx(correct[:, 0].mean().item())
    assert metrics.top5 == pytest.approx(correct.max(1).values.mean().item())
    assert metrics.confusion.sum() == n and metrics.confusion.trace() == int(correct[:, 0].sum())
    assert metrics.images.tolist() == torch.bincount(labels, minlength=nc).tolist()


def test_val_dispatches_on_the_task_and_writes_its_plot(crops, tmp_path):
    model = trained_like(Classifier.from_name("yolov5n-cls", 2, ["circle", "rectangle"]))
    seen = []
    metrics = yolotrain.val(model, crops, img_size=64, batch_size=4, workers=0, save_dir=tmp_path / "run",
                            criterion=nn.CrossEntropyLoss(), callbacks={"on_val_end": seen.append})
    assert isinstance(metrics, ClassifyMetrics) and seen == [metrics]
    assert 0 <= metrics.top1 <= metrics.top5 == 1.0  # two classes: the top 5 always holds the truth
    assert metrics.images.sum() == sum(1 for _ in (crops / "val").rglob("*.png"))
    assert metrics.loss is not None and metrics.loss > 0
    assert (tmp_path / "run" / "confusion_matrix.png").stat().st_size > 0
    # The model given is not changed (val works on a fused copy).
    assert isinstance(model.model[0].bn, nn.BatchNorm2d)


def test_val_reads_the_model_classes_from_the_folder_names(crops, tmp_path):
    model = Classifier.from_name("yolov5n-cls", 3, ["circle", "rectangle", "triangle"]).eval()
    loader = build_classify_loaders(crops, 32, 8, splits=("val",), names=model.names, workers=0).val
    assert set(loader.dataset.labels.tolist()) == {0, 1}
    with pytest.raises(ValueError, match="class folder 'circle' is not one of the 2 classes"):
        yolotrain.val(Classifier.from_name("yolov5n-cls", 2, ["disc", "rectangle"]), crops, workers=0, verbose=False)
    with pytest.raises(ValueError, match="2 class folders for a model of 3 classes"):
        yolotrain.val(Classifier.from_name("yolov5n-cls", 3), crops, workers=0, verbose=False)


def test_predict_prints_saves_and_draws_the_top5(crops, tmp_path):
    model = trained_like(Classifier.from_name("yolov5n-cls", 2, ["circle", "rectangle"]))
    image = next((crops / "val" / "circle").glob("*.png"))
    save_dir = tmp_path / "out"
    results = yolotrain.predict(model, [image], img_size=64, save_dir=save_dir, save_txt=True)
    assert len(results) == 1 and isinstance(results[0], ClassifyResult)
    result = results[0]
    assert result.top5 == result.probs.argsort(descending=True).tolist() and result.top1 == result.top5[0]
    torch.testing.assert_close(result.probs.sum(), torch.tensor(1.0))
    lines = (save_dir / "labels" / f"{image.stem}.txt").read_text().splitlines()
    assert lines == [f"{result.probs[i]:.2f} {result.names[i]}" for i in result.top5]
    saved = json.loads((save_dir / "predictions.json").read_text())
    assert [e["name"] for e in saved[0]["top5"]] == [result.names[i] for i in result.top5]
    annotated = cv2.imread(str(save_dir / image.name))
    assert annotated.shape == cv2.imread(str(image)).shape
    assert not np.array_equal(annotated, cv2.imread(str(image)))
    with pytest.raises(ValueError, match="save_crop cuts out detected boxes: a classifier has none"):
        yolotrain.predict(model, [image], save_dir=tmp_path / "crops", save_crop=True)


def run_cli(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "yolotrain", *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.slow  # processes of their own: seconds of imports each
def test_val_and_predict_commands_take_a_classifier(crops, tmp_path):
    model = trained_like(Classifier.from_name("yolov5n-cls", 2, ["circle", "rectangle"]))
    torch.save(model.state_dict(), tmp_path / "cls.pt")
    table = run_cli("val", "--weights", str(tmp_path / "cls.pt"), "--data", str(crops), "--img", "64",
                    "--project", str(tmp_path / "val"))
    assert "top1_acc" in table and (tmp_path / "val" / "exp" / "confusion_matrix.png").is_file()
    image = next((crops / "val" / "rectangle").glob("*.png"))
    stdout = run_cli("predict", "--weights", str(tmp_path / "cls.pt"), "--source", str(image), "--img", "64",
                     "--project", str(tmp_path / "runs"))
    # A bare state dict carries no class names: they are numbered.
    assert f"{image}: 0 0." in stdout or f"{image}: 1 0." in stdout
    assert "1 images/frames classified" in stdout


REFERENCE_VAL = """
import functools, os, sys, json, torch
import numpy as np
np.trapz = getattr(np, 'trapz', None) or np.trapezoid
# The reference predates torch's weights-only default: its own checkpoint, written by this test, is trusted.
torch.load = functools.partial(torch.load, weights_only=False)
from yolov5.classify import val
top1, top5, _ = val.run(data=sys.argv[1], weights=sys.argv[2], batch_size=16, imgsz=224, device='cpu', workers=0,
                        verbose=False, project=sys.argv[3], name='exp')
from yolov5.utils.dataloaders import create_classification_dataloader
loader = create_classification_dataloader(os.path.join(sys.argv[1], 'val'), 224, 16, augment=False, workers=0,
                                          shuffle=False)
model = torch.load(sys.argv[2], map_location='cpu')['model'].float().eval()
with torch.no_grad():
    logits = torch.cat([model(x) for x, _ in loader])
torch.save(logits, sys.argv[4])
print(json.dumps([top1, top5]))
"""


@pytest.mark.slow
def test_accuracy_equals_the_reference_classify_val_on_coco128_cls(reference, tmp_path):
    """The reference's ClassificationModel (a yolov5n backbone, pretrained when the shared weights are there, and
    a random head) saved in its own checkpoint layout, evaluated by its classify/val.py and by ours."""
    if not (COCO128_CLS / "val").is_dir():
        pytest.skip(f"shared dataset not found at {COCO128_CLS}")
    config = Path(reference.__file__).parent / "models" / "yolov5n.yaml"
    detector = reference.models.yolo.DetectionModel(str(config))
    if YOLOV5N_WEIGHTS.is_file():
        detector.load_state_dict(load_model(YOLOV5N_WEIGHTS).state_dict())
    torch.manual_seed(0)
    names = sorted(p.name for p in (COCO128_CLS / "train").iterdir())
    theirs = reference.models.yolo.ClassificationModel(model=detector, nc=len(names))
    trained_like(theirs)
    theirs.names = dict(enumerate(names))
    weights = tmp_path / "yolov5n-cls.pt"
    torch.save({"model": copy.deepcopy(theirs), "ema": None, "epoch": 0}, weights)
    logits_path = tmp_path / "reference-logits.pt"
    out = subprocess.run([sys.executable, "-c", REFERENCE_VAL, str(COCO128_CLS), str(weights), str(tmp_path / "ref"),
                          str(logits_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    top1, top5 = json.loads(out.stdout.strip().splitlines()[-1])

    metrics = yolotrain.val(str(weights), COCO128_CLS, batch_size=16, workers=0, fuse=False, half=False)
    assert metrics.names == names
    assert (metrics.top1, metrics.top5) == pytest.approx((top1, top5), abs=1e-9)
    assert 0 < metrics.top1 < 1  # a discriminating model, not one class for every image
    # Image by image: the same inputs give the same logits.
    ours = load_model(weights)
    loader = build_classify_loaders(COCO128_CLS, 224, 16, splits=("val",), workers=0).val
    with torch.no_grad():
        logits = torch.cat([ours(x) for x, _ in loader])
    torch.testing.assert_close(logits, torch.load(logits_path), rtol=1e-5, atol=1e-5)
