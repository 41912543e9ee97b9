"""The train loader's augmentation statistics against the reference's loader: the distributions of box
sizes, box positions, boxes per image and pixel means of mosaic samples (scratch-low augmentations, the
same images) must be those of ``yolov5.utils.dataloaders.LoadImagesAndLabels``.

The two loaders draw from different random streams and decode differently (this one shrinks JPEGs while
decoding and builds only the visible part of the mosaic), so samples are compared as distributions with
two-sample Kolmogorov-Smirnov tests, not pixel by pixel. Statistics are one value per image: a mosaic's
boxes share its scale and shift, so pooled boxes are not independent draws (two seeds of the reference
itself then "differ" at p < 1e-4). Both streams are seeded, so the p-values are fixed numbers, not a
flaky draw; each comparison must reach ``ALPHA`` (0.01 over the comparisons, Bonferroni). With n images
a side that is a KS distance of 1.92 * sqrt(2 / n): 0.15 for the 320 generated ones, 0.21 for 160 of
coco128. On generated images whose objects all have one size, the largest box of a sample is that size
times the sample's scale, so the scale augmentation's range changed from +/-0.5 to +/-0.25 (distance
0.25) is seen; on coco128 the objects' own sizes blur it, and that test only checks real data.
"""

from __future__ import annotations

import random
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import yaml
from conftest import coco128_subset

from yolotrain.data.augment import AugmentConfig
from yolotrain.data.dataset import DetectionDataset
from yolotrain.data.sources import list_images
from yolotrain.data.verify import verify_split

stats = pytest.importorskip("scipy.stats")

SIZE, SAMPLES = 320, 160  # coco128
SQUARES_SIZE, SQUARES_SAMPLES = 256, 320  # generated images
STATISTICS = ("box size", "largest box", "box x", "box y", "boxes per image", "red mean", "green mean",
              "blue mean")
ALPHA = 0.01 / len(STATISTICS)


def statistics(samples: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """The compared statistics of ``(image HWC RGB uint8, labels class + normalised cxcywh)`` samples, one
    value per image: a mosaic's boxes share its scale and shift, so they are not independent draws."""
    rows = [labels[:, 1:5] for _, labels in samples if len(labels)]
    size = [np.sqrt(b[:, 2] * b[:, 3]) for b in rows]
    means = np.array([img.reshape(-1, 3).mean(0) for img, _ in samples])
    return dict(zip(STATISTICS, (np.array([np.median(v) for v in size]), np.array([v.max() for v in size]),
                                 np.array([b[:, 0].mean() for b in rows]), np.array([b[:, 1].mean() for b in rows]),
                                 np.array([len(labels) for _, labels in samples]), *means.T)))


def p_values(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> dict[str, float]:
    return {name: float(stats.ks_2samp(ours[name], theirs[name]).pvalue) for name in STATISTICS}


def write_squares_dataset(root: Path, n: int = 24, size: int = 256, side: int = 40) -> Path:
    """``n`` JPEGs of ``size`` px on a grey ground, each with 1-4 coloured squares of ``side`` px at
    random places, and their labels; returns the image folder."""
    rng = np.random.default_rng(0)
    images, labels = root / "images" / "train", root / "labels" / "train"
    images.mkdir(parents=True), labels.mkdir(parents=True)
    for i in range(n):
        im = np.full((size, size, 3), 90, np.uint8)
        rows = []
        for k in range(int(rng.integers(1, 5))):
            x, y = (int(v) for v in rng.integers(0, size - side, 2))
            im[y:y + side, x:x + side] = rng.integers(0, 256, 3)
            rows.append(f"{k} {(x + side / 2) / size} {(y + side / 2) / size} {side / size} {side / size}")
        cv2.imwrite(str(images / f"{i:03d}.jpg"), im)
        (labels / f"{i:03d}.txt").write_text("\n".join(rows) + "\n")
    return images


def reference_samples(images: Path, reference, size: int, n: int) -> dict[str, np.ndarray]:
    from yolov5.utils.dataloaders import LoadImagesAndLabels

    hyp = yaml.safe_load((Path(reference.__file__).parent / "data" / "hyps" / "hyp.scratch-low.yaml").read_text())
    dataset = LoadImagesAndLabels(str(images), size, 16, augment=True, hyp=hyp)
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    samples = []
    for i in range(n):
        img, labels, _, _ = dataset[i % len(dataset)]
        samples.append((img.permute(1, 2, 0).numpy(), labels[:, 1:].numpy()))
    return statistics(samples)


def our_samples(images: Path, size: int, n: int, hyp: AugmentConfig) -> dict[str, np.ndarray]:
    dataset = DetectionDataset(verify_split(list_images(images), 80), size, 16, augment=True, hyp=hyp, cache_mb=0)
    count = len(dataset)
    return statistics([dataset[(i % count, i // count, True)] for i in range(n)])


@pytest.fixture(scope="module")
def squares(tmp_path_factory) -> Path:
    return write_squares_dataset(tmp_path_factory.mktemp("squares"))


@pytest.fixture(scope="module")
def squares_reference(reference, squares) -> dict[str, np.ndarray]:
    return reference_samples(squares, reference, SQUARES_SIZE, SQUARES_SAMPLES)


def test_augmentation_statistics_match_reference(squares, squares_reference):
    p = p_values(our_samples(squares, SQUARES_SIZE, SQUARES_SAMPLES, AugmentConfig()), squares_reference)
    assert min(p.values()) > ALPHA, p


def test_statistics_see_a_changed_scale_augmentation(squares, squares_reference):
    p = p_values(our_samples(squares, SQUARES_SIZE, SQUARES_SAMPLES, AugmentConfig(scale=0.25)), squares_reference)
    assert p["largest box"] < ALPHA, p


@pytest.fixture(scope="module")
def images(coco128, tmp_path_factory) -> Path:
    return coco128_subset(tmp_path_factory.mktemp("stats") / "coco128", 128, coco128).parent / "images" / "val"


@pytest.mark.slow
def test_coco128_augmentation_statistics_match_reference(images, reference):
    ours = our_samples(images, SIZE, SAMPLES, AugmentConfig())
    p = p_values(ours, reference_samples(images, reference, SIZE, SAMPLES))
    assert min(p.values()) > ALPHA, p
