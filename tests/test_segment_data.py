"""YOLO-seg data: polygon labels verified and cached, broken ones named; target masks as the reference draws
them; mosaic, affine, flips, copy-paste and mixup moving the masks with the pixels; batches."""

import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from yolotrain.data.augment import AugmentConfig
from yolotrain.data.loaders import DataConfig, build_loaders
from yolotrain.data.segment import SegmentationDataset, polygon_masks
from yolotrain.data.shapes import generate_shapes_dataset
from yolotrain.data.sources import list_images
from yolotrain.data.verify import DataWarning, cache_paths, verify_split

SQUARE = "0.2 0.2 0.6 0.2 0.6 0.6 0.2 0.6"


def write_split(root: Path, labels: dict[str, str], size: int = 64) -> list[Path]:
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir(parents=True)
    for stem, text in labels.items():
        cv2.imwrite(str(root / "images" / f"{stem}.png"), np.zeros((size, size, 3), np.uint8))
        (root / "labels" / f"{stem}.txt").write_text(text)
    return list_images(root / "images")


def test_polygon_labels_are_verified_cached_and_broken_ones_named(tmp_path):
    files = write_split(tmp_path, {
        "a": f"1 {SQUARE}\n0 0.5 0.5 0.2 0.2\n"              # a polygon and a box-only row
             "2 0.1 0.1\n"                                   # one point
             "1 0.1 0.1 nan 0.2 0.3 0.3\n"                   # NaN
             "1 0.1 0.1 0.5 1.5 0.3 0.3\n"                   # far outside
             "0 -0.001 0.1 0.5 0.1 0.5 1.001\n",             # a hair outside: clipped
        "b": "0 0.1 0.1 0.4\n",                              # 4 columns
    })
    with pytest.warns(DataWarning) as caught:
        index = verify_split(files, 3, "train")
    summary = str(caught[0].message)
    for kind, where in [("polygon with fewer than 3 points", "a.txt:3"), ("polygon with NaN or infinite points",
                        "a.txt:4"), ("polygon point outside the image", "a.txt:5"), ("wrong column count", "b.txt:1")]:
        assert f"1 x {kind}: " in summary and where in summary, kind
    labels, polygons = index.labels[0], index.segments[0]
    assert len(labels) == len(polygons) == 3 and index.has_polygons
    np.testing.assert_allclose(polygons[0], np.array(SQUARE.split(), float).reshape(-1, 2), atol=1e-6)
    np.testing.assert_allclose(labels[0], [1, 0.4, 0.4, 0.4, 0.4], atol=1e-6)  # the polygon's box
    assert polygons[1].shape == (0, 2)  # the box-only row
    assert polygons[2].min() == 0 and polygons[2].max() == 1  # clipped
    # The second pass reads the cache: the same labels and polygons, the same named problems.
    assert cache_paths(files)[0].is_file()
    with pytest.warns(DataWarning):
        cached = verify_split(files, 3, "train")
    assert [len(p) for p in cached.segments[0]] == [len(p) for p in polygons]
    for a, b in zip(cached.segments[0], polygons):
        np.testing.assert_array_equal(a, b)


def test_masks_are_the_references(reference):
    from yolov5.utils.segment.dataloaders import polygons2masks, polygons2masks_overlap

    rng = np.random.default_rng(0)
    shape = (96, 128)
    polygons = [np.column_stack([rng.uniform(0, 128, n), rng.uniform(0, 96, n)]) for n in (3, 5, 8, 4, 12)]
    for ratio in (1, 4):
        ours, order = polygon_masks(shape, polygons, ratio, overlap=True)
        theirs, their_order = polygons2masks_overlap(shape, [p.copy() for p in polygons], downsample_ratio=ratio)
        np.testing.assert_array_equal(order, their_order)
        np.testing.assert_array_equal(ours[0], theirs)
        ours, order = polygon_masks(shape, polygons, ratio, overlap=False)
        np.testing.assert_array_equal(ours, polygons2masks(shape, [p.copy() for p in polygons], 1, ratio))
        np.testing.assert_array_equal(order, np.arange(len(polygons)))


def white_objects_dataset(root: Path, n: int = 6, size: int = 128) -> Path:
    """Images of white polygons on black, with their polygons as labels: the masks must cover the white."""
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i in range(n):
        im = np.zeros((size, size, 3), np.uint8)
        rows = []
        for _ in range(int(rng.integers(1, 4))):
            centre, radius = rng.uniform(0.25, 0.75, 2), rng.uniform(0.08, 0.2)
            angles = np.sort(rng.uniform(0, 2 * np.pi, 6))
            points = centre + radius * np.column_stack([np.cos(angles), np.sin(angles)])
            cv2.fillPoly(im, [np.round(points * size).astype(np.int32)], (255, 255, 255))
            rows.append("0 " + " ".join(f"{v:.6f}" for v in points.ravel()))
        cv2.imwrite(str(root / "images" / f"{i}.png"), im)
        (root / "labels" / f"{i}.txt").write_text("\n".join(rows) + "\n")
    (root / "data.yaml").write_text("path: .\ntrain: images\nval: images\nnames: [blob]\n")
    return root / "data.yaml"


@pytest.mark.parametrize("overlap", [True, False])
def test_augmented_masks_stay_on_their_objects(tmp_path, overlap):
    """Mosaic, rotation, scale, shear, perspective, both flips and copy-paste move the polygons as the pixels:
    the masks cover the white pixels of the augmented image, and each target's mask lies in its box."""
    data = white_objects_dataset(tmp_path)
    hyp = AugmentConfig(hsv_h=0, hsv_s=0, hsv_v=0, degrees=20, translate=0.1, scale=0.4, shear=5,
                        perspective=0.0005, flipud=0.5, fliplr=0.5, mosaic=1.0, copy_paste=0.5)
    config = DataConfig(path=str(data), img_size=128, batch_size=2, workers=0, overlap_mask=overlap, mask_ratio=1)
    dataset = build_loaders(config, hyp, splits=("train",), kind="masks").train.dataset
    assert isinstance(dataset, SegmentationDataset)
    shares = []  # per sample: mask pixels near white ones, mask pixels, white pixels near masks, white pixels
    grow = np.ones((3, 3), np.uint8)  # rasterising and interpolation move edges by up to a pixel
    for key in [(i, epoch, True) for i in range(len(dataset)) for epoch in range(3)]:
        img, labels, _, _, masks = dataset[key]
        white = (img.min(2) > 127).astype(np.uint8)
        covered = (masks.max(0, initial=0) > 0).astype(np.uint8)
        near_white, near_covered = cv2.dilate(white, grow).astype(bool), cv2.dilate(covered, grow).astype(bool)
        # Masks on white, white under masks (objects the candidate rule dropped as too small excepted).
        shares.append((near_white[covered > 0].sum(), covered.sum(), near_covered[white > 0].sum(), white.sum()))
        rows = masks[0] if overlap else None
        for k, (_, cx, cy, w, h) in enumerate(labels):
            own = (rows == k + 1) if overlap else masks[k] > 0
            # Row and column 0 left out: points up to 1 px outside the image fill them (the reference
            # truncates polygon points to integers toward zero), though the box holds the inside ones only.
            ys, xs = np.nonzero(own[1:, 1:]) + np.ones((2, 1), int)
            if len(xs):
                x1, x2, y1, y2 = (cx - w / 2) * 128, (cx + w / 2) * 128, (cy - h / 2) * 128, (cy + h / 2) * 128
                assert x1 - 2 <= xs.min() and xs.max() <= x2 + 2 and y1 - 2 <= ys.min() and ys.max() <= y2 + 2
    on_white, masked, under_masks, whites = np.sum(shares, 0)
    assert masked > 5000 and on_white / masked > 0.98 and under_masks / whites > 0.95


def test_mixup_keeps_the_targets_and_masks_of_both_mosaics(tmp_path):
    data = white_objects_dataset(tmp_path)
    config = DataConfig(path=str(data), img_size=128, batch_size=3, workers=0)
    loader = build_loaders(config, AugmentConfig(mixup=1.0), splits=("train",), kind="masks").train
    batch = next(iter(loader))
    imgs, targets, paths, shapes, masks = batch.imgs, batch.targets, batch.paths, batch.shapes, batch.masks
    assert len(paths) == len(shapes) == 3 and shapes == [None] * 3  # mosaics
    assert imgs.shape == (3, 3, 128, 128) and masks.shape == (3, 32, 32) and masks.dtype == torch.float32
    for image in range(3):
        count = int((targets[:, 0] == image).sum())
        assert 0 < masks[image].max() <= count  # masks numbered by the image's target rows


def test_batches_of_per_target_masks(tmp_path):
    data = white_objects_dataset(tmp_path)
    config = DataConfig(path=str(data), img_size=128, batch_size=3, workers=0, overlap_mask=False)
    loaders = build_loaders(config, None, kind="masks")
    for loader in (loaders.train, loaders.val):
        batch = next(iter(loader))
        imgs, targets, paths, shapes, masks = batch.imgs, batch.targets, batch.paths, batch.shapes, batch.masks
        if loader is loaders.val:  # letterboxed: the reference's (original size, (ratio, pad))
            assert shapes[0][0] == (128, 128) and paths[0].suffix == ".png"
        assert masks.shape == (len(targets), imgs.shape[2] // 4, imgs.shape[3] // 4)
        assert set(masks.unique().tolist()) <= {0.0, 1.0} and (masks.sum((1, 2)) > 0).all()


def test_box_only_data_is_refused_for_segmentation_and_box_rows_are_left_out(tmp_path, coco_mini):
    config = DataConfig(path=str(coco_mini), img_size=64, batch_size=2, workers=0)
    with pytest.raises(ValueError) as info:
        build_loaders(config, None, splits=("train",), kind="masks")
    assert "has no polygon labels" in str(info.value) and "\n" not in str(info.value)
    files = write_split(tmp_path / "mixed", {"a": f"0 {SQUARE}\n0 0.5 0.5 0.2 0.2\n", "b": "0 0.5 0.5 0.2 0.2\n"})
    index = verify_split(files, 1, "train")
    with pytest.warns(DataWarning, match=r"^2 box-only label rows in 2 images have no polygon and are left out"):
        dataset = SegmentationDataset(index, 64, 2)
    assert [len(rows) for rows in dataset.labels] == [1, 0]


def test_shapes_dataset_has_polygons_whose_boxes_are_its_boxes(tmp_path):
    root = generate_shapes_dataset(tmp_path, n_train=12, n_val=2, img_size=96)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        index = verify_split(list_images(root / "images" / "train"), 2)
    for labels, polygons in zip(index.labels, index.segments):
        assert len(polygons) == len(labels) and all(len(p) >= 4 for p in polygons)
        boxes = np.array([[*p.min(0), *p.max(0)] for p in polygons])
        np.testing.assert_allclose((boxes[:, :2] + boxes[:, 2:]) / 2, labels[:, 1:3], atol=1e-5)
        np.testing.assert_allclose(boxes[:, 2:] - boxes[:, :2], labels[:, 3:5], atol=1e-5)
