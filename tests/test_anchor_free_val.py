"""Anchor-free validation against ultralytics 8.4, the oracle, on the same weights and data: the letterboxed
batches, the decoded predictions after NMS per image, and P, R, mAP50, mAP50-95 of the whole split (a segmentation
model's for its boxes and its masks), and the scoring rules that make them equal (greedy matching, PR curves ending
at the last recall, boxes compared in input pixels: :data:`yolotrain.eval.metrics.ULTRALYTICS_SCORING`).

The models (yolov8n, yolov8n-seg) give detections that depend on the image (see :func:`input_sensitive_model`)
and the labels are drawn from their own detections, moved and re-classed, so that every IoU threshold and both
classes have true and false positives: mAPs far from 0 and from 1, where a difference in decoding, NMS or scoring
shows. Training one on the shapes dataset to that point takes far longer than a test may on two CPU cores.
"""

import dataclasses
import importlib
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import offline_ultralytics

import yolotrain
from yolotrain.data import generate_shapes_dataset
from yolotrain.eval.metrics import (
    IOU_THRESHOLDS,
    SCORING_RULES,
    ULTRALYTICS_SCORING,
    YOLOV5_SCORING,
    interpolated_ap,
    match_by_iou,
)
from yolotrain.eval.slicing import SlicedDetector
from yolotrain.eval.tta import AugmentedDetector, EnsembleDetector
from yolotrain.eval.val import build_val_loader, scoring_rules
from yolotrain.family import nms_iou
from yolotrain.model import Yolov5
from yolotrain.model.anchor_free import AnchorFreeYolo
from yolotrain.nms import non_max_suppression
from yolotrain.prediction import Predictor

IMG_SIZE = 128
# The oracle's val settings (cfg/default.yaml: conf 0.001 for val, iou 0.7, max_det 300), given to both sides.
CONF, IOU, MAX_DET = 0.001, 0.7, 300
NAMES = ["circle", "rectangle"]
# The shapes images are IMG_SIZE square, so neither side resizes them (the oracle resizes with INTER_LINEAR, the
# YOLOv5 loading ours follows with INTER_AREA) and both letterbox them into the same rectangular batch: the oracle's
# val builds its dataset with rect=True and pad=0.5 (models/yolo/detect/val.py, data/build.py), as ours does
# with rect=True: ceil(128 / 32 + 0.5) * 32 = 160 px, the image centred with 16 px of grey around it.
BATCH_HW = (160, 160)


@pytest.fixture(scope="module")
def ultralytics(tmp_path_factory):
    """ultralytics, offline, its settings file in a temporary folder."""
    with offline_ultralytics(tmp_path_factory) as ultralytics_module:
        yield ultralytics_module


@dataclasses.dataclass
class Case:
    """Our model and the oracle's with the same weights, a shapes val split labelled from the model's detections,
    its data YAML (``path: .``) and a copy with the absolute path the oracle needs, and a folder for its runs."""

    name: str
    ours: AnchorFreeYolo
    reference: torch.nn.Module
    data: Path
    reference_data: Path
    runs: Path

    @property
    def segments(self) -> bool:
        return self.name.endswith("-seg")


def input_sensitive_model(name: str, seed: int = 0) -> AnchorFreeYolo:
    """A 2-class ``name`` (yolov8n, yolov8n-seg) whose boxes, scores and masks vary with the image, untrained.

    At PyTorch's default initialisation the activations shrink layer by layer, so an untrained model gives the same
    tiny, low-scoring boxes for every image (and a few epochs on two CPU cores do not change that). He-normal
    convolutions keep the features alive; the box branch's last biases put the distance distributions' peak at 2
    cells (boxes of about 4 cells) and its weights scaled up let the image move them; class logits start at 0 so
    scores spread around 0.5, above any val threshold. A segmentation model's first prototype is raised (about 4
    everywhere) and every mask's first coefficient starts at 1, so its masks cover most of their boxes, with holes
    where the other prototypes say so.
    """
    torch.manual_seed(seed)
    model = AnchorFreeYolo(name, num_classes=len(NAMES), names=NAMES)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Conv2d) and module.weight.requires_grad:  # not the fixed DFL weights
                module.weight.normal_(0, math.sqrt(2 / module.weight[0].numel()))
        peak = -0.5 * (torch.arange(model.head.reg_max, dtype=torch.float32) - 2) ** 2
        for box, cls in zip(model.head.cv2, model.head.cv3):
            box[-1].weight.mul_(3)
            box[-1].bias.copy_(peak.repeat(4))
            cls[-1].weight.mul_(20)
            cls[-1].bias.zero_()
        if model.num_masks:
            model.head.proto.cv3.bn.bias[0] = 4.0
            for coefficients in model.head.cv4:
                coefficients[-1].bias.zero_()
                coefficients[-1].bias[0] = 1.0
    return model.eval()


def decoded(model: torch.nn.Module, imgs: torch.Tensor, segments: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A model's decoded predictions (ours: [B, N, 5+nc+nm]; the oracle's: [B, 4+nc+nm, N]) and prototypes."""
    with torch.no_grad():
        output = model(imgs)
    if isinstance(output, (tuple, list)) and not isinstance(output[0], torch.Tensor):  # the oracle's eval output
        output = output[0]
    return (output[0], output[1]) if segments else (output[0] if isinstance(output, (tuple, list)) else output, None)


def write_labels_from_detections(case_name: str, model: AnchorFreeYolo, root: Path, seed: int = 0) -> None:
    """Replace the val labels by each image's 3 best detections of each class (conf 0.25, IoU 0.5), every side
    moved by up to about 10% of the box's size and one label in five given the other class; a segmentation
    dataset's as the boxes' outlines (polygons of 4 corners)."""
    rng = np.random.default_rng(seed)
    segments = case_name.endswith("-seg")
    loader = build_val_loader(root / "data.yaml", nc=len(NAMES), img_size=IMG_SIZE, batch_size=8, workers=0)
    dataset = loader.dataset
    pad = (BATCH_HW[0] - IMG_SIZE) // 2
    first = 0
    for batch in loader:
        predictions, _ = decoded(model, batch.imgs, segments)
        dets = non_max_suppression(predictions, conf=0.25, iou=0.5, multi_label=True, num_extra=model.num_masks)
        for i, det in enumerate(dets):
            det = torch.cat([det[det[:, 5] == c][:3] for c in range(len(NAMES))])
            boxes = (det[:, :4].numpy() - pad).clip(0, IMG_SIZE)
            sizes = np.tile(boxes[:, 2:] - boxes[:, :2], 2)
            boxes = (boxes + rng.normal(0, 0.08, boxes.shape) * sizes).clip(0, IMG_SIZE) / IMG_SIZE
            classes = det[:, 5].numpy().astype(int)
            classes = np.where(rng.random(len(classes)) < 0.2, 1 - classes, classes)
            keep = ((boxes[:, 2:] - boxes[:, :2]) * IMG_SIZE > 2).all(1)
            if segments:
                x1, y1, x2, y2 = boxes[keep].T
                values = np.stack((x1, y1, x2, y1, x2, y2, x1, y2), 1)
            else:
                values = np.concatenate(((boxes[keep, :2] + boxes[keep, 2:]) / 2, boxes[keep, 2:] - boxes[keep, :2]), 1)
            rows = [f"{c} " + " ".join(f"{v:.6f}" for v in row) for c, row in zip(classes[keep], values)]
            label = root / "labels" / "val" / f"{Path(dataset.im_files[first + i]).stem}.txt"
            label.write_text("".join(f"{row}\n" for row in rows))
        first += len(dets)


@pytest.fixture(scope="module", params=["yolov8n", "yolov8n-seg"])
def case(request, ultralytics, tmp_path_factory) -> Case:
    from ultralytics.nn.tasks import DetectionModel, SegmentationModel

    name = request.param
    source = generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=1, n_val=12, img_size=IMG_SIZE)
    root = tmp_path_factory.mktemp("labelled") / "shapes"
    shutil.copytree(source, root)
    ours = input_sensitive_model(name)
    write_labels_from_detections(name, ours, root)
    for cache in root.rglob("*.cache"):
        cache.unlink()
    builder = SegmentationModel if name.endswith("-seg") else DetectionModel
    reference = builder(f"{name}.yaml", nc=len(NAMES), verbose=False)
    reference.load_state_dict(ours.state_dict())  # strict: the same names and shapes
    reference.names = dict(enumerate(NAMES))
    config = yaml.safe_load((root / "data.yaml").read_text())
    reference_data = root / "reference.yaml"
    reference_data.write_text(yaml.safe_dump({**config, "path": str(root)}))
    return Case(name, ours, reference.eval(), root / "data.yaml", reference_data, tmp_path_factory.mktemp("runs"))


def reference_validator(case: Case, batch_size: int):
    from ultralytics.models.yolo.detect import DetectionValidator
    from ultralytics.models.yolo.segment import SegmentationValidator

    validator = SegmentationValidator if case.segments else DetectionValidator
    # plots=False: nothing drawn, so no font is fetched; quantize unset: float32, as ours runs with half=False.
    return validator(args=dict(data=str(case.reference_data), imgsz=IMG_SIZE, batch=batch_size, conf=CONF, iou=IOU,
                               max_det=MAX_DET, rect=True, plots=False, device="cpu", project=str(case.runs),
                               name="val", exist_ok=True, mode="val", task="segment" if case.segments else "detect"))


def test_batches_and_detections_after_nms_are_the_oracles(case):
    """Per image: the letterboxed input and the decoded predictions after NMS (boxes to 1e-3 px, scores to 1e-5,
    a segmentation model's mask coefficients and prototypes to 1e-4)."""
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.utils.nms import non_max_suppression as reference_nms

    validator = reference_validator(case, batch_size=4)
    validator.data = check_det_dataset(str(case.reference_data))
    validator.stride, validator.device, validator.args.workers = 32, torch.device("cpu"), 0
    reference_batch = validator.preprocess(next(iter(validator.get_dataloader(validator.data["val"], 4))))
    batch = next(iter(build_val_loader(case.data, nc=len(NAMES), img_size=IMG_SIZE, batch_size=4, workers=0)))
    imgs = batch.imgs  # float, 0 to 1
    assert imgs.shape[2:] == BATCH_HW
    # The same 8-bit pixels; the two scale them to 0..1 with different float32 roundings.
    assert torch.equal((imgs * 255).round(), (reference_batch["img"] * 255).round())
    predictions, protos = decoded(case.ours, imgs, case.segments)
    expected_predictions, expected_protos = decoded(case.reference, imgs, case.segments)
    if case.segments:
        torch.testing.assert_close(protos, expected_protos, atol=1e-4, rtol=0)
    kept = non_max_suppression(predictions, CONF, IOU, multi_label=True, max_det=MAX_DET,
                               num_extra=case.ours.num_masks)
    expected = reference_nms(expected_predictions, CONF, IOU, multi_label=True, max_det=MAX_DET, nc=len(NAMES))
    for ours_image, reference_image in zip(kept, expected):
        assert 10 < len(ours_image) == len(reference_image)
        torch.testing.assert_close(ours_image[:, :4], reference_image[:, :4], atol=1e-3, rtol=0)
        torch.testing.assert_close(ours_image[:, 4], reference_image[:, 4], atol=1e-5, rtol=0)
        assert torch.equal(ours_image[:, 5], reference_image[:, 5])
        torch.testing.assert_close(ours_image[:, 6:], reference_image[:, 6:], atol=1e-4, rtol=0)


def our_val(case: Case) -> dict[str, float]:
    """Our P, R, mAP50 and mAP50-95 of the split (a segmentation model's: of the boxes, then ``mask P`` ...)."""
    metrics = yolotrain.val(case.ours, case.data, img_size=IMG_SIZE, batch_size=8, conf=CONF, iou=IOU,
                            max_det=MAX_DET, rect=True, device="cpu", workers=0, half=False, plots=False,
                            verbose=False)
    found = {"P": metrics.mp, "R": metrics.mr, "mAP50": metrics.map50, "mAP50-95": metrics.map}
    if case.segments:
        masks = metrics.masks
        found.update({"mask P": masks.mp, "mask R": masks.mr, "mask mAP50": masks.map50, "mask mAP50-95": masks.map})
    return found


@pytest.fixture(scope="module")
def oracle_metrics(case) -> dict[str, float]:
    """The oracle's numbers of :func:`our_val`, its model given as a module (both fold BatchNorm into the
    convolutions)."""
    validator = reference_validator(case, batch_size=8)
    validator(model=case.reference)
    box = validator.metrics.box
    found = {"P": box.mp, "R": box.mr, "mAP50": box.map50, "mAP50-95": box.map}
    if case.segments:
        masks = validator.metrics.seg
        found.update({"mask P": masks.mp, "mask R": masks.mr, "mask mAP50": masks.map50, "mask mAP50-95": masks.map})
    return {key: float(value) for key, value in found.items()}


def test_val_metrics_are_the_oracles(case, oracle_metrics):
    """P, R, mAP50 and mAP50-95 of the split (boxes, and masks), to 3 decimals, with the oracle's val settings on
    both sides."""
    found = our_val(case)
    assert 0.05 < oracle_metrics["mAP50-95"] < oracle_metrics["mAP50"] < 0.95
    if case.segments:
        assert 0.01 < oracle_metrics["mask mAP50-95"] < oracle_metrics["mask mAP50"] < 0.95
    for key, expected in oracle_metrics.items():
        assert found[key] == pytest.approx(expected, abs=5e-4), key


@pytest.mark.parametrize("rule", ["greedy_matching", "drop_at_last_recall", "input_pixels"])
def test_each_scoring_rule_of_the_oracle_changes_these_metrics(case, oracle_metrics, rule, monkeypatch):
    """Without any one of the oracle's scoring rules (YOLOv5's in its place) the metrics are no longer the
    oracle's: what the anchor-free family's ``scoring`` selects is needed, rule by rule, to equal them."""
    rules = dataclasses.replace(ULTRALYTICS_SCORING, **{rule: False})
    monkeypatch.setitem(SCORING_RULES, "ultralytics", rules)
    found = our_val(case)
    assert any(abs(found[key] - expected) > 5e-4 for key, expected in oracle_metrics.items())


@pytest.mark.parametrize("seed", range(4))
def test_greedy_matching_is_the_oracles(ultralytics, seed, tmp_path):
    """Crowded labels of two classes (several detections overlapping several labels): the oracle's
    match_predictions, detection by detection and threshold by threshold."""
    from ultralytics.models.yolo.detect import DetectionValidator

    generator = torch.Generator().manual_seed(seed)
    m, n = 6, 40
    iou = (torch.rand(m, n, generator=generator) * 1.2 - 0.2).clamp(min=0)
    iou[:, ::3] = 0  # some detections overlap nothing
    gt_cls = torch.randint(0, 2, (m,), generator=generator).float()
    det_cls = torch.randint(0, 2, (n,), generator=generator).float()
    validator = DetectionValidator(save_dir=tmp_path, args=dict(plots=False))
    expected = validator.match_predictions(det_cls, gt_cls, iou)
    found = match_by_iou(iou, det_cls, gt_cls, IOU_THRESHOLDS, greedy=True)
    assert torch.equal(found, expected)


def test_greedy_matching_gives_a_detection_the_next_free_label():
    """The second detection's best label went to the first: the oracle's rule gives it the other one (IoU 0.7), where
    YOLOv5's counts it a false positive."""
    iou = torch.tensor([[0.9, 0.8], [0.6, 0.7]])
    classes = torch.zeros(2)
    greedy = match_by_iou(iou, classes, classes, IOU_THRESHOLDS, greedy=True)
    assert greedy[1].tolist() == (IOU_THRESHOLDS <= 0.7).tolist()
    assert not match_by_iou(iou, classes, classes, IOU_THRESHOLDS)[1].any()


def test_pr_curves_end_as_the_oracles(ultralytics):
    from ultralytics.utils.metrics import compute_ap

    recall = np.array([0.1, 0.2, 0.2, 0.4, 0.55])
    precision = np.array([1.0, 0.9, 0.7, 0.6, 0.5])
    ap, envelope, recalls = interpolated_ap(recall, precision, drop_at_last_recall=True)
    expected_ap, expected_envelope, expected_recalls = compute_ap(recall, precision)
    assert ap == pytest.approx(expected_ap, abs=1e-12)
    np.testing.assert_array_equal(envelope, expected_envelope)
    np.testing.assert_array_equal(recalls, expected_recalls)
    assert interpolated_ap(recall, precision)[0] > ap + 0.1  # YOLOv5's line to (1, 0) adds area


def test_anchor_free_models_are_scored_by_the_oracles_rules_also_when_composed():
    anchor_free, yolov5 = AnchorFreeYolo("yolov8n", num_classes=2), Yolov5("n", num_classes=2)
    assert scoring_rules(anchor_free) == ULTRALYTICS_SCORING
    assert scoring_rules(yolov5) == YOLOV5_SCORING
    assert scoring_rules(AugmentedDetector(anchor_free)) == ULTRALYTICS_SCORING
    assert scoring_rules(EnsembleDetector([AugmentedDetector(anchor_free)])) == ULTRALYTICS_SCORING
    assert scoring_rules(SlicedDetector(anchor_free, 64, 0.2)) == ULTRALYTICS_SCORING


def test_the_nms_iou_not_given_is_the_model_familys_also_when_composed():
    anchor_free, yolov5 = AnchorFreeYolo("yolov8n", num_classes=2), Yolov5("n", num_classes=2)
    for model in (anchor_free, AugmentedDetector(anchor_free), SlicedDetector(anchor_free, 64, 0.2)):
        assert (nms_iou(None, model, "val"), nms_iou(None, model, "predict")) == (0.7, 0.7)  # Ultralytics' val/predict
    assert (nms_iou(None, yolov5, "val"), nms_iou(None, yolov5, "predict")) == (0.6, 0.45)  # YOLOv5's val.py/detect.py
    assert nms_iou(0.5, anchor_free, "val") == nms_iou(0.5, yolov5, "predict") == 0.5
    assert Predictor(anchor_free, img_size=64).iou == 0.7 and Predictor(yolov5, img_size=64).iou == 0.45
    assert Predictor(anchor_free, img_size=64, iou=0.5).iou == 0.5


@pytest.mark.parametrize(("arch", "given", "used"), [("yolov8n", None, 0.7), ("yolov5n", None, 0.6),
                                                     ("yolov8n", 0.55, 0.55)])
def test_val_suppresses_with_the_model_familys_iou_unless_given(tmp_path, monkeypatch, arch, given, used):
    # val suppresses through the task's NMS (detection's: non_max_suppression)
    detect_evaluation = importlib.import_module("yolotrain.tasks.detect.evaluate")
    seen = []

    def recording_nms(prediction, conf, iou, *args, **kwargs):
        seen.append(iou)
        return non_max_suppression(prediction, conf, iou, *args, **kwargs)

    monkeypatch.setattr(detect_evaluation, "non_max_suppression", recording_nms)
    data = generate_shapes_dataset(root=tmp_path / "shapes", n_train=1, n_val=2, img_size=64)
    model = AnchorFreeYolo(arch, num_classes=2) if arch == "yolov8n" else Yolov5("n", num_classes=2)
    yolotrain.val(model, data, img_size=64, batch_size=2, iou=given, plots=False, verbose=False, workers=0)
    assert seen and set(seen) == {used}
