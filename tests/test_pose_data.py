"""Pose data: kpt_shape and flip_idx read from the data YAML and checked; keypoint rows verified, cached and bad
ones named; keypoints moved with the pixels by mosaic, letterbox, perspective and flips (renumbered by flip_idx),
hidden when they leave the image; PoseBatch; coco8-pose read as Ultralytics reads it."""

import shutil
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import yaml
from conftest import SHARED, offline_ultralytics

from yolotrain.data.loaders import DataConfig, _classes, reference_rect_order
from yolotrain.data.pose import PoseBatch, PoseDataset, hide_outside, label_keypoints, with_visibility
from yolotrain.data.sources import KeypointLayout, list_images, resolve_source
from yolotrain.data.verify import DataWarning, cache_paths, verify_split

COCO8_POSE = SHARED / "datasets" / "coco8-pose"
# One colour per keypoint (RGB, as items are): the dot under a keypoint tells which keypoint it is.
PALETTE = np.array([(255, 0, 0), (0, 255, 0), (0, 0, 255)])
# A "person": a nose above a left and a right hand (offsets in pixels from its centre); mirrored, left is right.
OFFSETS = np.array([(0, -14), (-14, 10), (14, 10)])
FLIP_IDX = [0, 2, 1]
NO_FLIPS = {"hsv_h": 0, "hsv_s": 0, "hsv_v": 0, "fliplr": 0, "flipud": 0}


def write_yaml(root: Path, **entries) -> Path:
    config = {"path": str(root), "train": "images", "val": "images", "names": ["person"], **entries}
    (root / "data.yaml").write_text(yaml.safe_dump(config))
    return root / "data.yaml"


def write_split(root: Path, labels: dict[str, str], size: int = 64) -> list[Path]:
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir(parents=True)
    for stem, text in labels.items():
        cv2.imwrite(str(root / "images" / f"{stem}.png"), np.zeros((size, size, 3), np.uint8))
        (root / "labels" / f"{stem}.txt").write_text(text)
    return list_images(root / "images")


def dot_dataset(root: Path, dims: int = 3, n: int = 6, width: int = 160, height: int = 120) -> Path:
    """Images of people drawn as three coloured dots (their keypoints) in their boxes; returns the YAML."""
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        img = np.zeros((height, width, 3), np.uint8)
        rows = []
        for x_range in ((25, 60), (100, 135)):
            centre = np.array([rng.integers(*x_range), rng.integers(25, height - 25)])
            points = OFFSETS + centre
            for (x, y), colour in zip(points, PALETTE):
                cv2.circle(img, (int(x), int(y)), 4, tuple(int(c) for c in colour[::-1]), -1)  # BGR
            (x0, y0), (x1, y1) = points.min(0) - 8, points.max(0) + 9
            box = [(x0 + x1) / 2 / width, (y0 + y1) / 2 / height, (x1 - x0) / width, (y1 - y0) / height]
            centres = (points + 0.5) / (width, height)  # pixel centres
            values = np.concatenate((centres, np.full((3, 1), 2.0)), 1)[:, :dims]
            rows.append(" ".join(["0", *(f"{v:.6f}" for v in [*box, *values.ravel()])]))
        cv2.imwrite(str(root / "images" / f"{i}.png"), img)
        (root / "labels" / f"{i}.txt").write_text("\n".join(rows) + "\n")
    return write_yaml(root, kpt_shape=[3, dims], flip_idx=FLIP_IDX)


def pose_dataset(data: Path, **kwargs) -> PoseDataset:
    source = resolve_source(data)
    layout = source.keypoint_layout()
    index = verify_split(source.train, 1, "train", kpt_shape=layout.shape)
    kwargs.setdefault("img_size", 128)
    return PoseDataset(index, layout=layout, **kwargs)


def test_keypoint_layout_is_read_from_the_yaml_and_checked(tmp_path):
    write_split(tmp_path, {"a": ""})
    layout = resolve_source(write_yaml(tmp_path, kpt_shape=[3, 2], flip_idx=[0, 2, 1])).keypoint_layout()
    assert layout == KeypointLayout(3, 2, (0, 2, 1)) and layout.shape == (3, 2)
    assert resolve_source(write_yaml(tmp_path, kpt_shape=[3, 3])).keypoint_layout().flip_idx is None
    data = write_yaml(tmp_path)
    with pytest.raises(ValueError, match=r"data\.yaml: a pose dataset needs 'kpt_shape: \[K, D\]'"):
        resolve_source(data).keypoint_layout()
    for entries, message in [
        ({"kpt_shape": [3, 4]}, r"'kpt_shape' must be \[K, D\] with K >= 1 keypoints of D = 2 .*got \[3, 4\]"),
        ({"kpt_shape": "17"}, r"'kpt_shape' must be \[K, D\]"),
        ({"kpt_shape": [3, 3], "flip_idx": [0, 1]}, r"'flip_idx' has 2 entries, 'kpt_shape' 3 keypoints"),
        ({"kpt_shape": [3, 3], "flip_idx": [0, 1, 1]},
         r"'flip_idx' must name each keypoint 0\.\.2 once, got \[0, 1, 1\]"),
        ({"kpt_shape": [3, 3], "flip_idx": [0, 1, 3]}, r"'flip_idx' must name each keypoint 0\.\.2 once"),
        ({"kpt_shape": [3, 3], "flip_idx": "0 2 1"}, r"'flip_idx' must be a list of keypoint indices"),
        ({"flip_idx": [0, 2, 1]}, r"'flip_idx' without 'kpt_shape"),
    ]:
        data = write_yaml(tmp_path, **entries)
        with pytest.raises(ValueError, match=rf"^{data}: {message}") as raised:
            resolve_source(data)
        assert "\n" not in str(raised.value)


def test_keypoint_rows_are_verified_cached_and_bad_ones_named(tmp_path):
    good = "0 0.5 0.5 0.4 0.4 0.4 0.4 2 0.6 0.4 1 0 0 0"
    files = write_split(tmp_path, {
        "a": f"{good}\n"
             "0 0.5 0.5 0.4 0.4 0.4 0.4 2 0.6 0.4 1 0.5 0.6 2\n"   # the same box, other keypoints: kept
             f"{good}\n"                                            # a duplicate
             "0 0.5 0.5 0.4 0.4 0.4 0.4 2 0.6 0.4\n"                # 10 columns
             "0 0.5 0.5 0.4 0.4 0.4 0.4 2 1.2 0.4 1 0 0 0\n"        # keypoint 1 outside the image
             "0 0.5 0.5 0.4 0.4 0.4 0.4 2 0.6 0.4 3 0 0 0\n"        # visibility 3
             "0 0.5 0.5 0.4 0.4 -0.01 0.4 2 0.6 1.01 1 0 0 0\n",    # a hair outside: clipped
        "b": "0 0.5 0.5 0.4 0.4\n",                                 # a box alone: not a pose row
    })
    with pytest.warns(DataWarning) as caught:
        index = verify_split(files, 1, "train", kpt_shape=(3, 3))
    summary = str(caught[0].message)
    for kind, where in [("duplicate row removed", "a.txt:3"),
                        ("wrong column count", "a.txt:4: 10 columns, expected 14 (class, box and the keypoints"),
                        ("keypoint outside the image", "a.txt:5: keypoint 1 at 1.2 0.4"),
                        ("keypoint visibility not 0, 1 or 2", "a.txt:6: keypoint 1 visibility 3"),
                        ("wrong column count", "b.txt:1: 5 columns, expected 14")]:
        assert f" x {kind}: " in summary and where in summary, kind
    assert [len(k) for k in index.keypoints] == [len(rows) for rows in index.labels] == [3, 0]
    keypoints = index.keypoints[0]
    assert keypoints.shape == (3, 3, 3) and keypoints.dtype == np.float32
    np.testing.assert_allclose(keypoints[0], [[0.4, 0.4, 2], [0.6, 0.4, 1], [0, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(keypoints[1, 2], [0.5, 0.6, 2], atol=1e-6)
    np.testing.assert_allclose(keypoints[2, :2, :2], [[0, 0.4], [0.6, 1]], atol=1e-6)  # clipped
    assert index.keypoints[1].shape == (0, 3, 3)
    # The second pass reads the cache; a detection read of the same files keeps a cache of its own.
    assert cache_paths(files)[0].is_file()
    with pytest.warns(DataWarning):
        cached = verify_split(files, 1, "train", kpt_shape=(3, 3))
    np.testing.assert_array_equal(cached.keypoints[0], keypoints)
    with pytest.warns(DataWarning, match="wrong column count"):
        boxes = verify_split(files, 1, "train")
    assert boxes.keypoints is None and [len(rows) for rows in boxes.labels] == [0, 1]


def test_reordered_and_single_class_splits_keep_their_keypoints(tmp_path):
    source = resolve_source(dot_dataset(tmp_path, n=3))
    index = verify_split(source.train, 1, kpt_shape=(3, 3))
    reordered = index.select([2, 0])
    assert reordered.files == [index.files[2], index.files[0]]
    for i, j in ((0, 2), (1, 0)):
        np.testing.assert_array_equal(reordered.keypoints[i], index.keypoints[j])
        np.testing.assert_array_equal(reordered.labels[i], index.labels[j])
    assert reference_rect_order(index).keypoints is not None
    single = _classes(index, DataConfig(single_cls=True))
    assert single.keypoints is index.keypoints


def test_two_value_keypoints_and_visibility():
    keypoints = np.array([[[0.2, 0.3], [0, 0], [0.5, 0.5]]], np.float32)  # (0, 0): absent
    carried = with_visibility(keypoints)
    np.testing.assert_array_equal(carried[..., 2], [[2, 0, 2]])
    np.testing.assert_array_equal(label_keypoints(carried, 2), keypoints)
    moved = carried * (100, 100, 1) + (-30, 0, 0)  # the first keypoint leaves the image on the left
    hidden = hide_outside(moved, 100, 100)
    np.testing.assert_array_equal(hidden[0, :, 2], [0, 0, 2])
    np.testing.assert_allclose(hidden[0, 0, :2], [0, 30], atol=1e-4)  # clipped to the edge, as Ultralytics clips
    np.testing.assert_array_equal(label_keypoints(hidden / (100, 100, 1), 2)[0, 0], [0, 0])  # D = 2: absent


def dot_colours(img: np.ndarray, labels: np.ndarray, keypoints: np.ndarray) -> tuple[list[int], int]:
    """The palette index of the dot under each visible keypoint, after checking each lies in its row's box; and
    how many keypoints were out of view."""
    h, w = img.shape[:2]
    found, hidden = [], 0
    for row, points in zip(labels, keypoints):
        cx, cy, bw, bh = row[1:] * (w, h, w, h)
        for x, y, v in points:
            if v == 0:
                hidden += 1
                continue
            px, py = x * w, y * h
            assert cx - bw / 2 - 1.5 <= px <= cx + bw / 2 + 1.5 and cy - bh / 2 - 1.5 <= py <= cy + bh / 2 + 1.5
            colour = img[min(int(py), h - 1), min(int(px), w - 1)].astype(int)
            distance = np.abs(PALETTE - colour).sum(1)
            assert distance.min() < 150, (colour, (px, py))
            found.append(int(distance.argmin()))
    return found, hidden


@pytest.mark.parametrize(("flips", "mirrored"), [({}, False), ({"fliplr": 1.0}, True), ({"flipud": 1.0}, True),
                                                 ({"fliplr": 1.0, "flipud": 1.0}, False)])
def test_keypoints_stay_on_their_dots_through_mosaic_perspective_and_flips(tmp_path, flips, mirrored):
    data = dot_dataset(tmp_path)
    hyp = {**NO_FLIPS, "degrees": 20, "scale": 0.3, "translate": 0.1, "shear": 2, **flips}
    expected = np.array(FLIP_IDX) if mirrored else np.arange(3)
    for mosaic in (1.0, 0.0):
        dataset = pose_dataset(data, augment=True, hyp={**hyp, "mosaic": mosaic})
        seen = hidden = 0
        for epoch in range(3):
            for i in range(len(dataset)):
                img, labels, keypoints = dataset[(i, epoch, True)]
                assert keypoints.shape == (len(labels), 3, 3)
                found, out = dot_colours(img, labels, keypoints)
                visible = keypoints[..., 2] > 0
                np.testing.assert_array_equal(found, np.broadcast_to(expected, visible.shape)[visible])
                seen, hidden = seen + len(found), hidden + out
        assert seen > 60
        if mosaic:
            assert hidden > 0  # mosaic crops: some keypoints leave the image and are hidden


def test_letterboxed_keypoints_and_two_value_keypoints(tmp_path):
    data = dot_dataset(tmp_path, dims=2)
    dataset = pose_dataset(data, img_size=192)
    img, labels, keypoints = dataset[0]
    assert img.shape == (192, 192, 3) and keypoints.shape == (2, 3, 2)  # 160 x 120 scaled to 192 x 144, padded
    found, _ = dot_colours(img, labels, np.concatenate((keypoints, np.ones((2, 3, 1))), -1))
    assert found == [0, 1, 2, 0, 1, 2]
    # D = 2 under flips: keypoints still on their dots (renumbered), out-of-view ones written as (0, 0).
    dataset = pose_dataset(data, augment=True, hyp={**NO_FLIPS, "fliplr": 1.0, "scale": 0.3, "translate": 0.3})
    absent = 0
    for i in range(len(dataset)):
        img, labels, keypoints = dataset[i]
        visible = (keypoints != 0).any(-1, keepdims=True)
        absent += int((~visible).sum())
        found, _ = dot_colours(img, labels, np.concatenate((keypoints, visible), -1))
        assert found == list(np.broadcast_to(FLIP_IDX, visible.shape[:2])[visible[..., 0]])
    assert absent > 0


def test_without_flip_idx_flips_are_turned_off(tmp_path):
    data = dot_dataset(tmp_path)
    write_yaml(tmp_path, kpt_shape=[3, 3])
    with pytest.warns(DataWarning, match="no 'flip_idx'.*flips turned off"):
        dataset = pose_dataset(data, augment=True, hyp={**NO_FLIPS, "fliplr": 1.0})
    assert dataset.hyp.fliplr == dataset.hyp.flipud == 0
    img, labels, keypoints = dataset[0]
    found, _ = dot_colours(img, labels, keypoints)
    visible = keypoints[..., 2] > 0
    assert found and found == list(np.broadcast_to(np.arange(3), visible.shape)[visible])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pose_dataset(data)  # no augmentation: nothing to turn off
    with pytest.warns(DataWarning, match="wrong column count"):
        boxes = verify_split(resolve_source(data).train, 1)
    with pytest.raises(ValueError, match="verified without kpt_shape"):
        PoseDataset(boxes, layout=KeypointLayout(3, 3))


def test_mixup_and_batches(tmp_path):
    data = dot_dataset(tmp_path)
    dataset = pose_dataset(data, augment=True, hyp={**NO_FLIPS, "mixup": 1.0, "scale": 0.1})
    alone = pose_dataset(data, augment=True, hyp={**NO_FLIPS, "mixup": 0.0, "scale": 0.1})
    items = [dataset[i] for i in range(4)]
    added = 0
    for i, (_, labels, keypoints) in enumerate(items):
        # The first mosaic's rows come first (the same draws), then the second's.
        _, first_labels, first_keypoints = alone[i]
        n = len(first_labels)
        assert len(labels) == len(keypoints) >= n
        np.testing.assert_array_equal(labels[:n], first_labels)
        np.testing.assert_array_equal(keypoints[:n], first_keypoints)
        added += len(labels) - n
    assert added > 0
    batch = PoseDataset.collate(items)
    assert isinstance(batch, PoseBatch)
    counts = [len(item[1]) for item in items]
    assert batch.imgs.shape == (4, 3, 128, 128) and batch.targets.shape == (sum(counts), 6)
    assert batch.keypoints.shape == (sum(counts), 3, 3) and batch.keypoints.dtype == torch.float32
    np.testing.assert_array_equal(batch.targets[:, 0].numpy(), np.repeat(np.arange(4), counts))
    np.testing.assert_array_equal(batch.keypoints.numpy(), np.concatenate([item[2] for item in items]))
    imgs, targets = batch
    assert imgs is batch.imgs and targets is batch.targets
    uint8 = PoseDataset.collate(items, uint8=True)
    assert uint8.imgs.dtype == torch.uint8 and torch.equal(uint8.keypoints, batch.keypoints)
    empty = PoseDataset.collate([(items[0][0], np.zeros((0, 5), np.float32), np.zeros((0, 3, 3), np.float32))])
    assert empty.targets.shape == (0, 6) and empty.keypoints.shape == (0, 3, 3)


@pytest.fixture
def coco8_pose(tmp_path) -> Path:
    """A copy of coco8-pose (the label cache is written beside the labels)."""
    if not (COCO8_POSE / "images").is_dir():
        pytest.skip(f"shared dataset not found at {COCO8_POSE}")
    shutil.copytree(COCO8_POSE, tmp_path / "coco8-pose")
    return tmp_path / "coco8-pose" / "coco8-pose.yaml"


def test_coco8_pose_reads_as_ultralytics_reads_it(coco8_pose, tmp_path_factory):
    source = resolve_source(coco8_pose)
    layout = source.keypoint_layout()
    assert layout.shape == (17, 3) and layout.flip_idx[1:3] == (2, 1)
    index = verify_split(source.train + source.val, 1, kpt_shape=layout.shape)
    assert sum(len(k) for k in index.keypoints) == sum(len(rows) for rows in index.labels) > 0
    with offline_ultralytics(tmp_path_factory):
        from ultralytics.data.utils import verify_image_label

        from yolotrain.data.sources import img2label_path
        for file, rows, keypoints in zip(index.files, index.labels, index.keypoints):
            _, theirs, _, _, their_keypoints, *_ = verify_image_label(
                (str(file), str(img2label_path(file)), "", True, 1, 17, 3, False))
            np.testing.assert_allclose(rows, theirs, atol=1e-6)
            np.testing.assert_allclose(keypoints, their_keypoints, atol=1e-6)
    dataset = PoseDataset(index, img_size=320, augment=True, layout=layout)
    batch = PoseDataset.collate([dataset[i] for i in range(len(dataset))])
    assert batch.keypoints.shape == (len(batch.targets), 17, 3)
    xy = batch.keypoints[..., :2]
    assert (xy >= 0).all() and (xy <= 1).all() and set(batch.keypoints[..., 2].unique().tolist()) <= {0, 1, 2}
