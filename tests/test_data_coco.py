"""COCO instances JSON → YOLO labels, on a handmade annotation file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from yolotrain.data.coco import coco_to_yolo


@pytest.fixture
def coco(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    for name in ("a.jpg", "b.jpg", "c.jpg"):
        (images / name).write_bytes(b"")  # only existence is checked
    data = {
        "images": [{"id": 1, "file_name": "a.jpg", "width": 200, "height": 100},
                   {"id": 2, "file_name": "b.jpg", "width": 50, "height": 50},
                   {"id": 7, "file_name": "c.jpg", "width": 10, "height": 10}],
        "categories": [{"id": 90, "name": "toothbrush"}, {"id": 1, "name": "person"},
                       {"id": 3, "name": "car"}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [20, 10, 40, 30], "iscrowd": 0},
            {"id": 2, "image_id": 1, "category_id": 90, "bbox": [180, 80, 40, 40], "iscrowd": 0},  # clipped
            # crowd: skipped
            {"id": 3, "image_id": 1, "category_id": 3, "bbox": [0, 0, 50, 50], "iscrowd": 1},
            {"id": 4, "image_id": 2, "category_id": 3, "bbox": [5, 5, 0, 10], "iscrowd": 0},  # empty: skipped
            {"id": 5, "image_id": 2, "category_id": 3, "bbox": [0, 0, 50, 25]},
        ],
    }
    path = tmp_path / "instances_val.json"
    path.write_text(json.dumps(data))
    return path, images


def test_converts_boxes_and_maps_categories(coco, tmp_path):
    path, images = coco
    names = coco_to_yolo(path, images, tmp_path / "labels")
    assert names == ["person", "car", "toothbrush"]  # ascending COCO id -> 0, 1, 2
    a = np.loadtxt(tmp_path / "labels" / "a.txt", ndmin=2)
    np.testing.assert_allclose(a, [[0, 0.2, 0.25, 0.2, 0.3], [2, 0.95, 0.9, 0.1, 0.2]], atol=1e-6)
    b = np.loadtxt(tmp_path / "labels" / "b.txt", ndmin=2)
    np.testing.assert_allclose(b, [[1, 0.5, 0.25, 1.0, 0.5]], atol=1e-6)
    assert (tmp_path / "labels" / "c.txt").read_text() == ""  # background image


def test_errors_and_missing_images(coco, tmp_path):
    path, images = coco
    with pytest.raises(FileNotFoundError, match="nope.json"):
        coco_to_yolo(tmp_path / "nope.json", images, tmp_path / "labels")
    with pytest.raises(FileNotFoundError, match="noimages"):
        coco_to_yolo(path, tmp_path / "noimages", tmp_path / "labels")
    (images / "b.jpg").unlink()
    with pytest.warns(UserWarning, match="1 images not found"):
        coco_to_yolo(path, images, tmp_path / "labels")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"images": []}))
    with pytest.raises(ValueError, match="annotations, categories"):
        coco_to_yolo(bad, images, tmp_path / "labels")
