"""Classification data: ImageNet-style folders, verification, caching and the reference's transforms."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from yolotrain.data.classify import (
    ClassifyAugment,
    ClassifyDataset,
    SampleBatch,
    build_classify_loaders,
    eval_transform,
    is_classify_folder,
    normalise_batch,
    random_resized_crop,
    resolve_classify_source,
    write_shape_crops,
)
from yolotrain.data.verify import DataWarning


@pytest.fixture(scope="module")
def crops(tmp_path_factory) -> Path:
    return write_shape_crops(tmp_path_factory.mktemp("crops") / "shapes-cls", n_train=6, n_val=3)


def test_class_names_and_samples_are_those_of_torchvision_image_folder(crops, tmp_path):
    from torchvision.datasets import ImageFolder

    root = tmp_path / "data"
    shutil.copytree(crops, root)
    (root / "train" / "circle" / "nested").mkdir()
    shutil.copy(next((root / "train" / "circle").glob("*.png")), root / "train" / "circle" / "nested" / "x.png")
    (root / "train" / "circle" / "notes.txt").write_text("not an image")
    source = resolve_classify_source(root)
    reference = ImageFolder(str(root / "train"))
    assert source.names == reference.classes == ["circle", "rectangle"]
    assert [(str(p), c) for p, c in source.splits["train"]] == reference.samples
    assert source.eval_split == "val" and is_classify_folder(root) and not is_classify_folder(root / "train")


def test_a_class_folder_outside_the_classes_and_missing_folders_are_one_line_errors(crops, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(crops, root)
    (root / "val" / "triangle").mkdir()
    with pytest.raises(ValueError, match=r"val/triangle: class folder 'triangle' is not one of the 2 classes"):
        resolve_classify_source(root)
    with pytest.raises(FileNotFoundError, match="no train/, val/ or test/ folder"):
        resolve_classify_source(root / "val")
    with pytest.raises(FileNotFoundError, match="not found"):
        resolve_classify_source(tmp_path / "missing")


def test_the_eval_transform_is_the_reference_one(reference):
    from yolov5.utils.augmentations import classify_transforms

    rng = np.random.default_rng(0)
    for h, w in ((50, 80), (120, 31), (224, 224)):
        im = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        torch.testing.assert_close(eval_transform(im, 64), classify_transforms(64)(im), rtol=0, atol=0)


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 5), h=st.integers(1, 40), w=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_a_batch_is_normalised_as_the_reference_normalises_each_image(reference, batch, h, w, seed):
    from torchvision import transforms as T
    from yolov5.utils.augmentations import IMAGENET_MEAN, IMAGENET_STD, ToTensor

    per_image = T.Compose([ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    bgr = np.random.default_rng(seed).integers(0, 256, (batch, h, w, 3), dtype=np.uint8)
    bgr[0, 0, 0] = (0, 128, 255)  # the extremes of the range in every batch
    expected = torch.stack([per_image(im) for im in bgr])
    torch.testing.assert_close(normalise_batch(bgr), expected, rtol=0, atol=0)


@pytest.mark.parametrize("augment", [None, ClassifyAugment()], ids=["eval", "train"])
def test_a_loader_batch_is_the_stack_of_the_samples_made_together(crops, augment):
    samples = resolve_classify_source(crops).splits["train"]
    dataset = ClassifyDataset(samples, 40, augment, seed=5)
    keys = [(i, 2, False) for i in (3, 0, 7, 1)]
    batch = dataset.__getitems__(keys)
    assert isinstance(batch, SampleBatch) and len(batch) == len(keys)
    imgs, labels = ClassifyDataset.collate(batch)
    assert imgs is batch.images  # taken as it is, not stacked again
    expected = [dataset[key] for key in keys]
    torch.testing.assert_close(imgs, torch.stack([im for im, _ in expected]), rtol=0, atol=0)
    assert imgs.is_contiguous() and labels.tolist() == [label for _, label in expected] and labels.dtype == torch.int64
    # Any other collate sees the samples themselves.
    default_imgs, default_labels = torch.utils.data.default_collate(batch)
    assert torch.equal(default_imgs, imgs) and torch.equal(default_labels, labels)


def test_corrupt_images_are_named_counted_and_skipped(crops, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(crops, root)
    bad = root / "train" / "rectangle" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8 not really a jpeg")
    total = sum(1 for _ in (root / "train").rglob("*.*"))
    with pytest.warns(DataWarning, match=rf"train: {total} images, 1 corrupt skipped\n  1 x .*broken.jpg"):
        loaders = build_classify_loaders(root, 32, 4, workers=0)
    assert len(loaders.train_samples) == total - 1 and bad not in [p for p, _ in loaders.train_samples]
    imgs, labels = next(iter(loaders.val))
    assert imgs.shape == (4, 3, 32, 32) and imgs.dtype == torch.float32 and labels.dtype == torch.int64


def test_training_samples_depend_on_seed_epoch_and_index_only(crops):
    samples = resolve_classify_source(crops).splits["train"]
    dataset = ClassifyDataset(samples, 48, ClassifyAugment(), seed=3)
    first, label = dataset[(2, 0, False)]
    again, _ = ClassifyDataset(samples, 48, ClassifyAugment(), seed=3)[(2, 0, False)]
    assert first.shape == (3, 48, 48) and label == samples[2][1]
    assert torch.equal(first, again)
    assert not torch.equal(first, dataset[(2, 1, False)][0])
    assert not torch.equal(first, ClassifyDataset(samples, 48, ClassifyAugment(), seed=4)[(2, 0, False)][0])


@pytest.mark.parametrize("cache", ["ram", "disk"])
def test_cached_images_give_the_same_samples(crops, tmp_path, cache):
    root = tmp_path / "data"
    shutil.copytree(crops, root)
    samples = resolve_classify_source(root).splits["val"]
    plain = ClassifyDataset(samples, 40)
    cached = ClassifyDataset(samples, 40, cache=cache)
    for i in (0, 1, 0):
        assert torch.equal(plain[i][0], cached[i][0])
    assert bool(list(root.rglob("*.npy"))) == (cache == "disk")


@settings(max_examples=40, deadline=None)
@given(h=st.integers(10, 300), w=st.integers(10, 300), size=st.integers(8, 96), seed=st.integers(0, 2**16),
       scale_min=st.floats(0.01, 1.0), ratio_min=st.floats(0.2, 1.0))
def test_random_resized_crops_are_always_square_crops_of_the_image(h, w, size, seed, scale_min, ratio_min):
    im = np.zeros((h, w, 3), np.uint8)
    cv2.circle(im, (w // 2, h // 2), 3, (255, 255, 255), -1)
    out = random_resized_crop(im, size, np.random.default_rng(seed), (scale_min, 1.0), (ratio_min, 1 / ratio_min))
    assert out.shape == (size, size, 3) and out.dtype == np.uint8


def test_the_flip_and_jitter_settings_take_effect(crops):
    samples = resolve_classify_source(crops).splits["train"][:1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        whole = ClassifyAugment(scale_min=1.0, ratio_min=1.0, fliplr=0.0, jitter=0.0)
        flipped = ClassifyAugment(scale_min=1.0, ratio_min=1.0, fliplr=1.0, jitter=0.0)
        a = ClassifyDataset(samples, 32, whole)[0][0]
        b = ClassifyDataset(samples, 32, flipped)[0][0]
    # A crop of the whole area at aspect 1 falls back to the centred square: the evaluation transform.
    torch.testing.assert_close(a, eval_transform(cv2.imread(str(samples[0][0])), 32), rtol=0, atol=0)
    torch.testing.assert_close(b, a.flip(-1))
    jittered = ClassifyDataset(samples, 32, ClassifyAugment(scale_min=1.0, ratio_min=1.0, fliplr=0.0))[0][0]
    assert not torch.equal(jittered, a)


def _image_checks(monkeypatch) -> list[Path]:
    """The images verification decodes from now on (each call recorded, then checked for real)."""
    import yolotrain.data.classify as classify_data

    decoded: list[Path] = []
    real = classify_data.check_image
    monkeypatch.setattr(classify_data, "check_image", lambda path: decoded.append(path) or real(path))
    return decoded


def test_verification_is_cached_and_corrupt_images_are_named_from_the_cache(crops, tmp_path, monkeypatch):
    root = tmp_path / "data"
    shutil.copytree(crops, root)
    bad = root / "val" / "circle" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8 not really a jpeg")
    decoded = _image_checks(monkeypatch)
    with pytest.warns(DataWarning, match=r"val: \d+ images, 1 corrupt skipped\n  1 x not a decodable image: .*broken"):
        first = build_classify_loaders(root, 32, 4, splits=("val",), workers=0).val_samples
    assert bad in decoded and (root / "val.yolotrain.cache").is_file()
    decoded.clear()
    with pytest.warns(DataWarning, match=r"1 corrupt skipped\n  1 x not a decodable image: .*broken.jpg"):
        again = build_classify_loaders(root, 32, 4, splits=("val",), workers=0).val_samples
    assert decoded == [] and again == first


@pytest.mark.parametrize("change", ["rewritten", "added", "removed"])
def test_a_changed_added_or_removed_image_checks_the_split_again(crops, tmp_path, monkeypatch, change):
    root = tmp_path / "data"
    shutil.copytree(crops, root)
    build_classify_loaders(root, 32, 4, splits=("val",), workers=0)
    image = sorted((root / "val" / "rectangle").glob("*.png"))[0]
    if change == "rewritten":  # same bytes, same size: only the file's version tells
        image.write_bytes(image.read_bytes())
    elif change == "added":
        shutil.copy(image, image.with_name("copy.png"))
    else:
        image.unlink()
    decoded = _image_checks(monkeypatch)
    samples = build_classify_loaders(root, 32, 4, splits=("val",), workers=0).val_samples
    assert sorted(decoded) == sorted(path for path, _ in samples)
    decoded.clear()
    build_classify_loaders(root, 32, 4, splits=("val",), workers=0)
    assert decoded == []


def test_a_read_only_dataset_keeps_its_verification_cache_in_the_user_cache_folder(crops, tmp_path, monkeypatch):
    monkeypatch.setenv("YOLOTRAIN_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "data"
    shutil.copytree(crops, root)
    (root / "train" / "circle" / "broken.png").write_bytes(b"not an image")
    for folder in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        folder.chmod(0o555)
    try:
        with pytest.warns(DataWarning, match="broken.png"):
            build_classify_loaders(root, 32, 4, workers=0)
        assert sorted(p.name.split("-")[:2] for p in (tmp_path / "cache" / "labels").iterdir()) == [
            ["classify", "train"], ["classify", "val"]]
        assert not list(root.glob("*.cache"))
        decoded = _image_checks(monkeypatch)
        with pytest.warns(DataWarning, match="broken.png"):
            build_classify_loaders(root, 32, 4, workers=0)
        assert decoded == []
    finally:
        for folder in [root, *(p for p in root.rglob("*") if p.is_dir())]:
            folder.chmod(0o755)
