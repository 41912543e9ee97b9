"""Metrics: the matching rule, 101-point AP, per-class P/R, confusion matrix and the results table."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from yolotrain.eval.masks import mask_iou
from yolotrain.eval.metrics import (
    ConfusionMatrix,
    DetectionStats,
    SegmentationStats,
    ap_per_class,
    interpolated_ap,
    labelled_class_detections,
    match_by_iou,
    match_predictions,
)

THRESHOLDS = torch.tensor([0.5, 0.75])


def test_match_hand_case():
    gt = torch.tensor([[0.0, 0, 10, 10], [20, 20, 30, 30]])
    gt_cls = torch.tensor([0.0, 1.0])
    det = torch.tensor([[0.0, 0, 10, 8],     # IoU 0.8 with label 0, same class: TP at 0.5 and 0.75
                        [20, 20, 30, 26],    # IoU 0.6 with label 1 but wrong class: FP
                        [20, 20, 30, 27]])   # IoU 0.7 with label 1, same class: TP at 0.5 only
    det_cls = torch.tensor([0.0, 0.0, 1.0])
    correct = match_predictions(det, det_cls, gt, gt_cls, THRESHOLDS)
    assert correct.tolist() == [[True, True], [False, False], [True, False]]


def test_label_claimed_twice_goes_to_first_detection():
    gt = torch.tensor([[0.0, 0, 10, 10]])
    det = torch.tensor([[0.0, 0, 10, 6],     # higher score, IoU 0.6
                        [0.0, 0, 10, 10]])  # lower score, IoU 1.0
    correct = match_predictions(det, torch.zeros(2), gt, torch.zeros(1), THRESHOLDS)
    # At 0.5 both qualify and the first (highest-scoring) wins; at 0.75 only the second qualifies.
    assert correct.tolist() == [[True, False], [False, True]]


def test_match_without_labels_or_detections():
    assert match_predictions(torch.zeros(0, 4), torch.zeros(0), torch.ones(1, 4), torch.zeros(1)).shape == (0, 10)
    assert not match_predictions(torch.tensor([[0.0, 0, 1, 1]]), torch.zeros(1), torch.zeros(0, 4),
                                 torch.zeros(0)).any()


def test_interpolated_ap_hand_cases():
    # Perfect: precision 1 at every recall; the recall-1 sentinel precision of 0 costs half a step.
    assert interpolated_ap(np.array([0.5, 1.0]), np.array([1.0, 1.0]))[0] == pytest.approx(0.995)
    # Half the labels found, no false positive: 1 up to recall 0.5, then a ramp down to 0 at recall 1.
    assert interpolated_ap(np.array([0.5]), np.array([1.0]))[0] == pytest.approx(0.75)
    assert interpolated_ap(np.array([0.0]), np.array([0.0]))[0] == 0.0


def test_ap_per_class_hand_case():
    # Class 0: 2 labels, detections TP (0.9) and FP (0.8). Class 1: 1 label, missed entirely.
    tp = np.array([[1.0], [0.0]])
    res = ap_per_class(tp, np.array([0.9, 0.8]), np.array([0.0, 0.0]), np.array([0.0, 0.0, 1.0]))
    assert res.classes.tolist() == [0, 1]
    # Envelope: precision 1 up to recall 0.5, where the FP drops it to 0.5, then a ramp to 0 at recall 1:
    # 0.49 + (1 + 0.5) / 2 * 0.01 + 0.5 * 0.5 / 2 = 0.6225. The missed class scores 0.
    assert res.ap[:, 0].tolist() == pytest.approx([0.6225, 0.0])
    assert res.recall.tolist() == pytest.approx([0.5, 0.0], abs=1e-3)


def test_ap_per_class_matches_reference(reference, monkeypatch):
    from yolov5.utils import metrics as reference_metrics

    # The reference calls np.trapz, which numpy 2 removed in favour of the identical np.trapezoid.
    monkeypatch.setattr(np, "trapz", np.trapezoid, raising=False)
    rng = np.random.default_rng(0)
    n, nc = 4000, 6
    tp = rng.random((n, 10)) < np.linspace(0.7, 0.1, 10)
    conf = rng.random(n).astype(np.float32)
    pred_cls = rng.integers(0, nc, n).astype(np.float32)
    target_cls = rng.integers(0, nc - 1, 900).astype(np.float32)
    _, _, p, r, f1, ap, classes = reference_metrics.ap_per_class(tp, conf, pred_cls, target_cls,
                                                                  names={i: str(i) for i in range(nc)})
    ours = ap_per_class(tp.astype(np.float64), conf, pred_cls, target_cls)
    np.testing.assert_array_equal(ours.classes, classes)
    np.testing.assert_allclose(ours.ap, ap, atol=1e-12)
    np.testing.assert_allclose(ours.precision, p, atol=1e-12)
    np.testing.assert_allclose(ours.recall, r, atol=1e-12)


def test_detection_stats_and_table():
    stats = DetectionStats(nc=2)
    gt = torch.tensor([[0.0, 0, 10, 10], [20, 20, 40, 40]])
    dets = torch.tensor([[0.0, 0, 10, 10, 0.9, 0], [20, 20, 40, 40, 0.8, 1], [50, 50, 60, 60, 0.7, 1]])
    stats.update(dets, gt, torch.tensor([0.0, 1.0]))
    stats.update(torch.zeros(0, 6), torch.tensor([[0.0, 0, 5, 5]]), torch.tensor([1.0]))
    m = stats.compute(["cat", "dog"])
    assert m.images == 2
    assert m.instances.tolist() == [1, 2]
    assert m.ap50.tolist() == pytest.approx([0.995, 0.6225])  # see the two hand cases above
    assert m.map50 == pytest.approx((0.995 + 0.6225) / 2)
    lines = m.table().splitlines()
    assert lines[0].split() == ["Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95"]
    assert lines[1].split()[:3] == ["all", "2", "3"]
    assert [line.split()[0] for line in lines[2:]] == ["cat", "dog"]
    assert m.fitness() == pytest.approx(0.1 * m.map50 + 0.9 * m.map)


def test_no_true_positive_gives_zero_metrics():
    stats = DetectionStats(nc=1)
    stats.update(torch.tensor([[100.0, 100, 110, 110, 0.9, 0]]), torch.tensor([[0.0, 0, 10, 10]]), torch.zeros(1))
    m = stats.compute(["a"])
    assert (m.mp, m.mr, m.map50, m.map) == (0.0, 0.0, 0.0, 0.0)
    assert m.instances.tolist() == [1]


def test_confusion_matrix_hand_case():
    cm = ConfusionMatrix(nc=2, conf=0.25, iou=0.45)
    gt = torch.tensor([[0.0, 0, 10, 10], [20, 20, 30, 30], [50, 50, 60, 60]])
    gt_cls = torch.tensor([0, 1, 1])
    det = torch.tensor([[0.0, 0, 10, 10, 0.9, 0],     # correct class 0
                        [20, 20, 30, 30, 0.8, 0],     # label 1 predicted as 0
                        [80, 80, 90, 90, 0.7, 1],     # background false positive
                        [50, 50, 60, 60, 0.1, 1]])    # below conf: ignored, label 2 missed
    cm.update(det, gt, gt_cls)
    expected = np.zeros((3, 3), dtype=int)
    expected[0, 0] = 1  # predicted 0, true 0
    expected[0, 1] = 1  # predicted 0, true 1
    expected[2, 1] = 1  # missed label of class 1: background
    expected[1, 2] = 1  # class-1 detection on background
    np.testing.assert_array_equal(cm.matrix, expected)
    cm.update(torch.tensor([[0.0, 0, 5, 5, 0.9, 1]]), torch.zeros(0, 4), torch.zeros(0))
    assert cm.matrix[1, 2] == 2  # detections on an image without labels are background false positives


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mask_matching_is_the_reference_process_batch(reference, seed):
    """True positives from mask IoUs: the reference ``segment/val.py`` ``process_batch(masks=True)`` on
    overlapping random masks (many labels claimed twice, classes mixed)."""
    from yolov5.segment.val import process_batch

    from yolotrain.eval.metrics import IOU_THRESHOLDS

    g = torch.Generator().manual_seed(seed)
    m, n = 6, 25
    gt_masks = torch.zeros(m, 40, 40, dtype=torch.bool)
    corners = torch.randint(0, 25, (m, 2), generator=g)
    for k, (y, x) in enumerate(corners.tolist()):
        gt_masks[k, y:y + 15, x:x + 15] = True
    pick = torch.randint(0, m, (n,), generator=g)
    pred_masks = gt_masks[pick] ^ (torch.rand(n, 40, 40, generator=g) < 0.06)  # noisy copies
    gt_cls = torch.randint(0, 2, (m,), generator=g).float()
    dets = torch.cat((torch.zeros(n, 4), torch.rand(n, 1, generator=g).sort(0, descending=True)[0],
                      torch.randint(0, 2, (n, 1), generator=g).float()), 1)
    labels = torch.cat((gt_cls[:, None], torch.zeros(m, 4)), 1)
    expected = process_batch(dets, labels, IOU_THRESHOLDS, pred_masks.float(), gt_masks.float(), masks=True)
    ours = match_by_iou(mask_iou(gt_masks, pred_masks), dets[:, 5], gt_cls)
    assert expected.any() and torch.equal(ours, expected)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16), st.integers(0, 5), st.integers(0, 30), st.integers(1, 4))
def test_mask_stats_of_labelled_class_detections_only_are_those_of_all(seed, m, n, classes):
    """Masks given for the detections of the labels' classes only (``masked``) score the same true positives,
    bit for bit, as every detection's masks: the others' IoUs count as 0 whatever they are."""
    g = torch.Generator().manual_seed(seed)
    gt_masks = torch.rand(m, 12, 16, generator=g) > 0.5
    pred_masks = torch.rand(n, 12, 16, generator=g) > 0.5
    pred_masks[: n // 2] |= gt_masks[torch.randint(0, max(m, 1), (n // 2,), generator=g)] if m else False
    gt_cls = torch.randint(0, classes, (m,), generator=g).float()
    dets = torch.cat((torch.rand(n, 4, generator=g) * 10, torch.rand(n, 1, generator=g).sort(0, descending=True)[0],
                      torch.randint(0, classes + 1, (n, 1), generator=g).float()), 1)
    gt = torch.rand(m, 4, generator=g) * 10
    masked = labelled_class_detections(dets[:, 5], gt_cls)
    assert masked.tolist() == [c in gt_cls.tolist() for c in dets[:, 5].tolist()]
    every, kept = SegmentationStats(nc=classes + 1), SegmentationStats(nc=classes + 1)
    every.update_masks(dets, gt, gt_cls, pred_masks, gt_masks)
    kept.update_masks(dets, gt, gt_cls, pred_masks[masked], gt_masks, masked)
    assert torch.equal(every._mask_tp[0], kept._mask_tp[0])


def test_segmentation_stats_table_has_box_and_mask_columns():
    stats = SegmentationStats(nc=2)
    gt = torch.tensor([[0.0, 0, 10, 10], [20, 20, 40, 40]])
    dets = torch.tensor([[0.0, 0, 10, 10, 0.9, 0], [20, 20, 40, 40, 0.8, 1]])
    gt_masks = torch.zeros(2, 12, 12, dtype=torch.bool)
    gt_masks[0, :3, :3], gt_masks[1, 5:10, 5:10] = True, True
    pred_masks = gt_masks.clone()
    pred_masks[1] = False  # the second detection's box is right, its mask is empty
    stats.update_masks(dets, gt, torch.tensor([0.0, 1.0]), pred_masks, gt_masks)
    m = stats.compute(["cat", "dog"])
    assert m.map50 == pytest.approx(0.995) and m.masks.map50 == pytest.approx(0.995 / 2)
    lines = m.table().splitlines()
    assert lines[0].split() == ["Class", "Images", "Instances", "Box(P", "R", "mAP50", "mAP50-95)", "Mask(P", "R",
                                "mAP50", "mAP50-95)"]
    assert lines[3].split()[0] == "dog" and float(lines[3].split()[-2]) == 0.0 and float(lines[3].split()[5]) > 0.9
    assert m.as_dict()["mask_mAP50"] == pytest.approx(m.masks.map50)
    assert m.fitness() == pytest.approx(0.1 * (m.map50 + m.masks.map50) + 0.9 * (m.map + m.masks.map))
