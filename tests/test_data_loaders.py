"""get_loaders end to end on small datasets written into tmp_path: sources, batch contract,
rectangular batches, determinism across worker counts, epochs and the mosaic switch."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import yaml
from conftest import coco128_subset

from yolotrain.data import Batch, DetectionDataset, get_loaders
from yolotrain.data.dataset import rect_batch_shapes
from yolotrain.data.sources import img2label_path, resolve_source
from yolotrain.data.verify import DataWarning
from yolotrain.settings import ConfigError

FIXTURES = Path(__file__).parent / "fixtures" / "data"


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLOTRAIN_CACHE", str(tmp_path / "usercache"))


def write_split(root: Path, split: str, sizes: list[tuple[int, int]], nc: int = 2, seed: int = 0) -> None:
    """Write images of the given (w, h) sizes, each with one filled rectangle and its label."""
    rng = np.random.default_rng(seed)
    (root / "images" / split).mkdir(parents=True, exist_ok=True)
    (root / "labels" / split).mkdir(parents=True, exist_ok=True)
    for i, (w, h) in enumerate(sizes):
        im = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        x1, y1 = int(w * 0.2), int(h * 0.3)
        x2, y2 = int(w * 0.7), int(h * 0.8)
        im[y1:y2, x1:x2] = (0, 0, 255)
        cv2.imwrite(str(root / "images" / split / f"{i:03d}.png"), im)
        cx, cy, bw, bh = (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h
        row = f"{i % nc} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}\n"
        (root / "labels" / split / f"{i:03d}.txt").write_text(row)


@pytest.fixture
def tiny(tmp_path) -> Path:
    root = tmp_path / "tiny"
    sizes = [(96, 64), (64, 96), (80, 80), (120, 60), (60, 120), (100, 70), (70, 100), (64, 64)]
    write_split(root, "train", sizes)
    write_split(root, "val", [(128, 64), (64, 64), (64, 128)], seed=1)
    return root


def collect(loader, epochs=(0,)) -> list[Batch]:
    out = []
    for e in epochs:
        loader.dataset.set_epoch(e)
        out += list(loader)
    return out


def test_batch_contract(tiny):
    train, val = get_loaders(tiny, batch_size=4, num_classes=2, img_size=64, workers=0)
    for loader in (train, val):
        imgs, targets = next(iter(loader))
        assert imgs.dtype == torch.float32 and imgs.ndim == 4 and imgs.shape[1] == 3
        assert imgs.shape[2] % 32 == 0 and imgs.shape[3] % 32 == 0
        assert 0 <= imgs.min() and imgs.max() <= 1
        assert targets.dtype == torch.float32 and targets.shape[1] == 6
        assert set(targets[:, 0].long().tolist()) <= set(range(len(imgs)))
        assert ((targets[:, 2:] >= 0) & (targets[:, 2:] <= 1)).all()
        assert set(targets[:, 1].long().tolist()) <= {0, 1}
    assert len(train) == 2 and len(val) == 1


def test_val_letterbox_pad_boxes_and_rgb(tiny):
    _, val = get_loaders(tiny, batch_size=1, num_classes=2, img_size=64, workers=0)
    ds = val.dataset
    assert [tuple(int(v) for v in s) for s in ds.shapes] == [(128, 64), (64, 64), (64, 128)]  # sorted by h/w
    imgs, targets = next(iter(val))  # the 128x64 image: wide, so padded top and bottom
    # rect shape: long side 64 -> ceil(0.5 * 64 / 32 + 0.5) * 32 = 64 high, ceil(2 + 0.5) * 32 = 96 wide
    assert imgs.shape == (1, 3, 64, 96)
    assert torch.allclose(imgs[0, :, 0, :], torch.tensor(114 / 255))  # pad value
    _, cx, cy, w, h = targets[0, 1:].tolist()
    H, W = imgs.shape[2:]
    x1, y1, x2, y2 = (cx - w / 2) * W, (cy - h / 2) * H, (cx + w / 2) * W, (cy + h / 2) * H
    inside = imgs[0, :, int(y1) + 2:int(y2) - 2, int(x1) + 2:int(x2) - 2]
    assert torch.allclose(inside[0], torch.tensor(1.0)) and inside[2].max() == 0  # red (RGB order)


def test_rect_training_shapes_follow_reference_rule(tiny):
    train, _ = get_loaders(tiny, batch_size=3, num_classes=2, img_size=64, rect_training=True, workers=0)
    ds = train.dataset
    ar = ds.shapes[:, 1] / ds.shapes[:, 0]
    assert (np.diff(ar) >= 0).all()
    expected = rect_batch_shapes(ds.shapes, 3, 64, 32, 0.0)
    for b, (imgs, targets) in enumerate(collect(train) * 1):
        assert tuple(imgs.shape[2:]) == tuple(expected[b])
        assert len(targets) <= len(imgs)  # no mosaic: at most the image's own single box
    assert not ds.mosaic


def test_rect_batch_shapes_formula():
    # (w, h), sorted by h/w below
    shapes = np.array([[200, 100], [300, 100], [100, 100], [100, 300], [100, 150]])
    order = np.argsort(shapes[:, 1] / shapes[:, 0])
    got = rect_batch_shapes(shapes[order], 2, 640, 32, 0.5)
    # batch 0: h/w 1/3, 1/2 -> [max=0.5, 1]; batch 1: 1, 1.5 -> [1, 1]; batch 2: 3 -> [1, 1/3]
    want = np.ceil(np.array([[0.5, 1], [1, 1], [1, 1 / 3]]) * 640 / 32 + 0.5).astype(int) * 32
    np.testing.assert_array_equal(got, want)


def test_same_seed_same_batches_for_workers_0_and_2(tiny):
    a, _ = get_loaders(tiny, batch_size=4, num_classes=2, img_size=64, workers=0, seed=3)
    b, _ = get_loaders(tiny, batch_size=4, num_classes=2, img_size=64, workers=2, seed=3)
    assert b.num_workers == 2 and b.persistent_workers
    ba, bb = collect(a, (0, 1)), collect(b, (0, 1))
    assert len(ba) == len(bb) == 4
    for (ia, ta), (ib, tb) in zip(ba, bb):
        assert torch.equal(ia, ib) and torch.equal(ta, tb)
    assert not torch.equal(ba[0].imgs, ba[2].imgs)  # epoch 1 differs from epoch 0
    c, _ = get_loaders(tiny, batch_size=4, num_classes=2, img_size=64, workers=0, seed=4)
    assert not torch.equal(collect(c)[0].imgs, ba[0].imgs)


def test_close_mosaic_reaches_persistent_workers(tiny):
    train, _ = get_loaders(tiny, batch_size=8, num_classes=2, img_size=64, workers=2, seed=0)
    counts = np.bincount(collect(train)[0].targets[:, 0].long().numpy(), minlength=8)
    assert counts.max() > 1  # mosaic: 4 images, so several boxes per sample
    train.dataset.close_mosaic()
    train.dataset.set_epoch(1)
    imgs, targets = next(iter(train))
    assert np.bincount(targets[:, 0].long().numpy(), minlength=8).max() <= 1
    assert imgs.shape[2:] == (64, 64)


def test_augment_false_is_plain_letterbox(tiny):
    train, _ = get_loaders(tiny, batch_size=8, num_classes=2, img_size=64, workers=0, augment=False)
    imgs, targets = next(iter(train))
    assert len(targets) == 8 and imgs.shape == (8, 3, 64, 64)
    _, targets2 = next(iter(train))
    assert torch.equal(torch.sort(targets[:, 2])[0], torch.sort(targets2[:, 2])[0])


def test_default_workers_and_hyp_override(tiny):
    hyp = {"fliplr": 0.0, "mosaic": 0.0}
    train, val = get_loaders(tiny, batch_size=2, num_classes=2, img_size=64, hyp=hyp)
    assert train.num_workers == min(2, os.cpu_count()) == val.num_workers
    assert train.dataset.hyp.fliplr == 0.0 and train.dataset.hyp.scale == 0.5
    with pytest.raises(ConfigError, match="unknown setting 'fliplrr'; did you mean 'fliplr'"):
        get_loaders(tiny, batch_size=2, num_classes=2, img_size=64, hyp={"fliplrr": 0.0})


def test_errors_name_the_path(tiny, tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        get_loaders(tmp_path / "nowhere", 2, 2)
    (tmp_path / "noimages").mkdir()
    with pytest.raises(FileNotFoundError, match="noimages"):
        get_loaders(tmp_path / "noimages", 2, 2)
    (tiny / "labels" / "train" / "003.txt").write_text("5 0.5 0.5 0.2 0.2\n")
    for f in list((tiny / "labels" / "train").glob("*.txt"))[:5]:
        f.write_text("5 0.5 0.5 0.2 0.2\n")
    with pytest.raises(ValueError, match=r"labels/train/\d+\.txt:1: class id 5 >= num_classes 2"), \
            pytest.warns(DataWarning, match="5 x class id >= num_classes"):
        get_loaders(tiny, 2, 2, img_size=64, workers=0)
    with pytest.raises(ValueError, match="multiple of 32"):
        get_loaders(tiny, 2, 2, img_size=100)


def test_yaml_source_names_lists_and_no_val(tiny, tmp_path):
    (tiny / "train.txt").write_text("".join(f"./images/train/{i:03d}.png\n" for i in range(5)))
    cfg = tmp_path / "cfg" / "data.yaml"
    cfg.parent.mkdir()
    rel = os.path.relpath(tiny, cfg.parent)
    spec = {"path": rel, "train": "train.txt", "val": "images/val", "names": {0: "a", 1: "b"}}
    cfg.write_text(yaml.safe_dump(spec))
    src = resolve_source(cfg)
    assert src.names == ["a", "b"] and len(src.train) == 5 and len(src.val) == 3
    cfg.write_text(yaml.safe_dump({"path": str(tiny), "train": "images/train", "names": ["a", "b"]}))
    with pytest.warns(UserWarning, match="no 'val' split"):
        assert resolve_source(cfg).val == resolve_source(cfg).train
    cfg.write_text(yaml.safe_dump({"path": str(tiny), "train": "images/missing", "names": ["a"]}))
    with pytest.raises(FileNotFoundError, match="images/missing"):
        resolve_source(cfg)


def test_folder_source_2017_names_and_missing_val(tmp_path):
    root = tmp_path / "coco"
    write_split(root, "train2017", [(64, 64)] * 3)
    write_split(root, "val2017", [(64, 64)] * 2)
    src = resolve_source(root)
    assert len(src.train) == 3 and len(src.val) == 2
    shutil.rmtree(root / "images" / "val2017")
    with pytest.warns(UserWarning, match="validating on the training images"):
        assert resolve_source(root).val == src.train
    label = img2label_path(root / "images" / "train2017" / "x.images.png")
    assert label == root / "labels" / "train2017" / "x.images.txt"


def test_coco_fixture_batches(tmp_path):
    root = tmp_path / "coco_mini"
    shutil.copytree(FIXTURES / "coco_mini", root)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # clean real data: no warnings at all
        train, val = get_loaders(root / "data.yaml", batch_size=3, num_classes=80, img_size=128, workers=0)
    assert train.dataset.names[0] == "person"
    for imgs, targets in collect(train):
        assert imgs.shape[2:] == (128, 128) and len(targets) > 0
    n = sum(len(t) for _, t in val)
    assert n == sum(len(lab) for lab in val.dataset.labels)  # val keeps every box
    assert isinstance(train.dataset, DetectionDataset)


def test_coco128_read_only_dataset(tmp_path, coco128):
    # The shared folder itself may be writable (and root writes anyway): a linked copy whose label folder
    # has no write bits is read-only for the library, whoever runs the test.
    data = coco128_subset(tmp_path / "coco128", 128, coco128)
    labels = data.parent / "labels"
    labels.chmod(0o555)
    try:
        train, val = get_loaders(data, batch_size=8, num_classes=80, img_size=320, workers=0)
    finally:
        labels.chmod(0o755)
    imgs, targets = next(iter(train))
    assert imgs.shape == (8, 3, 320, 320) and len(targets) > 0
    assert len(val.dataset) == 128
    assert sorted(p.name for p in labels.iterdir()) == ["val"]  # cache went to the user folder
    assert list((tmp_path / "usercache" / "labels").glob("*.cache"))
