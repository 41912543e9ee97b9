"""Oriented-box data: DOTA-style rows read by the polygon reader, bad ones named; rectangles moved with the pixels
by mosaic, perspective (rotation) and flips, cut at the image's edge keeping their angle, and turned into rotated
boxes; batches of [N, 7] targets; dota8 read as Ultralytics reads it."""

import math
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import SHARED, offline_ultralytics

from yolotrain.data.obb import OBBDataset, clip_rectangles, join_polygons
from yolotrain.data.sources import list_images, resolve_source
from yolotrain.data.verify import DataWarning, verify_split
from yolotrain.rotated import corners_to_xywhr, xywhr_to_corners

DOTA8 = SHARED / "datasets" / "dota8"
NO_FLIPS = {"hsv_h": 0, "hsv_s": 0, "hsv_v": 0, "fliplr": 0, "flipud": 0}


def corners_row(cls: int, box: tuple[float, ...], width: int, height: int) -> str:
    """A DOTA-style label row of the rotated pixel box (cx, cy, w, h, angle)."""
    corners = xywhr_to_corners(np.array(box, np.float64)) / (width, height)
    return " ".join([str(cls), *(f"{v:.6f}" for v in corners.ravel())])


def rectangles_dataset(root: Path, n: int = 6, size: int = 192) -> list[Path]:
    """Images of white rotated rectangles on black, labelled by their corners; returns the image files."""
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        img = np.zeros((size, size, 3), np.uint8)
        rows = []
        for k, centre in enumerate([(50, 50), (140, 56), (96, 140)]):
            box = (*centre, rng.uniform(36, 56), rng.uniform(18, 26), rng.uniform(-math.pi, math.pi))
            cv2.fillPoly(img, [np.round(xywhr_to_corners(np.array(box)) - 0.5).astype(np.int32)], (255, 255, 255))
            rows.append(corners_row(k % 2, box, size, size))
        cv2.imwrite(str(root / "images" / f"{i}.png"), img)
        (root / "labels" / f"{i}.txt").write_text("\n".join(rows) + "\n")
    return list_images(root / "images")


def assert_boxes_on_rectangles(img: np.ndarray, rows: np.ndarray) -> int:
    """Each row's rotated box covers the white rectangle under it (and, wholly in view, matches it); returns how
    many rows were wholly in view."""
    h, w = img.shape[:2]
    white = (img.min(-1) > 160).astype(np.uint8)
    _, components = cv2.connectedComponents(white)
    whole = 0
    for row in rows:
        corners = xywhr_to_corners(row[1:].astype(np.float64) * (w, h, w, h, 1))
        mask = np.zeros((h, w), np.uint8)
        cv2.fillPoly(mask, [np.round(corners * 16 - 8).astype(np.int32)], 1, shift=4)
        mask = mask.astype(bool)
        under = components[mask]
        assert (under > 0).any(), row
        rectangle = components == np.bincount(under[under > 0]).argmax()
        assert (rectangle & mask).sum() / rectangle.sum() > 0.85, row
        if (corners >= 0).all() and (corners[:, 0] <= w).all() and (corners[:, 1] <= h).all():
            assert (rectangle & mask).sum() / (rectangle | mask).sum() > 0.75, row
            whole += 1
    return whole


def test_rows_are_read_by_the_polygon_reader_and_become_rotated_boxes(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    cv2.imwrite(str(tmp_path / "images" / "a.png"), np.zeros((100, 200, 3), np.uint8))
    (tmp_path / "labels" / "a.txt").write_text(
        corners_row(1, (100, 50, 60, 20, math.pi / 6), 200, 100) + "\n"
        "0 0.5 0.5 0.2 0.6\n"                                  # a box alone: its axis-aligned rectangle
        "0 0.1 0.1 0.3 0.1 0.3 0.3\n"                          # 7 columns: a triangle, read as a polygon
        "0 0.1 0.1 0.3 0.1 0.3 0.3 0.1\n"                      # 8 columns
        "0 0.1 0.1 0.3 0.1 0.3 1.3 0.1 0.3\n")                 # a corner far outside
    with pytest.warns(DataWarning) as caught:
        index = verify_split(list_images(tmp_path / "images"), 2, "train")
    summary = str(caught[0].message)
    assert "1 x wrong column count: " in summary and "a.txt:4: 8 columns" in summary
    assert "1 x polygon point outside the image: " in summary and "a.txt:5" in summary
    # Letterboxed into 256 x 256 (scaled by 1.28, 64 px of padding above and below).
    img, rows = OBBDataset(index, img_size=256)[0]
    assert img.shape == (256, 256, 3) and rows.shape == (3, 6) and rows.dtype == np.float32
    np.testing.assert_allclose(rows[0], [1, 0.5, 0.5, 60 * 1.28 / 256, 20 * 1.28 / 256, math.pi / 6], atol=1e-4)
    np.testing.assert_allclose(rows[1], [0, 0.5, 0.5, 0.6 * 128 / 256, 0.2 * 256 / 256, math.pi / 2], atol=1e-4)
    assert rows[2, 0] == 0 and -math.pi / 4 <= rows[2, 5] < 3 * math.pi / 4


def test_clipping_keeps_the_angle_and_bounds_the_visible_part():
    box = np.array([95, 50, 40, 10, math.pi / 5])  # crosses the right edge of a 100 x 100 image
    inside = np.array([30, 30, 20, 8, 0.3])
    outside = np.array([150, 50, 20, 8, 0.3])
    polygons = join_polygons([xywhr_to_corners(np.stack([box, inside, outside]))])
    clipped, boxes = clip_rectangles(polygons, 100, 100)
    np.testing.assert_array_equal(clipped[1], polygons[1])  # wholly inside: unchanged
    np.testing.assert_array_equal(boxes[1], [*polygons[1].min(0), *polygons[1].max(0)])
    assert (clipped[2] == 0).all() and (boxes[2] == 0).all()  # wholly outside: an empty box
    cut = corners_to_xywhr(clipped[:1])[0]
    assert cut[4] == pytest.approx(box[4], abs=1e-4) and cut[3] == pytest.approx(box[3], abs=1e-3)
    assert cut[2] < box[2]  # shortened to the visible part
    assert boxes[0, 2] == pytest.approx(100) and boxes[0, 0] == pytest.approx(polygons[0, :, 0].min())
    # The visible part lies in the cut rectangle.
    visible = polygons[0].astype(np.float32)
    visible[:, 0] = visible[:, 0].clip(None, 100)
    assert all(cv2.pointPolygonTest(clipped[0].astype(np.float32), tuple(map(float, p)), True) > -1e-3
               for p in polygons[0] if p[0] <= 100)


@pytest.mark.parametrize("hyp", [{"fliplr": 0.5, "flipud": 0.5}, {"mosaic": 0.0, "fliplr": 1.0},
                                 {"mosaic": 0.0, "flipud": 1.0}])
def test_rotated_boxes_stay_on_their_rectangles_through_mosaic_perspective_and_flips(tmp_path, hyp):
    index = verify_split(rectangles_dataset(tmp_path), 2, "train")
    dataset = OBBDataset(index, img_size=160, augment=True,
                         hyp={**NO_FLIPS, "degrees": 45, "scale": 0.3, "translate": 0.2, **hyp})
    rows = whole = 0
    for epoch in range(3):
        for i in range(len(dataset)):
            img, labels = dataset[(i, epoch, True)]
            assert labels.shape[1] == 6
            whole += assert_boxes_on_rectangles(img, labels)
            rows += len(labels)
            assert (labels[:, 3] >= labels[:, 4]).all()  # canonical: w the longer side
    assert whole > 30 and rows > whole  # some cut at the edge, most whole


def test_tiny_rows_are_dropped_and_batches_are_n_by_7(tmp_path):
    index = verify_split(rectangles_dataset(tmp_path), 2, "train")
    # Rotated boxes shrunk to a few pixels are dropped by the box filter, as for detection.
    tiny = OBBDataset(index, img_size=160, augment=True, hyp={**NO_FLIPS, "mosaic": 0.0, "scale": 0.95,
                                                                "translate": 0})
    rows = np.concatenate([tiny[(i, epoch, False)][1] for epoch in range(8) for i in range(6)])
    assert len(rows) and (rows[:, 3:5] * 160 > 2).all()
    # Without the rule on the rotated box's sides, thin boxes turned by 45 degrees would pass (their axis-aligned
    # box is large): here the source rectangles are at most 26 px thin, shrunk by up to 0.05 * 160 / 192.
    assert (rows[:, 4] * 160 < 6).any()
    dataset = OBBDataset(index, img_size=160, augment=True, hyp={**NO_FLIPS, "mixup": 1.0})
    items = [dataset[i] for i in range(4)]
    batch = OBBDataset.collate(items)
    counts = [len(rows) for _, rows in items]
    assert batch.imgs.shape == (4, 3, 160, 160) and batch.targets.shape == (sum(counts), 7)
    np.testing.assert_array_equal(batch.targets[:, 0].numpy(), np.repeat(np.arange(4), counts))
    np.testing.assert_allclose(batch.targets[:, 1:].numpy(), np.concatenate([rows for _, rows in items]))
    imgs, targets = batch
    assert imgs.dtype == torch.float32 and targets is batch.targets
    assert OBBDataset.collate(items, uint8=True).imgs.dtype == torch.uint8
    empty = OBBDataset.collate([(items[0][0], np.zeros((0, 6), np.float32))])
    assert empty.targets.shape == (0, 7)


@pytest.fixture
def dota8(tmp_path) -> Path:
    """A copy of dota8 (the label cache is written beside the labels)."""
    if not (DOTA8 / "images").is_dir():
        pytest.skip(f"shared dataset not found at {DOTA8}")
    shutil.copytree(DOTA8, tmp_path / "dota8")
    return tmp_path / "dota8" / "dota8.yaml"


def test_dota8_reads_as_ultralytics_reads_it(dota8, tmp_path_factory):
    source = resolve_source(dota8)
    with pytest.warns(DataWarning, match="polygon point outside the image"):
        index = verify_split(source.train + source.val, len(source.names))
    dataset = OBBDataset(index, img_size=512)
    with offline_ultralytics(tmp_path_factory):
        from ultralytics.utils.ops import xyxyxyxy2xywhr

        for i in range(len(dataset)):
            _, rows = dataset[i]
            if not len(rows):
                continue
            assert tuple(dataset.shapes[i]) == (1024, 1024)  # halved into 512
            corners = np.stack(index.segments[dataset.order[i]]) * 512
            theirs = xyxyxyxy2xywhr(corners.reshape(len(corners), 8)) / (512, 512, 512, 512, 1)
            np.testing.assert_allclose(rows[:, 1:], theirs, atol=1e-4)
    train = OBBDataset(index, img_size=512, augment=True, hyp={"degrees": 30})
    batch = OBBDataset.collate([train[i] for i in range(len(train))])
    targets = batch.targets
    assert targets.shape[1] == 7 and len(targets) > 0 and torch.isfinite(targets).all()
    assert (targets[:, 4] >= targets[:, 5]).all() and (targets[:, 6] >= -math.pi / 4).all()
    assert (targets[:, 6] < 3 * math.pi / 4).all() and (targets[:, 1] < len(source.names)).all()
