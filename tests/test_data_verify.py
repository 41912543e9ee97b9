"""Verification pass and its cache, on a fixture folder holding one of each bad-file kind."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import warnings
from pathlib import Path

import numpy as np
import pytest

from yolotrain.data.dataset import DetectionDataset
from yolotrain.data.sources import list_images
from yolotrain.data.verify import DataWarning, cache_paths, verify_split

FIXTURES = Path(__file__).parent / "fixtures" / "data"


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLOTRAIN_CACHE", str(tmp_path / "usercache"))


@pytest.fixture
def bad(tmp_path) -> Path:
    """Writable copy of the bad-files fixture (verification writes its cache beside the labels)."""
    dst = tmp_path / "bad"
    shutil.copytree(FIXTURES / "bad", dst)
    return dst


def _verify(root: Path, nc: int = 3):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        index = verify_split(list_images(root / "images" / "train"), nc, "train")
    return index, [w for w in caught if issubclass(w.category, DataWarning)]


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.endswith(".cache")}


def test_bad_files_are_skipped_repaired_and_named_in_one_warning(bad):
    before = _digest(bad)
    index, caught = _verify(bad)
    assert len(caught) == 1
    msg = str(caught[0].message)
    assert "22 images" in msg and "4 corrupt skipped" in msg
    for expected in ("wrong column count", "lab_columns.txt:2", "non-numeric value", "lab_nonnumeric.txt:2",
                     "class id 7 >= num_classes 3", "lab_class.txt:2", "invalid class id", "lab_far.txt:2",
                     "duplicate row removed", "lab_dup.txt:2", "box clipped to the image", "lab_slight.txt:1",
                     "empty.jpg: empty file", "notimage.jpg: not a decodable image"):
        assert expected in msg, expected
    # Recent OpenCV refuses a cut JPEG outright; older versions decode it and the end-marker check catches it.
    truncated = next(w for w in index.report.issues["corrupt image skipped"] if "truncated.jpg" in w)
    assert truncated.endswith(("not a decodable image", "truncated JPEG (no end marker)"))
    names = {f.name for f in index.files}
    assert not names & {"empty.jpg", "notimage.jpg", "truncated.jpg", "tiny.png"}
    assert {"fmt_bmp.bmp", "fmt_tif.tif", "fmt_webp.webp", "gray.png", "rgba.png", "exif_rot6.jpg"} <= names
    assert _digest(bad) == before, "user files must never be modified"


def test_label_repairs(bad):
    index, _ = _verify(bad)
    labels = {f.stem: lab for f, lab in zip(index.files, index.labels)}
    good = np.array([[1, 0.546875, 0.416667, 0.46875, 0.416667]], np.float32)
    for stem in ("lab_columns", "lab_nonnumeric", "lab_class", "lab_negative_class", "lab_far", "lab_dup",
                 "lab_blank_lines"):
        np.testing.assert_allclose(labels[stem], good, atol=1e-6, err_msg=stem)
    # clipped at x = 1
    np.testing.assert_allclose(labels["lab_slight"], [[0, 0.985, 0.5, 0.03, 0.2]], atol=1e-6)
    np.testing.assert_allclose(labels["lab_polygon"], [[0, 0.2, 0.3, 0.2, 0.4]], atol=1e-6)  # polygon -> box
    assert labels["lab_empty"].shape == (0, 5) and labels["background"].shape == (0, 5)
    assert index.report.backgrounds == 2 and index.report.labelled == 16


def test_exif_orientation_and_channel_conversion(bad):
    index, _ = _verify(bad)
    shapes = {f.name: tuple(s) for f, s in zip(index.files, index.shapes)}
    assert shapes["exif_rot6.jpg"] == (48, 64)  # stored 64x48, displayed rotated: (w, h) swapped
    assert shapes["good.jpg"] == (64, 48)
    ds = DetectionDataset(index, img_size=64, batch_size=4)
    for name in ("gray.png", "rgba.png", "exif_rot6.jpg", "fmt_webp.webp", "fmt_tif.tif"):
        im = ds.load_image(index.files.index(next(f for f in index.files if f.name == name)))
        assert im.ndim == 3 and im.shape[2] == 3, name
    assert ds.load_image([f.name for f in index.files].index("exif_rot6.jpg")).shape[:2] == (64, 48)


def test_cache_written_beside_labels_reused_and_invalidated(bad):
    files = list_images(bad / "images" / "train")
    primary, _ = cache_paths(files)
    assert primary == bad / "labels" / "train.yolotrain.cache"
    first, _ = _verify(bad)
    assert primary.is_file()
    mtime = primary.stat().st_mtime_ns
    second, caught = _verify(bad)
    assert primary.stat().st_mtime_ns == mtime  # read, not rebuilt
    assert len(caught) == 1 and "lab_columns.txt:2" in str(caught[0].message)  # summary repeated from cache
    assert [f.name for f in first.files] == [f.name for f in second.files]
    for a, b in zip(first.labels, second.labels):
        np.testing.assert_array_equal(a, b)
    (bad / "labels" / "train" / "lab_columns.txt").write_text("0 0.5 0.5 0.1 0.1\n")
    third, caught = _verify(bad)
    assert "lab_columns" not in str(caught[0].message)
    np.testing.assert_allclose(third.labels[[f.stem for f in third.files].index("lab_columns")],
                               [[0, 0.5, 0.5, 0.1, 0.1]], atol=1e-6)


def test_read_only_labels_folder_falls_back_to_user_cache(bad, tmp_path):
    labels = bad / "labels"
    labels.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    try:
        index, _ = _verify(bad)
        assert len(index.files) == 18
        assert sorted(p.name for p in labels.iterdir()) == ["train"]
        cached = list((tmp_path / "usercache" / "labels").glob("*.cache"))
        assert len(cached) == 1
        mtime = cached[0].stat().st_mtime_ns
        _verify(bad)
        assert cached[0].stat().st_mtime_ns == mtime
    finally:
        labels.chmod(0o755)


def test_wrong_num_classes_is_an_error_naming_file_and_line(tmp_path):
    import cv2

    (tmp_path / "images" / "train").mkdir(parents=True)
    (tmp_path / "labels" / "train").mkdir(parents=True)
    cv2.imwrite(str(tmp_path / "images" / "train" / "img3.jpg"), np.full((32, 32, 3), 50, np.uint8))
    (tmp_path / "labels" / "train" / "img3.txt").write_text("1 0.5 0.5 0.2 0.2\n5 0.5 0.5 0.2 0.2\n")
    with pytest.raises(ValueError, match=r"labels/train/img3\.txt:2: class id 5 >= num_classes 2"):
        _verify(tmp_path, nc=2)


def test_parallel_scan_matches_file_order(tmp_path):
    import cv2

    (tmp_path / "images" / "train").mkdir(parents=True)
    (tmp_path / "labels" / "train").mkdir(parents=True)
    for i in range(40):
        im = np.full((16, 16 + i, 3), i, np.uint8)
        cv2.imwrite(str(tmp_path / "images" / "train" / f"{i:03d}.png"), im)
        (tmp_path / "labels" / "train" / f"{i:03d}.txt").write_text(f"{i % 3} 0.5 0.5 0.5 0.5\n")
    index, caught = _verify(tmp_path)
    assert not caught
    assert [int(s[0]) for s in index.shapes] == [16 + i for i in range(40)]
    assert [int(lab[0, 0]) for lab in index.labels] == [i % 3 for i in range(40)]
    assert os.path.isfile(tmp_path / "labels" / "train.yolotrain.cache")


def _cache_arrays(root: Path) -> dict[str, np.ndarray]:
    with np.load(root / "labels" / "train.yolotrain.cache", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def test_process_pool_verification_equals_the_in_process_one(bad, monkeypatch):
    from yolotrain.data import verify

    in_process, warned = _verify(bad)
    cached = _cache_arrays(bad)
    (bad / "labels" / "train.yolotrain.cache").unlink()
    monkeypatch.setattr(verify, "PROCESS_POOL_MIN_IMAGES", 0)
    monkeypatch.setattr(verify, "PROCESS_CHUNK_IMAGES", 5)  # several chunks, results joined in order
    pool_started, start_pool, read_header = [], verify.ProcessPoolExecutor, verify._oversize
    monkeypatch.setattr(verify, "ProcessPoolExecutor", lambda *a, **k: pool_started.append(a) or start_pool(*a, **k))

    def read_header_with_a_warning(path: Path) -> str | None:  # a library warning issued inside a worker
        warnings.warn(f"odd header in {path.name}", UserWarning, stacklevel=1)
        return read_header(path)

    monkeypatch.setattr(verify, "_oversize", read_header_with_a_warning)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pooled = verify_split(list_images(bad / "images" / "train"), 3, "train", workers=2)
    assert pool_started
    from_workers = sorted(str(w.message) for w in caught if w.category is UserWarning)
    assert from_workers == sorted(f"odd header in {f.name}" for f in list_images(bad / "images" / "train")
                                  if (f.stat().st_size > 0))
    assert [str(w.message) for w in caught if issubclass(w.category, DataWarning)] == [str(w.message) for w in warned]
    assert pooled.files == in_process.files
    assert pooled.report.summary() == in_process.report.summary()
    assert all(np.array_equal(a, b) for a, b in zip(pooled.labels, in_process.labels, strict=True))
    assert np.array_equal(pooled.shapes, in_process.shapes)
    again = _cache_arrays(bad)
    assert again.keys() == cached.keys()
    assert all(np.array_equal(again[k], cached[k]) for k in cached)


def test_string_path_helpers_agree_with_pathlib():
    from yolotrain.data.sources import _sorted_unique, img2label_path, label_path_text
    from yolotrain.data.walk import _suffix

    for name in ("a.jpg", ".jpg", "a.", "a..jpg", "a.tar.gz", "x", "..", "a.b."):
        assert _suffix(name) == Path(name).suffix, name
    for image in ("/d/images/a.jpg", "d/images/x/a.b.png", "/images/a.", "a.jpg", "/x/images/y/images/.hid"):
        assert label_path_text(Path(image)) == str(img2label_path(Path(image))), image
    paths = [Path(p) for p in ("/a/b", "/a.b/c", "a/b", "a.b/c", "../x", "/b", ".h/x", "-x/y", "/a/b/c", "a",
                               "a/./b", "//s/x", "/a/../a/b")]
    assert _sorted_unique(paths) == sorted({Path(os.path.normpath(p)) for p in paths})
