"""The tensor augmentation path (``--augment-device``), run on CPU tensors: the loader's statistics,
exact placement under a known transform, the loader's HSV arithmetic, and the command end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import coco128_subset
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.io import ImageReadMode, decode_jpeg

from yolotrain.data import augment as A
from yolotrain.data.gpu_augment import DeviceAugmenter, EncodedBatch, exif_orientation, hsv_gains, orient
from yolotrain.data.loaders import DataConfig, build_loaders
from yolotrain.settings import ConfigError

# Every transform on, and a share of samples letterboxed rather than mosaicked.
ALL_ON = A.AugmentConfig(degrees=10.0, shear=5.0, perspective=0.0005, mixup=0.3, flipud=0.3, mosaic=0.8)
# Two-sample Kolmogorov-Smirnov critical value at a 0.1% false-alarm rate: c(alpha) = sqrt(-ln(alpha/2)/2).
KS_C = float(np.sqrt(-np.log(0.001 / 2) / 2))


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """The largest distance between the two samples' empirical distribution functions."""
    grid = np.concatenate((a, b))
    return float(np.abs(np.searchsorted(np.sort(a), grid, "right") / len(a)
                        - np.searchsorted(np.sort(b), grid, "right") / len(b)).max())


def assert_same_distribution(a: np.ndarray, b: np.ndarray, what: str) -> None:
    """KS at alpha 0.001: with ~3000 boxes a shift of a twentieth of the range fails, with 256 images a
    sixth; a path that draws from the loader's distributions passes 999 times in 1000."""
    critical = KS_C * np.sqrt((len(a) + len(b)) / (len(a) * len(b)))
    distance = ks_statistic(a, b)
    assert distance < critical, f"{what}: KS distance {distance:.3f} over the critical {critical:.3f}"


def epoch_statistics(data: Path, device: str, epochs: int) -> dict[str, np.ndarray]:
    config = DataConfig(path=str(data), img_size=128, batch_size=32, workers=0, augment_device=device)
    loader = build_loaders(config, ALL_ON, splits=("train",), seed=3).train
    boxes, counts, means, stds = [], [], [], []
    for epoch in range(epochs):
        loader.batch_sampler.set_epoch(epoch)
        for imgs, targets in loader:
            assert imgs.shape[1:] == (3, 128, 128) and imgs.dtype == torch.float32
            boxes.append(targets[:, 2:].numpy())
            counts.append(np.bincount(targets[:, 0].long().numpy(), minlength=len(imgs)))
            means.append(imgs.mean((1, 2, 3)).numpy())
            stds.append(imgs.std((1, 2, 3)).numpy())
    xywh = np.concatenate(boxes)
    return {"box x": xywh[:, 0], "box y": xywh[:, 1], "box width": xywh[:, 2], "box height": xywh[:, 3],
            "boxes per image": np.concatenate(counts).astype(float), "pixel mean": np.concatenate(means),
            "pixel std": np.concatenate(stds)}


@pytest.mark.slow
def test_tensor_path_has_the_loaders_statistics(coco128, tmp_path):
    data = coco128_subset(tmp_path, 128, coco128)
    loader, tensors = epoch_statistics(data, "loader", 2), epoch_statistics(data, "cpu", 2)
    assert len(loader["pixel mean"]) == len(tensors["pixel mean"]) == 256
    for what in loader:
        assert_same_distribution(loader[what], tensors[what], what)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu_check.sh runs it)")
def test_cuda_batches_are_the_cpu_tensor_batches(coco128, tmp_path):
    data = coco128_subset(tmp_path, 32, coco128)
    config = DataConfig(path=str(data), img_size=256, batch_size=16, workers=0, augment_device="cuda")
    loader = build_loaders(config, ALL_ON, splits=("train",)).train
    for batch in DataLoader(loader.dataset, batch_sampler=loader.batch_sampler, collate_fn=loader.collate_fn):
        on_cpu = DeviceAugmenter(loader.dataset.hyp, 256, "cpu")(batch)
        on_cuda = loader.augmenter(batch)
        torch.testing.assert_close(on_cuda.targets.cpu(), on_cpu.targets, atol=1e-4, rtol=0)
        # nvJPEG's inverse DCT and the float resize differ from libjpeg's and the uint8 one by a level or two.
        levels = (on_cuda.imgs.cpu() - on_cpu.imgs).abs() * 255
        assert levels.mean() < 2 and (levels > 16).float().mean() < 0.01, (levels.mean(), levels.max())


def known_batch(tmp_path: Path, size: int, centre: tuple[int, int], tile_sizes: list[tuple[int, int]],
                colours: np.ndarray, labels: list[np.ndarray]) -> EncodedBatch:
    """One mosaic of lossless solid-colour tiles around ``centre`` with the identity warp, no HSV or flips."""
    data = []
    for i, ((w, h), colour) in enumerate(zip(tile_sizes, colours)):
        path = tmp_path / f"tile{i}.png"
        cv2.imwrite(str(path), np.full((h, w, 3), colour[::-1], np.uint8))  # written BGR, read back RGB
        data.append(torch.from_numpy(np.fromfile(path, np.uint8)))
    identity = [0, 0, 0, 1, 0, 0, 0.5, 0.5]  # no perspective, rotation or shear, scale 1, translation 0.5
    return EncodedBatch(
        data=data, tile_size=torch.tensor(tile_sizes), tile_anchor=torch.tensor([centre] * 4, dtype=torch.float64),
        tile_lead=torch.tensor([(1, 1), (0, 1), (1, 0), (0, 0)], dtype=torch.float64),
        tile_slot=torch.arange(4), tile_composite=torch.zeros(4, dtype=torch.long),
        tile_orientation=torch.ones(4, dtype=torch.long),
        labels=torch.from_numpy(np.concatenate(labels)).double(),
        label_tile=torch.repeat_interleave(torch.tensor([len(rows) for rows in labels])),
        canvas=torch.tensor([2.0 * size], dtype=torch.float64), warp=torch.tensor([identity], dtype=torch.float64),
        composite_sample=torch.zeros(1, dtype=torch.long), composite_weight=torch.ones(1, dtype=torch.float64),
        hsv_gain=torch.ones(1, 3, dtype=torch.float64), flip=torch.zeros(1, 2, dtype=torch.bool))


def test_identity_warp_places_tiles_where_the_mosaic_puts_them(tmp_path):
    size, (xc, yc) = 64, (70, 50)  # canvas 128; the output is its crop [32, 96) in x and y
    tile_sizes = [(40, 30), (64, 48), (50, 64), (20, 10)]
    colours = np.array([(200, 30, 30), (30, 200, 30), (30, 30, 200), (220, 220, 20)], np.uint8)
    # One box over each whole tile; a small one in tile 1 that the crop cuts to nothing, one in tile 2 it cuts
    # in part (at fractional pixels).
    labels = [np.array([[k, 0.5, 0.5, 1.0, 1.0]]) for k in range(4)]
    labels[1] = np.concatenate((labels[1], [[7, 0.25, 0.25, 0.25, 0.25]]))
    labels[2] = np.concatenate((labels[2], [[8, 0.75, 0.75, 0.25, 0.25]]))
    batch = known_batch(tmp_path, size, (xc, yc), tile_sizes, colours, labels)
    imgs, targets = DeviceAugmenter(A.AugmentConfig(hsv_h=0, hsv_s=0, hsv_v=0), size, "cpu")(batch)

    expected = np.full((size, size, 3), A.PAD_VALUE, np.uint8)
    boxes = []
    for k, ((w, h), colour, rows) in enumerate(zip(tile_sizes, colours, labels)):
        left, top = xc - w * (k in (0, 2)), yc - h * (k in (0, 1))  # the tile's top-left corner on the canvas
        x1, y1, x2, y2 = max(left, 0) - 32, max(top, 0) - 32, min(left + w, 128) - 32, min(top + h, 128) - 32
        expected[max(y1, 0):max(y2, 0), max(x1, 0):max(x2, 0)] = colour
        for c, cx, cy, bw, bh in rows:
            boxes.append([c, (cx - bw / 2) * w + left - 32, (cy - bh / 2) * h + top - 32,
                          (cx + bw / 2) * w + left - 32, (cy + bh / 2) * h + top - 32])
    got = (imgs[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    np.testing.assert_array_equal(got, expected)

    xyxy = np.array(boxes, np.float64)
    xyxy[:, 1:] = xyxy[:, 1:].clip(0, size)
    keep = (xyxy[:, 3] - xyxy[:, 1] > 2) & (xyxy[:, 4] - xyxy[:, 2] > 2)
    assert keep.tolist() == [True, True, False, True, True, True]  # each keeps over 10% of its area
    want = A.xyxy_to_xywhn(xyxy[keep], size, size)
    np.testing.assert_allclose(targets[:, 1:].numpy(), want, atol=1e-5)
    assert (targets[:, 0] == 0).all()


def opencv_hsv8_to_rgb_truncated(hsv: np.ndarray) -> np.ndarray:
    """OpenCV's float32 ``COLOR_HSV2RGB`` formula for 8-bit HSV ``[..., 3]``, written out in numpy, each value
    truncated to 8 bits. OpenCV's own kernels end this formula differently (its AVX2 code truncates, its
    AVX-512 code rounds some values), so the real loader is within one level of this on every CPU."""
    h, s, v = (hsv[..., k].astype(np.float32) for k in range(3))
    h = np.fmod(h * np.float32(6 / 180), np.float32(6))
    sector = np.floor(h)
    f = h - sector
    s, v = s * np.float32(1 / 255), v * np.float32(1 / 255)
    one = np.float32(1)
    table = np.stack((v, v * (one - s), v * (one - s * f), v * (one - s * (one - f))), -1)
    # R, G, B as rows of (v, v(1-s), v(1-sf), v(1-s(1-f))) for each sixth of the hue circle (OpenCV's table)
    rows = np.array([[0, 3, 1], [2, 0, 1], [1, 0, 3], [1, 2, 0], [3, 1, 0], [0, 1, 2]])[sector.astype(int)]
    return np.floor(np.take_along_axis(table, rows, -1) * np.float32(255)).astype(np.float64)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), gains=st.tuples(*[st.floats(0, 1)] * 3))
def test_hsv_gains_are_the_loaders_lut_arithmetic(seed, gains):
    assume(any(gains))  # all zero: the loader only swaps channels, and so does the augmenter (not through HSV)
    rng = np.random.default_rng(seed)
    bgr = rng.integers(0, 256, (2, 24, 32, 3), dtype=np.uint8)
    bgr[1, :, :8] = bgr[1, :, :8, :1]  # grey pixels: hue undefined, saturation 0
    loader, formula, draws = [], [], []
    for im in bgr:
        draws.append(np.random.default_rng(seed).uniform(-1, 1, 3) * gains + 1)
        loader.append(A.hsv_to_rgb(im, np.random.default_rng(seed), *gains))
        # The loader's 8-bit HSV through its lookup tables (integer arithmetic, the same on every CPU) ...
        r = draws[-1]
        x = np.arange(256, dtype=np.float64)
        lut = np.stack(((x * r[0]) % 180, np.clip(x * r[1], 0, 255), np.clip(x * r[2], 0, 255)), -1).astype(np.uint8)
        hsv = cv2.cvtColor(im, cv2.COLOR_BGR2HSV)
        # ... and back to RGB by OpenCV's float formula, truncated.
        formula.append(opencv_hsv8_to_rgb_truncated(np.take_along_axis(lut, hsv.reshape(-1, 3).astype(int), 0)
                                                    .reshape(hsv.shape)))
    rgb = torch.from_numpy(bgr[..., ::-1].copy()).permute(0, 3, 1, 2).float()
    got = hsv_gains(rgb, torch.tensor(np.array(draws))).permute(0, 2, 3, 1).numpy()
    # Exactly the formula: a wrong table, rounding or channel order would move values here.
    np.testing.assert_array_equal(got, np.array(formula))
    # And the loader on this CPU, whichever OpenCV kernel ran, within one level of it.
    assert np.abs(got - np.array(loader, np.float64)).max() <= 1


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torchvision's pointer to TorchCodec
@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_turns_images_as_opencv_reads_them(tmp_path, orientation):
    rng = np.random.default_rng(orientation)
    stored = np.kron(rng.integers(0, 256, (3, 5, 3), dtype=np.uint8), np.ones((8, 8, 1), np.uint8))  # 24 x 40
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / "photo.jpg"
    Image.fromarray(stored).save(path, quality=100, exif=exif)
    data = torch.from_numpy(np.fromfile(path, np.uint8))
    assert exif_orientation(data) == orientation
    upright = orient(decode_jpeg(data, mode=ImageReadMode.RGB), orientation)  # as nvJPEG's pixels are turned
    by_opencv = cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)
    difference = np.abs(upright.permute(1, 2, 0).numpy().astype(int) - by_opencv)
    assert upright.shape[1:] == by_opencv.shape[:2] and difference.mean() < 2, difference.mean()


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "yolotrain", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


TINY = ["--img", "64", "--batch", "4", "--workers", "1", "--epochs", "1", "--project", "runs"]


def test_train_runs_an_epoch_augmented_on_tensors(tiny_data, tmp_path):
    result = run_cli("train", "--data", str(tiny_data), *TINY, "--augment-device", "cpu", "--mixup", "0.5",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run = tmp_path / "runs" / "exp"
    rows = (run / "results.csv").read_text().splitlines()
    losses = [float(v) for v in rows[1].split(",")[1:4]]
    assert len(rows) == 2 and all(np.isfinite(losses)) and sum(losses) > 0, rows
    assert "augment_device: cpu" in (run / "config.yaml").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_fails_in_one_line(tiny_data, tmp_path):
    result = run_cli("train", "--data", str(tiny_data), *TINY, "--augment-device", "cuda", cwd=tmp_path)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert len(lines) == 1 and "--augment-device cuda needs a CUDA GPU and torch finds none" in lines[0], result.stderr


@pytest.mark.parametrize(("overrides", "kind", "message"), [
    ({"rect": True}, "boxes", "--rect needs --augment-device loader"),
    ({"cache": "ram"}, "boxes", "--cache ram keeps images decoded by the loader"),
    ({}, "masks", "training on masks, keypoints or rotated boxes needs --augment-device loader"),
    ({}, "rotated", "training on masks, keypoints or rotated boxes needs --augment-device loader"),
])
def test_requests_the_tensor_path_cannot_serve_are_refused(tiny_data, overrides, kind, message):
    config = DataConfig(path=str(tiny_data), batch_size=2, img_size=64, augment_device="cpu", **overrides)
    with pytest.raises(ConfigError, match=message):
        build_loaders(config, A.AugmentConfig(), kind=kind, splits=("train",))
