"""Rotated-box geometry (rotated.py) against ultralytics 8's ``xyxyxyxy2xywhr``, ``xywhr2xyxyxyxy``,
``regularize_rboxes``, ``batch_probiou`` and ``probiou`` (the oracle), on random boxes."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import offline_ultralytics

from yolotrain.rotated import corners_to_xywhr, probiou, probiou_pairs, regularize_xywhr, xywhr_to_corners


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    with offline_ultralytics(tmp_path_factory):
        from ultralytics.utils import metrics, ops

        yield SimpleNamespace(to_xywhr=ops.xyxyxyxy2xywhr, to_corners=ops.xywhr2xyxyxyxy,
                              regularize=ops.regularize_rboxes, batch_probiou=metrics.batch_probiou,
                              probiou=metrics.probiou)


def random_xywhr(generator: torch.Generator, n: int, dtype=torch.float64) -> torch.Tensor:
    """``n`` boxes in a 100-pixel field, sides 2..40 (never nearly square), any angle."""
    centre = torch.rand(n, 2, generator=generator, dtype=dtype) * 100
    short = 2 + torch.rand(n, 1, generator=generator, dtype=dtype) * 18
    long = short * (1.2 + torch.rand(n, 1, generator=generator, dtype=dtype))
    sides = torch.where(torch.rand(n, 1, generator=generator) < 0.5, torch.cat((long, short), 1),
                        torch.cat((short, long), 1))
    angle = (torch.rand(n, 1, generator=generator, dtype=dtype) - 0.5) * 4 * math.pi
    return torch.cat((centre, sides, angle), 1)


def same_rectangles(a: np.ndarray, b: np.ndarray, atol: float) -> None:
    """Equal canonical xywhr, the angles compared modulo pi (an angle at the range's ends may land on either)."""
    np.testing.assert_allclose(a[:, :4], b[:, :4], atol=atol, rtol=1e-5)
    difference = np.remainder(a[:, 4] - b[:, 4] + math.pi / 2, math.pi) - math.pi / 2
    np.testing.assert_allclose(difference, 0, atol=atol)


def test_corners_to_xywhr_matches_the_reference_on_rectangles(oracle):
    boxes = random_xywhr(torch.Generator().manual_seed(0), 200)
    corners = xywhr_to_corners(boxes.numpy())
    ours = corners_to_xywhr(corners.reshape(-1, 8))
    theirs = oracle.to_xywhr(corners.reshape(-1, 8))
    assert ours.dtype == np.float64 and ours.shape == (200, 5)
    same_rectangles(ours, theirs, atol=1e-9)
    assert (ours[:, 2] >= ours[:, 3]).all()
    assert ((ours[:, 4] >= -math.pi / 4) & (ours[:, 4] < 3 * math.pi / 4)).all()


def test_corners_to_xywhr_matches_the_reference_on_quadrilaterals_and_polygons(oracle):
    """Corners moved off a rectangle, random 4-point sets (often a triangle's hull: several rectangles share the
    least area) and 6-point polygons: the reference's rectangle each time."""
    rng = np.random.default_rng(1)
    boxes = random_xywhr(torch.Generator().manual_seed(1), 100).numpy()
    quadrilaterals = xywhr_to_corners(boxes) + rng.uniform(-3, 3, (100, 4, 2))
    for points in (quadrilaterals, rng.uniform(0, 50, (300, 4, 2)), rng.uniform(0, 50, (100, 6, 2))):
        same_rectangles(corners_to_xywhr(points), oracle.to_xywhr(points), atol=1e-9)


def test_corners_to_xywhr_keeps_a_tensors_dtype_and_device_and_an_empty_shape(oracle):
    boxes = random_xywhr(torch.Generator().manual_seed(2), 20, torch.float32)
    corners = xywhr_to_corners(boxes)
    ours = corners_to_xywhr(corners)
    assert ours.dtype == torch.float32 and ours.device == corners.device
    same_rectangles(ours.numpy(), oracle.to_xywhr(corners).numpy(), atol=1e-6)
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
