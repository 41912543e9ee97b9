"""Dataset check: summary, preview image and label statistics plot."""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path

import cv2
import numpy as np

from yolotrain.data.check import check_dataset
from yolotrain.data.verify import DataWarning

FIXTURES = Path(__file__).parent / "fixtures" / "data"


def test_check_writes_preview_and_stats(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("YOLOTRAIN_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "coco_mini"
    shutil.copytree(FIXTURES / "coco_mini", root)
    result = check_dataset(root / "data.yaml", tmp_path / "out", img_size=128)
    out = capsys.readouterr().out
    assert "train: 6 images, 6 labelled" in out
    preview = cv2.imread(str(result.preview))
    assert preview.shape == (256, 256, 3)
    assert preview.std() > 10  # real content, not a blank canvas
    stats = cv2.imread(str(result.stats))
    assert stats is not None and stats.shape[0] > 200 and stats.shape[1] > 400
    assert result.train.rows == result.val.rows > 0


def test_check_reports_bad_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("YOLOTRAIN_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "bad"
    shutil.copytree(FIXTURES / "bad", root)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)  # printed once, not repeated as a warning
        result = check_dataset(root / "data.yaml", tmp_path / "out", img_size=64)
    out = capsys.readouterr().out
    assert "4 corrupt skipped" in out and "lab_columns.txt:2" in out
    assert result.train.corrupt == 4
    assert np.asarray(cv2.imread(str(result.preview))).size > 0


def test_check_preview_of_polygon_labels_shows_their_masks(tmp_path, monkeypatch):
    """A YOLO-seg dataset's preview is its segmentation training samples with their target masks blended in
    (at the image's size, each object's pixels in its class colour) under the boxes."""
    from yolotrain.data.augment import AugmentConfig
    from yolotrain.data.check import draw_sample, object_masks
    from yolotrain.data.loaders import DataConfig, build_loaders
    from yolotrain.data.shapes import generate_shapes_dataset

    monkeypatch.setenv("YOLOTRAIN_CACHE", str(tmp_path / "cache"))
    data = generate_shapes_dataset(tmp_path / "shapes", n_train=4, n_val=2, img_size=128) / "data.yaml"
    result = check_dataset(data, tmp_path / "out", img_size=128)
    config = DataConfig(path=str(data), img_size=128, batch_size=1, workers=0, cache_mb=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        dataset = build_loaders(config, AugmentConfig(), seed=0, splits=("train",), kind="masks").train.dataset
    preview = cv2.imread(str(result.preview))
    visible_pixels = 0
    for i in range(4):  # the preview's 2 x 2 tiles
        img, labels, _, _, masks = dataset[i]
        shown, bare = draw_sample(img, labels, dataset.names, masks), draw_sample(img, labels, dataset.names)
        assert np.array_equal(preview[i // 2 * 128:(i // 2 + 1) * 128, i % 2 * 128:(i % 2 + 1) * 128], shown)
        tinted = (shown != bare).any(-1)
        covered = object_masks(masks, len(labels), (128, 128), overlap=True).any(0)
        visible = covered & ~(bare != cv2.cvtColor(img, cv2.COLOR_RGB2BGR)).any(-1)  # not under box lines, names
        assert tinted.sum() >= 0.9 * visible.sum() and not (tinted & ~covered).any()
        visible_pixels += visible.sum()
    assert visible_pixels > 500


def test_check_of_class_folders_counts_each_split_s_classes_names_corrupt_images_and_previews_every_class(
        tmp_path, monkeypatch, capsys):
    from yolotrain.data.check import draw_class_sample, preview_indices
    from yolotrain.data.classify import ClassifyAugment, ClassifyDataset, write_shape_crops

    monkeypatch.setenv("YOLOTRAIN_CACHE", str(tmp_path / "cache"))
    root = write_shape_crops(tmp_path / "crops", n_train=4, n_val=2)
    (root / "val" / "circle" / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    result = check_dataset(root, tmp_path / "out", img_size=48)
    out = capsys.readouterr().out
    counts = {split: [len(list((root / split / name).glob("*.png"))) for name in ("circle", "rectangle")]
              for split in ("train", "val")}
    assert f"train: {sum(counts['train'])} images, 0 corrupt skipped" in out
    assert f"val: {sum(counts['val']) + 1} images, 1 corrupt skipped\n  1 x not a decodable image: " in out
    assert str(root / "val" / "circle" / "broken.jpg") in out
    for c, name in enumerate(("circle", "rectangle")):
        assert re.search(rf"^ +{name} +{counts['train'][c]} +{counts['val'][c]}$", out, re.M), out
        assert [result.images[split][c] for split in ("train", "val")] == [counts["train"][c], counts["val"][c]]
    train = ClassifyDataset(result.splits["train"].kept, 48, ClassifyAugment(), 0, names=result.names)
    shown = preview_indices(train.labels, 16)
    assert sorted(set(train.labels[shown[:2]])) == [0, 1]  # every class before any twice
    preview = cv2.imread(str(result.preview))
    cols = int(np.ceil(np.sqrt(len(shown))))
    assert preview.shape == (-(-len(shown) // cols) * 48, cols * 48, 3)
    for k, i in enumerate(shown):
        tile = preview[k // cols * 48:(k // cols + 1) * 48, k % cols * 48:(k % cols + 1) * 48]
        labelled = draw_class_sample(train[i][0], result.names[train.labels[i]], int(train.labels[i]))
        assert np.array_equal(tile, labelled)
    stats = cv2.imread(str(result.stats))
    assert stats is not None and stats.shape[1] >= 400
