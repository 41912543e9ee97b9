"""The training loader's fast paths: the mosaic built only where the warp reads it, and batch memory
reused only when nothing refers to it any more."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from yolotrain.data import augment as A
from yolotrain.data.dataset import BatchBuffers, DetectionDataset, float_images


def tiles(rng: np.random.Generator, size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """4 noise images of random sides up to ``size`` with 1-5 random boxes each (normalised cxcywh)."""
    out = []
    for _ in range(4):
        h, w = (int(v) for v in rng.integers(size // 3, size + 1, 2))
        n = int(rng.integers(1, 6))
        wh = rng.uniform(0.05, 0.5, (n, 2))
        xy = rng.uniform(wh / 2, 1 - wh / 2)
        out.append((rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
                    np.column_stack([rng.integers(0, 3, n), xy, wh]).astype(np.float32)))
    return out


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), degrees=st.sampled_from([0.0, 10.0]), shear=st.sampled_from([0.0, 5.0]),
       perspective=st.sampled_from([0.0, 0.0005]), scale=st.sampled_from([0.5, 0.9]))
def test_mosaic_warp_equals_canvas_then_warp(seed, degrees, shear, perspective, scale):
    size = 96
    hyp = A.AugmentConfig(degrees=degrees, shear=shear, perspective=perspective, scale=scale)
    images = tiles(np.random.default_rng(seed), size)
    canvas, labels = A.mosaic4(images, size, rng := np.random.default_rng(seed))
    expected, expected_labels = A.random_perspective(canvas, labels, rng, hyp, border=(-size // 2, -size // 2))
    loaded = []
    im, got_labels = A.mosaic_warp([(img.shape[:2], lab) for img, lab in images],
                                   lambda k: loaded.append(k) or images[k][0], size, np.random.default_rng(seed), hyp)
    np.testing.assert_array_equal(got_labels, expected_labels)
    assert im.shape == expected.shape == (size, size, 3)
    differ = np.abs(im.astype(int) - expected).max(2)
    assert differ.max() <= 1 and (differ > 0).mean() < 0.01  # rounding of the shifted warp only
    assert len(set(loaded)) == len(loaded)  # each tile read at most once


def test_mosaic_warp_skips_tiles_out_of_view():
    size = 64
    images = tiles(np.random.default_rng(0), size)
    loads = 0

    def load(k: int) -> np.ndarray:
        nonlocal loads
        loads += 1
        return images[k][0]

    for seed in range(200):
        A.mosaic_warp([(img.shape[:2], lab) for img, lab in images], load, size, np.random.default_rng(seed),
                      A.AugmentConfig())
    assert loads < 0.97 * 4 * 200  # some tiles never reach the output and are never read


def test_held_batches_are_never_reused():
    shape, buffers = (2, 3, 8, 8), BatchBuffers()
    first = buffers.take(shape)
    first.fill_(1.0)
    view = first[1]
    del first
    second = buffers.take(shape)  # the first batch's memory is still in use through the view
    second.fill_(2.0)
    assert torch.all(view == 1.0)
    pointer = second.data_ptr()
    del second
    assert buffers.take(shape).data_ptr() == pointer or torch.cuda.is_available()  # reused once free


def test_uint8_worker_batches_convert_to_the_float_batch():
    rng = np.random.default_rng(0)
    items = [(rng.integers(0, 256, (16, 24, 3), dtype=np.uint8), rng.random((2, 5)).astype(np.float32))
             for _ in range(3)]
    imgs, targets = DetectionDataset.collate(items, buffers=BatchBuffers())
    raw, raw_targets = DetectionDataset.collate(items, uint8=True)
    assert raw.dtype == torch.uint8 and imgs.dtype == torch.float32
    assert torch.equal(float_images(raw, BatchBuffers()), imgs) and torch.equal(raw_targets, targets)
    assert torch.equal(raw[2], torch.from_numpy(items[2][0]).permute(2, 0, 1))


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_batches_are_float(tiny_data, workers):
    from yolotrain.data.loaders import get_loaders

    train, _ = get_loaders(tiny_data, batch_size=4, num_classes=2, img_size=64, workers=workers)
    imgs, _ = next(iter(train))
    assert imgs.dtype == torch.float32 and imgs.shape == (4, 3, 64, 64) and 0 <= imgs.min() <= imgs.max() <= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("workers", [0, 2])
def test_loader_batches_are_pinned_with_cuda(tiny_data, workers):
    from yolotrain.data.loaders import get_loaders

    train, _ = get_loaders(tiny_data, batch_size=4, num_classes=2, img_size=64, workers=workers)
    imgs, _ = next(iter(train))
    assert imgs.is_pinned() and imgs.dtype == torch.float32


def test_source_window_of_shift_scale_and_flattening_warps():
    half = np.array([[0.5, 0, -10], [0, 0.5, -5], [0, 0, 1]])  # a 44 x 34 output shows canvas x 20-108, y 10-78
    assert A._source_window(half, False, 44, 34, 128) == (18, 8, 111, 81)  # with margins for interpolation
    flat = np.array([[1.0, 1, 0], [1, 1, 0], [0, 0, 1]])  # shears of 45 degrees both ways: no inverse
    assert A._source_window(flat, False, 64, 64, 128) == (0, 0, 128, 128)
    assert A._source_window(np.eye(3), True, 64, 64, 128) == (0, 0, 128, 128)
