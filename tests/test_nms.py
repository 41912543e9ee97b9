"""Post-processing: score filtering, class-aware NMS, limits, and mapping boxes to original pixels."""

import types

import pytest
import torch
import torchvision.ops as nms_ops
from hypothesis import given, settings
from hypothesis import strategies as st

from yolotrain import nms as nms_module
from yolotrain.boxes import xywh_to_xyxy
from yolotrain.nms import MAX_WH, PER_CLASS_NMS_FROM, non_max_suppression, scale_boxes_to_original


def rows(*boxes, nc=3):
    """Decoded rows from (cx, cy, w, h, obj, cls, cls_prob) tuples: one class probability set per row."""
    out = torch.zeros(1, len(boxes), 5 + nc)
    for i, (cx, cy, w, h, obj, cls, p) in enumerate(boxes):
        out[0, i, :5] = torch.tensor([cx, cy, w, h, obj])
        out[0, i, 5 + cls] = p
    return out


def test_no_boxes_gives_empty_tensors_per_image():
    pred = torch.zeros(2, 50, 8)
    pred[..., 4] = 0.1  # all objectness below conf
    out = non_max_suppression(pred, conf=0.25)
    assert len(out) == 2
    assert all(o.shape == (0, 6) for o in out)
    assert non_max_suppression(torch.zeros(1, 0, 8))[0].shape == (0, 6)


def test_score_is_objectness_times_class_probability():
    pred = rows((50, 50, 20, 20, 0.2, 0, 1.0),   # objectness below conf: dropped
                (150, 50, 20, 20, 0.9, 1, 0.2),  # objectness passes, score 0.18 below conf: dropped
                (250, 50, 20, 20, 0.9, 2, 0.5))  # score 0.45: kept
    out = non_max_suppression(pred, conf=0.25)[0]
    assert out.shape == (1, 6)
    torch.testing.assert_close(out[0], torch.tensor([240.0, 40, 260, 60, 0.45, 2]))


def test_all_one_class_overlaps_suppressed_separate_kept():
    pred = rows((50, 50, 40, 40, 0.9, 0, 0.9),
                (52, 50, 40, 40, 0.8, 0, 0.9),    # IoU ~0.9 with the first: suppressed
                (200, 200, 40, 40, 0.7, 0, 0.9))  # far away: kept
    out = non_max_suppression(pred, conf=0.25, iou=0.45)[0]
    assert out[:, 5].tolist() == [0, 0]
    torch.testing.assert_close(out[:, 4], torch.tensor([0.81, 0.63]))


def test_class_aware_versus_agnostic():
    pred = rows((50, 50, 40, 40, 0.9, 0, 0.9), (51, 50, 40, 40, 0.9, 1, 0.8))
    assert non_max_suppression(pred, conf=0.25)[0][:, 5].tolist() == [0, 1]
    agnostic = non_max_suppression(pred, conf=0.25, agnostic=True)[0]
    assert agnostic[:, 5].tolist() == [0]


def test_ties_identical_boxes_and_scores_keep_exactly_one():
    pred = rows(*[(80, 80, 30, 30, 0.5, 1, 0.8)] * 5)
    out = non_max_suppression(pred, conf=0.25)[0]
    assert out.shape[0] == 1
    assert out[0, 4].item() == pytest.approx(0.4)


def test_multi_label_keeps_one_row_per_passing_class():
    pred = rows((60, 60, 20, 20, 0.9, 0, 0.9))
    pred[0, 0, 6] = 0.5  # class 1 also passes
    pred[0, 0, 7] = 0.01  # class 2 does not
    assert non_max_suppression(pred, conf=0.25, multi_label=True)[0][:, 5].tolist() == [0, 1]
    assert non_max_suppression(pred, conf=0.25, multi_label=False)[0][:, 5].tolist() == [0]


def test_classes_filter_and_max_det():
    g = torch.Generator().manual_seed(0)
    n = 200
    pred = torch.zeros(1, n, 8)
    pred[0, :, 0] = torch.arange(n) * 50.0  # non-overlapping
    pred[0, :, 1] = 100
    pred[0, :, 2:4] = 20
    pred[0, :, 4] = torch.rand(n, generator=g) * 0.5 + 0.5
    pred[0, torch.arange(n), 5 + torch.arange(n) % 3] = 0.9
    out = non_max_suppression(pred, conf=0.25, classes=[2], max_det=10)[0]
    assert out.shape[0] == 10
    assert (out[:, 5] == 2).all()
    assert (out[:-1, 4] >= out[1:, 4]).all()


def test_invalid_thresholds_raise():
    with pytest.raises(ValueError, match="conf"):
        non_max_suppression(torch.zeros(1, 1, 6), conf=1.5)
    with pytest.raises(ValueError, match="iou"):
        non_max_suppression(torch.zeros(1, 1, 6), iou=-0.1)


def test_scale_boxes_to_original_inverts_letterbox_and_clips():
    original = torch.tensor([[10.0, 20.0, 110.0, 220.0], [-5.0, 0.0, 700.0, 50.0]])
    gain, pad = (0.5, 0.5), (16.0, 7.0)
    letterboxed = original * 0.5 + torch.tensor([16.0, 7.0, 16.0, 7.0])
    back = scale_boxes_to_original(letterboxed, gain, pad, (427, 640))
    torch.testing.assert_close(back[0], original[0])
    torch.testing.assert_close(back[1], torch.tensor([0.0, 0.0, 640.0, 50.0]))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("multi_label", [False, True])
def test_matches_reference_nms_on_random_predictions(reference, seed, multi_label):
    from yolov5.utils.general import non_max_suppression as reference_nms

    g = torch.Generator().manual_seed(seed)
    b, n, nc = 2, 3000, 5
    xy = torch.rand(b, n, 2, generator=g) * 320
    wh = torch.rand(b, n, 2, generator=g) * 60 + 4
    probs = torch.rand(b, n, 1 + nc, generator=g) ** 3
    pred = torch.cat((xy, wh, probs), 2)
    ours = non_max_suppression(pred.clone(), 0.01, 0.5, multi_label=multi_label, max_det=300)
    theirs = reference_nms(pred.clone(), 0.01, 0.5, multi_label=multi_label, max_det=300)
    for a, r in zip(ours, theirs):
        assert a.shape[0] > 10
        torch.testing.assert_close(a, r)


@pytest.mark.parametrize("multi_label", [False, True])
def test_mask_coefficients_travel_with_their_boxes_as_in_the_reference(reference, multi_label):
    """A segmentation model's trailing mask coefficients are not class scores: each kept detection carries
    its box's coefficients, and the boxes, scores and classes are the reference's (``nm=`` there)."""
    from yolov5.utils.general import non_max_suppression as reference_nms

    g = torch.Generator().manual_seed(3)
    b, n, nc, nm = 2, 2000, 4, 32
    xy = torch.rand(b, n, 2, generator=g) * 320
    wh = torch.rand(b, n, 2, generator=g) * 60 + 4
    probs = torch.rand(b, n, 1 + nc, generator=g) ** 3
    coefficients = torch.randn(b, n, nm, generator=g)
    pred = torch.cat((xy, wh, probs, coefficients), 2)
    ours = non_max_suppression(pred.clone(), 0.01, 0.5, multi_label=multi_label, max_det=300, num_extra=nm)
    theirs = reference_nms(pred.clone(), 0.01, 0.5, multi_label=multi_label, max_det=300, nm=nm)
    for image, a, r in zip(pred, ours, theirs):
        assert a.shape == (r.shape[0], 6 + nm) and a.shape[0] > 10
        torch.testing.assert_close(a[:, :6], r[:, :6])
        # The reference scales the coefficients by objectness (harmless for a 0.5 mask threshold); ours are
        # the model's own: the row of the box each detection came from.
        source = (xywh_to_xyxy(image[:, :4])[None] == a[:, None, :4]).all(2).float().argmax(1)
        torch.testing.assert_close(a[:, 6:], image[source, 5 + nc:])
    assert non_max_suppression(torch.zeros(1, 0, 5 + nc + nm), num_extra=nm)[0].shape == (0, 6 + nm)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), num_classes=st.integers(1, 12), levels=st.integers(1, 6), seed=st.integers(0, 2**16),
       iou=st.sampled_from([0.3, 0.45, 0.6, 0.9]))
def test_per_class_nms_keeps_the_rows_one_call_on_all_classes_keeps(n, num_classes, levels, seed, iou):
    """Above PER_CLASS_NMS_FROM candidates NMS runs once per class; the kept rows and their order must be
    those of the reference's single call on class-shifted boxes, ties in score (few score levels) and
    identical boxes included."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.randint(0, 40, (n, 2), generator=g).float() * 8  # on a coarse grid: duplicates and overlaps
    wh = torch.randint(1, 6, (n, 2), generator=g).float() * 16
    scores = (torch.randint(1, levels + 1, (n,), generator=g).float() / levels).sort(descending=True).values
    classes = torch.randint(0, num_classes, (n,), generator=g).float()
    det = torch.cat((xy, xy + wh, scores[:, None], classes[:, None]), 1)
    one_call = nms_ops.nms(det[:, :4] + det[:, 5:6] * MAX_WH, det[:, 4], iou)
    per_class = nms_module._class_aware_nms(det, iou, agnostic=False, per_class_from=0)
    assert torch.equal(per_class, one_call)


@pytest.mark.parametrize("multi_label", [False, True])
def test_matches_reference_nms_with_more_candidates_than_the_per_class_threshold(reference, monkeypatch,
                                                                                 multi_label):
    """Thousands of candidates per image, scores in few levels (many ties): ours runs one NMS per class,
    the reference one call on all classes; the detections are the same, in the same order."""
    import yolov5.utils.general as general
    from yolov5.utils.general import non_max_suppression as reference_nms

    monkeypatch.setattr(general, "time", types.SimpleNamespace(time=lambda: 0.0))  # no time limit: all boxes

    g = torch.Generator().manual_seed(5)
    b, n, nc = 2, 2 * PER_CLASS_NMS_FROM, 20
    xy = torch.rand(b, n, 2, generator=g) * 320
    wh = torch.rand(b, n, 2, generator=g) * 60 + 4
    probs = (torch.rand(b, n, 1 + nc, generator=g) * 8).ceil() / 8  # 8 levels: ties everywhere
    pred = torch.cat((xy, wh, probs), 2)
    ours = non_max_suppression(pred.clone(), 0.01, 0.5, multi_label=multi_label, max_det=300)
    theirs = reference_nms(pred.clone(), 0.01, 0.5, multi_label=multi_label, max_det=300)
    for a, r in zip(ours, theirs):
        assert a.shape[0] == 300
        assert torch.equal(a, r)
