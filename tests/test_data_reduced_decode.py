"""Large JPEGs are decoded at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling) when that still leaves them at or
above the size they are used at: the pixels stay close to a full decode and resize, the labels land where they
did, and a setting, small images and other formats keep the full decode."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from yolotrain.data.augment import AugmentConfig
from yolotrain.data.dataset import DetectionDataset, decode_flag, read_image
from yolotrain.data.loaders import DataConfig, build_loaders
from yolotrain.data.segment import SegmentationDataset
from yolotrain.eval.val import build_val_loader

# An object as a label (normalised cx, cy, w, h) and as its polygon, drawn white on a textured background.
BOX = (0.55, 0.45, 0.3, 0.4)
POLYGON = np.array([[0.4, 0.25], [0.7, 0.25], [0.7, 0.65], [0.4, 0.65]])


def photo(width: int, height: int) -> np.ndarray:
    """A smooth BGR picture with the white object of ``POLYGON`` on it (what JPEG is made for)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    background = np.stack([40 + 30 * np.sin(x / 37), 60 + 30 * np.cos(y / 23), 50 + 20 * np.sin((x + y) / 51)], 2)
    im = background.astype(np.uint8)
    cv2.fillPoly(im, [np.round(POLYGON * (width, height)).astype(np.int32)], (255, 255, 255))
    return im


def write_dataset(root: Path, width: int, height: int, suffix: str = ".jpg", n: int = 2) -> Path:
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir(parents=True)
    for i in range(n):
        assert cv2.imwrite(str(root / "images" / f"{i}{suffix}"), photo(width, height),
                           [cv2.IMWRITE_JPEG_QUALITY, 92])
        (root / "labels" / f"{i}.txt").write_text("0 " + " ".join(f"{v:.6f}" for v in POLYGON.ravel()) + "\n")
    (root / "data.yaml").write_text("path: .\ntrain: images\nval: images\nnames: [object]\n")
    return root / "data.yaml"


def loaded(data: Path, img_size: int, reduced: bool, kind: str = "boxes", augment: bool = False) -> DetectionDataset:
    config = DataConfig(path=str(data), img_size=img_size, batch_size=2, workers=0, cache_mb=0,
                        reduced_decode=reduced)
    return build_loaders(config, AugmentConfig() if augment else None, splits=("train",), kind=kind).train.dataset


@pytest.mark.parametrize(("scale", "factor"), [(1.0, 1), (0.6, 1), (0.5, 2), (0.3, 2), (0.25, 4), (0.2, 4),
                                                 (0.125, 8), (0.05, 8)])
def test_the_largest_reduction_that_keeps_the_size_is_chosen(tmp_path, scale, factor):
    path = tmp_path / "a.jpg"
    assert cv2.imwrite(str(path), photo(800, 600))
    flags = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
             8: cv2.IMREAD_REDUCED_COLOR_8}
    assert decode_flag(path, scale) == flags[factor]
    im = read_image(path, scale)
    assert im.shape == (-(-600 // factor), -(-800 // factor), 3)
    assert im.shape[1] >= 800 * scale and im.shape[0] >= 600 * scale
    assert decode_flag(path, scale, reduced=False) == cv2.IMREAD_COLOR


@pytest.mark.parametrize("suffix", [".png", ".bmp", ".webp"])
def test_other_formats_are_decoded_at_full_size(tmp_path, suffix):
    path = tmp_path / f"a{suffix}"
    assert cv2.imwrite(str(path), photo(800, 600))
    assert decode_flag(path, 0.1) == cv2.IMREAD_COLOR
    assert read_image(path, 0.1).shape == (600, 800, 3)


@pytest.mark.parametrize(("width", "height", "img_size"), [(1024, 768, 128), (1000, 700, 160), (900, 1300, 320)])
def test_a_reduced_decode_is_close_to_a_full_decode_and_resize(tmp_path, width, height, img_size):
    data = write_dataset(tmp_path, width, height)
    reduced, full = loaded(data, img_size, True), loaded(data, img_size, False)
    a, b = reduced.load_image(0), full.load_image(0)
    assert a.shape == b.shape and max(a.shape[:2]) == img_size
    assert np.abs(a.astype(np.float32) - b).mean() < 2.0
    assert not np.array_equal(a, b)  # the reduced path was taken


def test_labels_and_masks_land_on_the_object_either_way(tmp_path):
    """The same targets, and masks on the same pixels within one, with and without the reduced decode; in both the
    object's white pixels sit inside its box."""
    data = write_dataset(tmp_path, 1600, 1200)
    samples = [loaded(data, 160, reduced, kind="masks")[0] for reduced in (True, False)]
    (img_r, labels_r, *_, masks_r), (img_f, labels_f, *_, masks_f) = samples
    np.testing.assert_array_equal(labels_r, labels_f)
    assert img_r.shape == img_f.shape
    grow = np.ones((3, 3), np.uint8)
    for a, b in ((masks_r, masks_f), (masks_f, masks_r)):
        assert (cv2.dilate(b[0].astype(np.uint8), grow)[a[0] > 0] > 0).all()
    for img in (img_r, img_f):
        ys, xs = np.nonzero(img.min(2) > 200)
        _, cx, cy, w, h = labels_r[0] * [1, img.shape[1], img.shape[0], img.shape[1], img.shape[0]]
        assert abs(xs.min() - (cx - w / 2)) <= 1 and abs(xs.max() + 1 - (cx + w / 2)) <= 1
        assert abs(ys.min() - (cy - h / 2)) <= 1 and abs(ys.max() + 1 - (cy + h / 2)) <= 1


def test_training_samples_are_the_same_augmentation_either_way(tmp_path):
    """Mosaic and the random affine draw the same geometry: only the pixels differ, a little."""
    data = write_dataset(tmp_path, 1024, 768, n=4)
    (img_r, labels_r), (img_f, labels_f) = (loaded(data, 128, reduced, augment=True)[(1, 0, True)]
                                            for reduced in (True, False))
    np.testing.assert_array_equal(labels_r, labels_f)
    assert np.abs(img_r.astype(np.float32) - img_f).mean() < 3.0


def test_the_setting_small_images_and_other_formats_take_the_full_decode(tmp_path, monkeypatch):
    flags: list[int] = []
    imread = cv2.imread

    def recording(path: str, flag: int = cv2.IMREAD_COLOR) -> np.ndarray | None:
        flags.append(flag)
        return imread(path, flag)

    monkeypatch.setattr(cv2, "imread", recording)
    cases = [("off", 1024, ".jpg", False), ("small", 200, ".jpg", True), ("png", 1024, ".png", True),
             ("on", 1024, ".jpg", True)]
    for name, size, suffix, reduced in cases:
        flags.clear()
        loaded(write_dataset(tmp_path / name, size, size, suffix), 128, reduced).load_image(0)
        assert flags == [cv2.IMREAD_REDUCED_COLOR_8 if name == "on" else cv2.IMREAD_COLOR], name


def test_val_loaders_take_the_setting(tmp_path):
    data = write_dataset(tmp_path, 1024, 768)
    assert build_val_loader(data, 1, 128, workers=0).dataset.reduced_decode
    assert not build_val_loader(data, 1, 128, workers=0, reduced_decode=False).dataset.reduced_decode
    config = DataConfig(path=str(data), img_size=128, batch_size=2, workers=0, reduced_decode=False)
    loaders = build_loaders(config, AugmentConfig(), kind="masks")
    assert isinstance(loaders.val.dataset, SegmentationDataset)
    assert not loaders.train.dataset.reduced_decode and not loaders.val.dataset.reduced_decode
