"""``yolotrain data split``: large oriented-box images cut into overlapping tiles with their labels, the windows
and the labels each keeps as Ultralytics' ``data/split_dota.py`` chooses them."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import pytest

from yolotrain.cli import main
from yolotrain.data.tiles import shares_inside, split_oriented_dataset, tile_windows
from yolotrain.yamlio import read_yaml

DOTA8 = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "dota8"


@pytest.mark.parametrize(("height", "width", "size", "gap"), [(1024, 1024, 512, 128), (700, 2000, 640, 100),
                                                              (300, 400, 1024, 200), (1500, 1100, 1024, 200)])
def test_windows_are_the_references(tmp_path, monkeypatch, height, width, size, gap):
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("ULTRALYTICS_CONFIG_DIR", str(tmp_path))
    split_dota = pytest.importorskip("ultralytics.data.split_dota")
    expected = split_dota.get_windows((height, width), crop_sizes=(size,), gaps=(gap,))
    np.testing.assert_array_equal(tile_windows(height, width, size, gap), expected)


def test_a_label_goes_to_the_windows_holding_enough_of_it():
    square = np.array([[[90.0, 10.0], [110.0, 10.0], [110.0, 30.0], [90.0, 30.0]]])
    windows = np.array([[0, 0, 100, 100], [95, 0, 195, 100], [200, 0, 300, 100]])
    np.testing.assert_allclose(shares_inside(square, windows), [[0.5, 0.75, 0.0]])


def _dataset(root: Path) -> Path:
    for kind in ("images", "labels"):
        for split in ("train", "val"):
            (root / kind / split).mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        cv2.imwrite(str(root / "images" / split / "big.png"), rng.integers(0, 255, (300, 500, 3), np.uint8))
        corners = np.array([[20, 30], [60, 20], [70, 60], [30, 70]]) / (500, 300)
        far = np.array([[400, 190], [480, 190], [480, 270], [400, 270]]) / (500, 300)
        rows = [f"{c} " + " ".join(f"{v:.6f}" for v in p.reshape(-1)) for c, p in ((0, corners), (1, far))]
        (root / "labels" / split / "big.txt").write_text("\n".join(rows) + "\n")
    (root / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\nnames:\n  0: a\n  1: b\n")
    return root / "data.yaml"


def test_split_writes_tiles_whose_labels_map_back_to_the_image(tmp_path):
    data = _dataset(tmp_path / "big")
    assert main(["data", "split", str(data), "--out", str(tmp_path / "tiles"), "--size", "256", "--gap", "64"]) == 0
    out = tmp_path / "tiles"
    assert read_yaml(out / "data.yaml")["names"] == {0: "a", 1: "b"}
    original = np.array([[20, 30], [60, 20], [70, 60], [30, 70]], np.float64)
    tiles = sorted((out / "images" / "train").iterdir())
    assert [t.name for t in tiles] == ["big__256__0___0.jpg", "big__256__0___44.jpg", "big__256__192___0.jpg",
                                       "big__256__192___44.jpg", "big__256__244___0.jpg", "big__256__244___44.jpg"]
    for tile in tiles:
        x0, y0 = (int(v) for v in tile.stem.split("__", 2)[2].split("___"))
        assert cv2.imread(str(tile)).shape[:2] == (256, 256)
        for row in (out / "labels" / "train" / f"{tile.stem}.txt").read_text().splitlines():
            cls, *values = row.split()
            points = np.array(values, np.float64).reshape(4, 2) * 256 + (x0, y0)
            expected = original if cls == "0" else np.array([[400, 190], [480, 190], [480, 270], [400, 270]])
            np.testing.assert_allclose(points, expected, atol=0.01)
    kept = {t.stem: (out / "labels" / "train" / f"{t.stem}.txt").read_text().count("\n") for t in tiles}
    # the first label: whole inside the first tile, less than 0.7 of it inside the one below; the other: 0.6 of it
    # inside x 192..448
    assert kept == {"big__256__0___0": 1, "big__256__0___44": 0, "big__256__192___0": 0, "big__256__192___44": 0,
                    "big__256__244___0": 1, "big__256__244___44": 1}


@pytest.mark.skipif(not DOTA8.is_dir(), reason="needs ../shared/datasets/dota8")
def test_dota8_splits_into_tiles_a_loader_reads(tmp_path):
    from yolotrain.data.loaders import DataConfig, build_loaders

    data = split_oriented_dataset(DOTA8 / "dota8.yaml", tmp_path / "dota8-512", size=512, gap=128)
    assert len(os.listdir(tmp_path / "dota8-512" / "images" / "train")) == 4 * 9
    loaders = build_loaders(DataConfig(path=str(data), img_size=512, batch_size=4, workers=0), splits=("val",),
                            kind="rotated")
    batch = next(iter(loaders.val))
    assert batch.targets.shape[1] == 7 and len(batch.targets) > 0
