"""Synthetic shapes dataset: deterministic bytes, cached reuse, valid labels, command line."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

from yolotrain.cli import main
from yolotrain.data import generate_shapes_dataset, get_loaders
from yolotrain.data.sources import list_images
from yolotrain.data.verify import verify_split

SMALL = {"n_train": 6, "n_val": 3, "img_size": 64}
SRC = Path(__file__).resolve().parents[1] / "src"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_gives_identical_bytes_and_other_seed_differs(tmp_path):
    a = generate_shapes_dataset(tmp_path / "a", seed=1, **SMALL)
    b = generate_shapes_dataset(tmp_path / "b", seed=1, **SMALL)
    fa = _files(a)
    assert fa == _files(b)
    assert len([k for k in fa if k.startswith("images/train/")]) == 6
    assert len([k for k in fa if k.startswith("labels/val/")]) == 3
    c = generate_shapes_dataset(tmp_path / "a", seed=2, **SMALL)
    assert c != a and _files(c)["images/train/00000.jpg"] != fa["images/train/00000.jpg"]


def test_reuses_existing_folder_and_keys_by_parameters(tmp_path):
    a = generate_shapes_dataset(tmp_path, **SMALL)
    stamp = (a / "images" / "train" / "00000.jpg").stat().st_mtime_ns
    assert generate_shapes_dataset(tmp_path, **SMALL) == a
    assert (a / "images" / "train" / "00000.jpg").stat().st_mtime_ns == stamp
    assert generate_shapes_dataset(tmp_path, **{**SMALL, "n_val": 4}) != a
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]  # temp folders cleaned up


def test_labels_are_valid_and_varied(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLOTRAIN_CACHE", str(tmp_path / "cache"))
    root = generate_shapes_dataset(tmp_path, n_train=20, n_val=2, img_size=96)
    cfg = yaml.safe_load((root / "data.yaml").read_text())
    assert cfg["names"] == ["circle", "rectangle"] and cfg["train"] == "images/train"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # generator output needs no repair
        index = verify_split(list_images(root / "images" / "train"), 2)
    counts = np.array([len(lab) for lab in index.labels])
    assert counts.min() >= 1 and counts.max() <= 6 and len(set(counts)) > 2
    boxes = np.concatenate(index.labels)
    assert set(boxes[:, 0].astype(int)) == {0, 1}
    aspect = boxes[:, 3] / boxes[:, 4]
    assert aspect.min() < 0.7 and aspect.max() > 1.4 and boxes[:, 3].max() / boxes[:, 3].min() > 3
    assert (index.shapes == 96).all()


def test_default_root_and_command_line(tmp_path):
    env = {**os.environ, "YOLOTRAIN_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-m", "yolotrain", "data", "shapes", "--n-train", "4", "--n-val", "2",
                          "--img-size", "64"], capture_output=True, text=True, env=env, check=True)
    path = Path(out.stdout.strip())
    assert path.parent == tmp_path / "cache" / "shapes" and (path / "data.yaml").is_file()
    assert "RuntimeWarning" not in out.stderr


def test_main_with_root(tmp_path, capsys):
    argv = ["data", "shapes", "--root", str(tmp_path / "r"), "--n-train", "4", "--n-val", "2", "--img-size", "64"]
    assert main(argv) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.parent == tmp_path / "r" and (path / "labels" / "val" / "00001.txt").is_file()


def test_loads_through_get_loaders(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLOTRAIN_CACHE", str(tmp_path / "cache"))
    root = generate_shapes_dataset(**SMALL)
    assert root.parent == tmp_path / "cache" / "shapes"
    train, val = get_loaders(root, batch_size=3, num_classes=2, img_size=64, workers=0)
    imgs, targets = next(iter(train))
    assert imgs.shape == (3, 3, 64, 64) and len(targets) > 0
    assert len(val.dataset) == 3


def _rows(root: Path, split: str = "train") -> list[np.ndarray]:
    return [np.loadtxt(f, ndmin=2) for f in sorted((root / "labels" / split).glob("*.txt"))]


def test_the_pose_variant_labels_each_objects_corners_as_keypoints(tmp_path):
    root = generate_shapes_dataset(tmp_path, n_train=30, n_val=2, img_size=96, labels="pose")
    cfg = yaml.safe_load((root / "data.yaml").read_text())
    assert cfg["kpt_shape"] == [4, 3] and cfg["flip_idx"] == [1, 0, 3, 2] and cfg["names"] == ["circle", "rectangle"]
    rows = np.concatenate(_rows(root))
    assert rows.shape[1] == 5 + 4 * 3
    cls, box, kpts = rows[:, 0], rows[:, 1:5], rows[:, 5:].reshape(-1, 4, 3)
    corners = np.stack([box[:, :2] + box[:, 2:] / 2 * sign for sign in np.array([[-1, -1], [1, -1], [1, 1],
                                                                                  [-1, 1]])], 1)
    rectangles, circles = cls == 1, cls == 0
    assert rectangles.any() and circles.any()
    np.testing.assert_allclose(kpts[rectangles, :, :2], corners[rectangles], atol=2e-6)
    # A circle's keypoints are on its ellipse: ((x - cx) / (w / 2))^2 + ((y - cy) / (h / 2))^2 = 1.
    on_ellipse = (((kpts[circles, :, :2] - box[circles, None, :2]) / (box[circles, None, 2:] / 2)) ** 2).sum(-1)
    np.testing.assert_allclose(on_ellipse, 1.0, atol=1e-4)
    assert set(np.unique(kpts[..., 2])) == {1.0, 2.0}  # some keypoints lie under a later object's box
    # The same drawings as the polygon labels' dataset: only the label files differ.
    polygons = generate_shapes_dataset(tmp_path, n_train=30, n_val=2, img_size=96)
    assert (polygons / "images/train/00003.jpg").read_bytes() == (root / "images/train/00003.jpg").read_bytes()
    objects = sum(len(f.read_text().splitlines()) for f in (polygons / "labels" / "train").glob("*.txt"))
    assert objects == len(rows)


def test_the_obb_variant_labels_turned_objects_by_their_rotated_boxes(tmp_path):
    import cv2

    size = 128
    root = generate_shapes_dataset(tmp_path, n_train=20, n_val=2, img_size=size, labels="obb")
    assert "kpt_shape" not in yaml.safe_load((root / "data.yaml").read_text())
    files = _rows(root)
    rows = np.concatenate(files)
    assert rows.shape[1] == 9 and set(rows[:, 0].astype(int)) == {0, 1}
    corners = rows[:, 1:].reshape(-1, 4, 2) * size
    assert (corners >= -1e-3).all() and (corners <= size + 1e-3).all()
    sides = np.roll(corners, -1, 1) - corners
    lengths = np.linalg.norm(sides, axis=-1)
    np.testing.assert_allclose(lengths[:, 0], lengths[:, 2], atol=1e-3)  # a rectangle: opposite sides equal,
    np.testing.assert_allclose((sides[:, 0] * sides[:, 1]).sum(-1), 0, atol=1e-2)  # and square corners
    angles = np.degrees(np.arctan2(sides[:, 0, 1], sides[:, 0, 0])) % 90
    assert np.ptp(angles) > 60  # turned by any angle, not axis-aligned
    # Each rectangle's dark outline runs along its rotated box: its sides' middles are dark where no later object
    # covers them.
    dark, seen = 0, 0
    for i, labels in enumerate(files):
        im = cv2.imread(str(root / "images" / "train" / f"{i:05d}.jpg"))
        for row in labels[labels[:, 0] == 1]:
            quad = row[1:].reshape(4, 2) * size
            middles = (quad + np.roll(quad, -1, 0)) / 2
            pixels = im[np.clip(middles[:, 1].round().astype(int), 0, size - 1),
                        np.clip(middles[:, 0].round().astype(int), 0, size - 1)]
            dark += int((pixels.max(-1) < 100).sum())
            seen += 4
    assert seen >= 20 and dark / seen > 0.8


def test_an_unknown_label_kind_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="labels must be one of polygons, pose, obb, got 'keypoints'"):
        generate_shapes_dataset(tmp_path, labels="keypoints", **SMALL)


def test_command_line_makes_each_variant(tmp_path, capsys):
    for kind in ("pose", "obb"):
        assert main(["data", "shapes", "--root", str(tmp_path), "--labels", kind, "--n-train", "2", "--n-val", "1",
                     "--img-size", "64"]) == 0
        path = Path(capsys.readouterr().out.strip())
        assert path.name.startswith(f"shapes-{kind}-") and (path / "labels" / "val" / "00000.txt").is_file()


def test_the_variants_load_as_keypoint_and_rotated_box_batches(tmp_path):
    from yolotrain.data.augment import AugmentConfig
    from yolotrain.data.loaders import DataConfig, build_loaders

    pose = generate_shapes_dataset(tmp_path, n_train=4, n_val=2, img_size=64, labels="pose")
    loaders = build_loaders(DataConfig(path=str(pose / "data.yaml"), img_size=64, batch_size=2, workers=0),
                            AugmentConfig(), kind="keypoints")
    batch = next(iter(loaders.train))
    assert batch.keypoints.shape == (len(batch.targets), 4, 3) and len(batch.targets) > 0
    val = next(iter(loaders.val))
    assert val.keypoints.shape[1:] == (4, 3) and set(val.keypoints[..., 2].unique().tolist()) <= {0.0, 1.0, 2.0}
    obb = generate_shapes_dataset(tmp_path, n_train=4, n_val=2, img_size=64, labels="obb")
    loaders = build_loaders(DataConfig(path=str(obb / "data.yaml"), img_size=64, batch_size=2, workers=0),
                            AugmentConfig(), kind="rotated")
    targets = next(iter(loaders.val)).targets
    assert targets.shape[1] == 7 and len(targets) > 0
    assert ((targets[:, 6] >= -np.pi / 4) & (targets[:, 6] < 3 * np.pi / 4)).all()
    with pytest.raises(ValueError, match="needs 'kpt_shape"):
        build_loaders(DataConfig(path=str(obb / "data.yaml"), img_size=64, batch_size=2, workers=0), None,
                      kind="keypoints")
