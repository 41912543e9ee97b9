"""Rotated-box geometry (rotated.py) and rotated NMS against ultralytics 8's ``xyxyxyxy2xywhr``,
``xywhr2xyxyxyxy``, ``regularize_rboxes``, ``batch_probiou``, ``probiou`` and ``non_max_suppression(rotated=True)``
(the oracle), on random boxes."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import offline_ultralytics

from yolotrain import nms as nms_module
from yolotrain.nms import ROTATED_NMS_BLOCK, rotated_non_max_suppression
from yolotrain.rotated import corners_to_xywhr, probiou, probiou_pairs, regularize_xywhr, xywhr_to_corners


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    with offline_ultralytics(tmp_path_factory):
        from ultralytics.utils import metrics, nms, ops

        yield SimpleNamespace(to_xywhr=ops.xyxyxyxy2xywhr, to_corners=ops.xywhr2xyxyxyxy,
                              regularize=ops.regularize_rboxes, batch_probiou=metrics.batch_probiou,
                              probiou=metrics.probiou, nms=nms.non_max_suppression)


def random_xywhr(generator: torch.Generator, n: int, dtype=torch.float64) -> torch.Tensor:
    """``n`` boxes in a 100-pixel field, sides 2..40 (never nearly square), any angle."""
    centre = torch.rand(n, 2, generator=generator, dtype=dtype) * 100
    short = 2 + torch.rand(n, 1, generator=generator, dtype=dtype) * 18
    long = short * (1.2 + torch.rand(n, 1, generator=generator, dtype=dtype))
    sides = torch.where(torch.rand(n, 1, generator=generator) < 0.5, torch.cat((long, short), 1),
                        torch.cat((short, long), 1))
    angle = (torch.rand(n, 1, generator=generator, dtype=dtype) - 0.5) * 4 * math.pi
    return torch.cat((centre, sides, angle), 1)


def test_corners_to_xywhr_matches_the_reference_on_rectangles(oracle):
    """Random rectangles, and ones at the angles where the range ends or w and h trade places (squares too)."""
    boxes = random_xywhr(torch.Generator().manual_seed(0), 200)
    ends = torch.tensor([0, math.pi / 4, -math.pi / 4, math.pi / 2, 3 * math.pi / 4, math.pi], dtype=torch.float64)
    at_ends = torch.cat((torch.tensor([[40.0, 30, 20, 10], [40, 30, 10, 20], [40, 30, 15, 15]],
                                      dtype=torch.float64).repeat_interleave(len(ends), 0), ends.repeat(3)[:, None]), 1)
    boxes = torch.cat((boxes, at_ends))
    corners = xywhr_to_corners(boxes.numpy())
    ours = corners_to_xywhr(corners.reshape(-1, 8))
    theirs = oracle.to_xywhr(corners.reshape(-1, 8))
    assert ours.dtype == np.float64 and ours.shape == (218, 5)
    np.testing.assert_array_equal(ours, theirs)
    assert (ours[:, 2] >= ours[:, 3]).all()
    assert ((ours[:, 4] >= -math.pi / 4) & (ours[:, 4] < 3 * math.pi / 4)).all()


def test_corners_to_xywhr_matches_the_reference_on_quadrilaterals_and_polygons(oracle):
    """Corners moved off a rectangle, random 4-point sets (often a triangle's hull: several rectangles share the
    least area) and 6-point polygons: the reference's rectangle each time."""
    rng = np.random.default_rng(1)
    boxes = random_xywhr(torch.Generator().manual_seed(1), 100).numpy()
    quadrilaterals = xywhr_to_corners(boxes) + rng.uniform(-3, 3, (100, 4, 2))
    for points in (quadrilaterals, rng.uniform(0, 50, (300, 4, 2)), rng.uniform(0, 50, (100, 6, 2))):
        np.testing.assert_array_equal(corners_to_xywhr(points), oracle.to_xywhr(points))


def test_corners_to_xywhr_keeps_a_tensors_dtype_and_device_and_an_empty_shape(oracle):
    boxes = random_xywhr(torch.Generator().manual_seed(2), 20, torch.float32)
    corners = xywhr_to_corners(boxes)
    ours = corners_to_xywhr(corners)
    assert ours.dtype == torch.float32 and ours.device == corners.device
    torch.testing.assert_close(ours, oracle.to_xywhr(corners), rtol=0, atol=0)
    assert corners_to_xywhr(np.zeros((0, 8))).shape == (0, 5)
    assert corners_to_xywhr(torch.zeros(0, 4, 2)).shape == (0, 5)


def test_xywhr_to_corners_matches_the_reference_for_arrays_tensors_and_batches(oracle):
    boxes = random_xywhr(torch.Generator().manual_seed(3), 30).reshape(3, 10, 5)
    np.testing.assert_array_equal(xywhr_to_corners(boxes).numpy(), oracle.to_corners(boxes).numpy())
    np.testing.assert_array_equal(xywhr_to_corners(boxes.numpy()), oracle.to_corners(boxes.numpy()))


def test_regularize_xywhr_matches_the_reference(oracle):
    boxes = random_xywhr(torch.Generator().manual_seed(4), 100).reshape(4, 25, 5)
    torch.testing.assert_close(regularize_xywhr(boxes), oracle.regularize(boxes), rtol=0, atol=0)


def overlapping_pairs(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Boxes and their jittered copies (from IoU near 1 to none), plus far-apart and tiny ones."""
    generator = torch.Generator().manual_seed(seed)
    first = random_xywhr(generator, n)
    jitter = torch.randn(n, 5, generator=generator, dtype=torch.float64) * torch.tensor([4, 4, 3, 3, 0.5])
    second = first + jitter
    second[:, 2:4] = second[:, 2:4].abs() + 0.1
    second[: n // 10, :2] += 500  # no overlap: the Bhattacharyya distance hits its clamp
    second[n // 10 : n // 5, 2:4] = 1e-3  # degenerate boxes
    return first, second


def test_probiou_matches_the_reference_pairwise(oracle):
    first, second = overlapping_pairs(5, 60)
    for dtype in (torch.float64, torch.float32):
        ours = probiou(first.to(dtype), second[:40].to(dtype))
        assert ours.shape == (60, 40) and ours.dtype == dtype
        torch.testing.assert_close(ours, oracle.batch_probiou(first.to(dtype), second[:40].to(dtype)))
    assert probiou(first, second[:0]).shape == (60, 0)


def test_probiou_pairs_matches_the_reference_with_floor_and_gradients(oracle):
    first, second = overlapping_pairs(6, 80)
    for floor in (0.0, 0.01):
        ours_input, their_input = second.clone().requires_grad_(), second.clone().requires_grad_()
        ours = probiou_pairs(first, ours_input, floor=floor)
        theirs = oracle.probiou(first, their_input, floor=floor).squeeze(-1)
        torch.testing.assert_close(ours, theirs)
        ours.sum().backward()
        theirs.sum().backward()
        torch.testing.assert_close(ours_input.grad, their_input.grad)


def test_probiou_pairs_broadcasts_and_is_symmetric_with_one_for_identical_boxes():
    first, second = overlapping_pairs(7, 20)
    torch.testing.assert_close(probiou_pairs(first[:, None], second[None]), probiou(first, second))
    torch.testing.assert_close(probiou(first, second), probiou(second, first).T)
    assert torch.allclose(probiou_pairs(first, first), torch.ones(20, dtype=torch.float64), atol=1e-3)


def rotated_predictions(seed: int, images: int = 3, n: int = 300, nc: int = 3) -> torch.Tensor:
    """Decoded OBB output ``[B, N, 5+nc+1]``: boxes in clusters around a few centres (so that they overlap),
    objectness 1, class probabilities, angles in the head's range; the last image has no score above 0.001 (empty)."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.rand(images, 8, 2, generator=generator) * 300
    cluster = torch.randint(0, 8, (images, n), generator=generator)
    xy = centres.gather(1, cluster[..., None].expand(-1, -1, 2)) + torch.randn(images, n, 2, generator=generator) * 6
    wh = 10 + torch.rand(images, n, 2, generator=generator) * 40
    angle = (torch.rand(images, n, 1, generator=generator) - 0.25) * math.pi
    probabilities = torch.rand(images, n, nc, generator=generator)
    probabilities[-1] *= 5e-4
    return torch.cat((xy, wh, torch.ones(images, n, 1), probabilities, angle), 2)


def their_layout(prediction: torch.Tensor) -> torch.Tensor:
    """Ours ``[B, N, 5+nc+1]`` → ultralytics' ``[B, 4+nc+1, N]`` (no objectness)."""
    return torch.cat((prediction[..., :4], prediction[..., 5:]), 2).transpose(1, 2)


@pytest.mark.parametrize("options", [
    dict(conf=0.25, iou=0.45),
    dict(conf=0.001, iou=0.7, multi_label=True, max_det=1000),
    dict(conf=0.1, iou=0.3, classes=[0, 2]),
    dict(conf=0.25, iou=0.5, agnostic=True),
    dict(conf=0.05, iou=0.6, max_det=20, max_nms=100),
])
def test_rotated_nms_keeps_the_references_boxes(oracle, options):
    prediction = rotated_predictions(sum(map(ord, str(options))))
    ours = rotated_non_max_suppression(prediction, **options)
    theirs = oracle.nms(their_layout(prediction), options.pop("conf"), options.pop("iou"), nc=3, rotated=True,
                        **options)
    assert len(ours) == 3 and ours[-1].shape == (0, 7) and all(len(image) > 1 for image in ours[:2])
    for mine, reference in zip(ours, theirs):
        torch.testing.assert_close(mine, reference, rtol=0, atol=0)


def test_rotated_nms_suppresses_within_a_class_and_by_probiou():
    """Two near-identical boxes of one class: the lower score goes; the same boxes in two classes both stay;
    a box rotated across its twin (low ProbIoU) stays too."""
    rows = torch.tensor([[[50.0, 50, 40, 10, 1, 0.9, 0, 0.1],
                          [51.0, 50, 40, 10, 1, 0.8, 0, 0.1],
                          [50.0, 50, 40, 10, 1, 0.7, 0, 0.1 + math.pi / 2],
                          [51.0, 50, 40, 10, 1, 0, 0.6, 0.1]]])
    kept = rotated_non_max_suppression(rows, conf=0.25, iou=0.5)[0]
    torch.testing.assert_close(kept[:, 4], torch.tensor([0.9, 0.7, 0.6]))
    torch.testing.assert_close(kept[:, 5], torch.tensor([0.0, 0, 1]))
    assert rotated_non_max_suppression(rows, conf=0.25, iou=0.5, agnostic=True)[0].shape == (2, 7)
    assert rotated_non_max_suppression(torch.zeros(2, 0, 8))[0].shape == (0, 7)
    with pytest.raises(ValueError, match="5\\+nc\\+1"):
        rotated_non_max_suppression(torch.zeros(1, 4, 6))


@pytest.mark.parametrize("block", [1, 7, 1000])
def test_rotated_nms_keeps_the_same_boxes_whatever_rows_of_overlaps_it_takes_at_once(monkeypatch, block):
    """The multi-label case has more candidates per image than one block of rows of the overlap matrix."""
    prediction = rotated_predictions(9)
    expected = rotated_non_max_suppression(prediction, conf=0.001, iou=0.6, multi_label=True, max_det=1000)
    assert (prediction[0, :, 5:-1] > 0.001).sum() > 3 * ROTATED_NMS_BLOCK
    monkeypatch.setattr(nms_module, "ROTATED_NMS_BLOCK", block)
    found = rotated_non_max_suppression(prediction, conf=0.001, iou=0.6, multi_label=True, max_det=1000)
    for mine, reference in zip(found, expected):
        torch.testing.assert_close(mine, reference, rtol=0, atol=0)


def awkward_xywhr(seed: int, n: int) -> torch.Tensor:
    """``n`` float32 boxes of sides from ~0.1 to ~2000 px, a fifth of them 50 times thinner than long, each pair
    ``(i, n/2 + i)`` a jittered copy, from nearly equal to far apart, so that ProbIoUs span the whole range."""
    generator = torch.Generator().manual_seed(seed)
    boxes = random_xywhr(generator, n // 2, dtype=torch.float32)
    scale = torch.exp(torch.randn(n // 2, 1, generator=generator) * 1.5)
    thin = torch.rand(n // 2, 1, generator=generator) < 0.2
    sides = boxes[:, 2:4] * scale * torch.where(thin, torch.tensor([1.0, 0.02]), torch.tensor([1.0, 1.0]))
    boxes = torch.cat((boxes[:, :2] * scale.sqrt(), sides, boxes[:, 4:]), 1)
    jitter = (torch.randn(n // 2, 5, generator=generator) * torch.tensor([0.3, 0.3, 0.2, 0.2, 0.3])
              * 10 ** (-3 * torch.rand(n // 2, 1, generator=generator)))
    copies = torch.cat((boxes[:, :2] + jitter[:, :2] * boxes[:, 2:4], boxes[:, 2:4] * jitter[:, 2:4].exp(),
                        boxes[:, 4:] + jitter[:, 4:]), 1)
    return torch.cat((boxes, copies))


@pytest.mark.parametrize("iou", [0.01, 0.3, 0.45, 0.7, 0.95])
def test_pairs_the_rotated_nms_leaves_out_never_overlap_by_more_than_its_threshold(iou):
    """The centre-distance test that spares the NMS most ProbIoU computations is a bound: every pair of boxes
    it applies to that overlaps by more than ``iou`` passes it; pairs with a tiny or very thin box are always
    computed (float32 ProbIoU is not bounded there)."""
    boxes = awkward_xywhr(int(iou * 100), 6000)
    first, second = boxes[:3000], boxes[3000:]
    overlapping = probiou_pairs(first, second) > iou
    applies = nms_module._well_conditioned(first) & nms_module._well_conditioned(second)
    distances = (first[:, :2] - second[:, :2]).pow(2).sum(1)
    reach = nms_module._probiou_reach(iou) * (first[:, 2:4].pow(2).sum(1) + second[:, 2:4].pow(2).sum(1))
    assert 100 < (overlapping & applies).sum() < 2900 and (~applies).sum() > 300
    assert (distances < reach)[overlapping & applies].all()
    # Two thirds of the bound (its margin taken off) is still a bound: the margin is not what makes this pass.
    assert (distances < reach / 1.5)[overlapping & applies].all()


@pytest.mark.parametrize("iou", [0.3, 0.7])
def test_the_rotated_nms_keeps_what_it_keeps_when_it_computes_every_overlap(monkeypatch, iou):
    """Awkward boxes (tiny, thin, huge, near-duplicates) of three classes: leaving out the far pairs changes
    nothing against computing every pair's ProbIoU."""
    generator = torch.Generator().manual_seed(3)
    boxes = awkward_xywhr(7, 400)
    scores = torch.rand(400, 3, generator=generator)
    prediction = torch.cat((boxes[:, :4], torch.ones(400, 1), scores, boxes[:, 4:]), 1)[None]
    options = dict(conf=0.001, iou=iou, multi_label=True, max_det=30000)
    pruned = rotated_non_max_suppression(prediction, **options)[0]
    monkeypatch.setattr(nms_module, "_probiou_reach", lambda iou: math.inf)
    everything = rotated_non_max_suppression(prediction, **options)[0]
    assert 100 < len(pruned) < 1100
    torch.testing.assert_close(pruned, everything, rtol=0, atol=0)
