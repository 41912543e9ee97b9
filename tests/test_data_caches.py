"""The disk image cache and the label cache are keyed by each file's version, never by its stem, and a
label cache is trusted only when its content is what a scan could have written."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from yolotrain.data.imagecache import disk_cache
from yolotrain.data.sources import list_images
from yolotrain.data.verify import CacheWarning, cache_paths, verify_split


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLOTRAIN_CACHE", str(tmp_path / "usercache"))


def write_image(path: Path, value: int) -> np.ndarray:
    """A 24x32 image of random pixels drawn from ``value`` (BMP: the same size whatever the pixels)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    im = np.random.default_rng(value).integers(0, 256, (24, 32, 3), dtype=np.uint8)
    assert cv2.imwrite(str(path), im)
    return im


def replace_keeping_size_and_time(path: Path, value: int) -> np.ndarray:
    """New content written in place, same size, and the modification time set back to the nanosecond."""
    before = path.stat()
    im = write_image(path, value)
    assert path.stat().st_size == before.st_size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    return im


def test_a_replaced_image_is_decoded_again(tmp_path):
    image = tmp_path / "images" / "a.bmp"
    write_image(image, 1)
    (first,) = disk_cache([image])
    new = replace_keeping_size_and_time(image, 2)
    (second,) = disk_cache([image])
    np.testing.assert_array_equal(np.load(second), new)
    assert not first.exists()  # the array of the old version is gone, not left to pile up


def test_images_of_one_stem_have_arrays_of_their_own(tmp_path):
    files = [tmp_path / "images" / "a.bmp", tmp_path / "images" / "a.png",
             tmp_path / "images" / "x" / "a.png", tmp_path / "images" / "y" / "a.png"]
    pixels = [write_image(f, i) for i, f in enumerate(files)]
    for readonly in (False, True):  # beside the images, then under the cache folder
        if readonly:
            for folder in {f.parent for f in files}:
                folder.chmod(0o555)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                arrays = disk_cache(files)
        finally:
            for folder in {f.parent for f in files}:
                folder.chmod(0o755)
        assert len(set(arrays)) == len(files)
        for array, expected in zip(arrays, pixels):
            np.testing.assert_array_equal(np.load(array), expected)
        for array in arrays:
            array.unlink()


def small_split(root: Path, n: int = 3) -> list[Path]:
    for i in range(n):
        write_image(root / "images" / "train" / f"{i}.png", i)
        label = root / "labels" / "train" / f"{i}.txt"
        label.parent.mkdir(parents=True, exist_ok=True)
        label.write_text(f"{i % 2} 0.5 0.5 0.2 0.2\n")
    return list_images(root / "images" / "train")


def verify(files: list[Path], num_classes: int = 2):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        index = verify_split(files, num_classes, "train")
    return index, [w for w in caught if issubclass(w.category, CacheWarning)]


def test_a_label_file_replaced_within_the_same_time_is_read_again(tmp_path):
    files = small_split(tmp_path)
    verify(files)
    label = tmp_path / "labels" / "train" / "0.txt"
    before = label.stat()
    label.write_text("1 0.5 0.5 0.2 0.2\n")  # same size
    os.utime(label, ns=(before.st_atime_ns, before.st_mtime_ns))
    index, _ = verify(files)
    assert index.labels[0][0, 0] == 1


def forge(cache: Path, **arrays: np.ndarray) -> None:
    """Rewrite some arrays of a label cache, keeping its version and fingerprint."""
    with np.load(cache) as z:
        contents = {k: z[k] for k in z.files}
    contents.update(arrays)
    with cache.open("wb") as f:
        np.savez(f, **contents)


@pytest.mark.parametrize("forgery, why", [
    ({"labels": np.array([[7, 0.5, 0.5, 0.2, 0.2]] * 3, np.float32)}, "class ids outside 0..1"),
    ({"labels": np.array([[0, 0.5, 0.5, 3.0, 0.2]] * 3, np.float32)}, "boxes outside the image"),
    ({"folder": np.array("/etc/"), "names": np.frombuffer(b"hostname\0passwd\0group", np.uint8)},
     "files that are not the split's"),
    ({"counts": np.array([5, 0, 0])}, "label counts disagree with the labels"),
    ({"polygon_sizes": np.array([2, 0, 0]), "points": np.zeros((2, 2), np.float32)},
     "polygon sizes disagree with the polygons"),
    ({"polygon_sizes": np.array([3, 0, 0]), "points": np.array([[0.1, 0.1], [2.0, 0.5], [0.3, 0.3]], np.float32)},
     "polygon points outside the image"),
])
def test_a_forged_label_cache_is_not_trusted(tmp_path, forgery, why):
    files = small_split(tmp_path)
    expected, _ = verify(files)
    cache, _ = cache_paths(files)
    forge(cache, **forgery)
    index, caught = verify(files)
    assert len(caught) == 1 and why in str(caught[0].message) and str(cache) in str(caught[0].message)
    assert index.files == expected.files
    for a, b in zip(index.labels, expected.labels):
        np.testing.assert_array_equal(a, b)
    assert verify(files)[1] == []  # the cache was rewritten from the scan


label_rows = arrays(np.float32, (3, 5), elements=st.floats(-2, 9, width=32) | st.sampled_from([0.0, 1.0, np.nan]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=label_rows)
def test_fuzzed_label_caches_give_only_valid_rows(tmp_path, rows):
    root = tmp_path / "data"
    files = small_split(root) if not root.exists() else list_images(root / "images" / "train")
    verify(files)
    forge(cache_paths(files)[0], labels=rows)
    index, caught = verify(files)
    labels = np.concatenate(index.labels)
    assert ((labels[:, 0] == 0) | (labels[:, 0] == 1)).all()
    assert ((labels[:, 1:3] - labels[:, 3:5] / 2 >= -1e-4) & (labels[:, 1:3] + labels[:, 3:5] / 2 <= 1 + 1e-4)).all()
    assert (labels[:, 3:5] > 0).all() and len(caught) <= 1


def test_the_label_cache_gives_back_exactly_what_the_scan_found(tmp_path):
    images = tmp_path / "images" / "train"
    names = ["a.png", "sub/b.png", "sub/deeper/c.png", "é ü.png", "d.png", "e.png"]
    for i, name in enumerate(names):
        write_image(images / name, i)
    (images / "broken.png").write_bytes(b"not an image")
    rows = {"a": "0 0.5 0.5 0.2 0.2\n1 0.25 0.25 0.1 0.1\n",  # boxes
            "sub/b": "1 0.1 0.1 0.3 0.1 0.3 0.4\n0 0.5 0.5 0.2 0.2\n",  # a polygon and a box
            "sub/deeper/c": "0 0.5 0.5 0.2 0.2\n0 0.5 0.5 0.2 0.2\n",  # a duplicate row: an issue
            "é ü": "1 0.3 0.3 0.2 0.2\n",
            "d": "5 0.5 0.5 0.2 0.2\n"}  # a class out of range: an issue; e.png is a background
    for stem, text in rows.items():
        label = tmp_path / "labels" / "train" / f"{stem}.txt"
        label.parent.mkdir(parents=True, exist_ok=True)
        label.write_text(text)
    files = list_images(images)
    scanned, _ = verify(files)
    assert os.path.isfile(cache_paths(files)[0])
    cached, caught = verify(files)
    assert caught == [] and cached is not scanned
    assert cached.files == scanned.files and len(cached.files) == len(names)
    assert all(isinstance(f, Path) for f in cached.files)
    np.testing.assert_array_equal(cached.shapes, scanned.shapes)
    assert cached.shapes.dtype == scanned.shapes.dtype
    for ours, theirs in zip(cached.labels, scanned.labels, strict=True):
        np.testing.assert_array_equal(ours, theirs)
        assert ours.dtype == theirs.dtype
    for ours, theirs in zip(cached.segments, scanned.segments, strict=True):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            np.testing.assert_array_equal(a, b)
    assert any(len(p) for rows in cached.segments for p in rows)
    assert (cached.report.total, cached.report.labelled, cached.report.backgrounds, cached.report.corrupt,
            cached.report.rows) == (scanned.report.total, scanned.report.labelled, scanned.report.backgrounds,
                                    scanned.report.corrupt, scanned.report.rows)
    assert dict(cached.report.issues) == dict(scanned.report.issues) and scanned.report.issues
