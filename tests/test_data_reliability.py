"""Datasets say what they are: malformed YAMLs, class names and counts, shared label files, empty
labels, huge images and mismatched models each end in one line or a named warning; fuzzed label
files, dataset YAMLs and checkpoint JSON never raise anything else."""

from __future__ import annotations

import json
import struct
import warnings
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from yolotrain import Yolov5, val
from yolotrain.checkpoint import CheckpointError, read_metadata, save_checkpoint
from yolotrain.cli import main
from yolotrain.data.sources import resolve_source
from yolotrain.data.verify import DataWarning, _check_labels, verify_split


def write_dataset(root: Path, names_line: str, images: dict[str, str] | None = None) -> Path:
    """A small dataset: ``images`` maps file names (in images/train) to their label text."""
    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    for name, label in (images or {"a.jpg": "0 0.5 0.5 0.2 0.2\n"}).items():
        cv2.imwrite(str(root / "images" / "train" / name), np.full((40, 40, 3), 90, np.uint8))
        if label is not None:
            (root / "labels" / "train" / f"{Path(name).stem}.txt").write_text(label)
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/train\nval: images/train\n{names_line}\n")
    return root / "data.yaml"


@pytest.mark.parametrize(("names_line", "message"), [
    ("names: circle", "class names must be a list (e.g. [circle])"),
    ("names: 5", "class names must be a list (e.g. [5])"),
    ("nc: 3\nnames: [a, b]", "2 class names for 3 classes (nc: 3)"),
    ("names: {0: a, 5: b}", "class names mapping needs keys 0..1, got [0, 5]"),
    ("names: [a, [b]]", "class names must be plain names"),
])
def test_class_names_must_be_what_they_say(tmp_path, names_line, message):
    data = write_dataset(tmp_path, names_line)
    with pytest.raises(ValueError, match=r"data.yaml: .*") as caught:
        resolve_source(data)
    assert message in str(caught.value)


@pytest.mark.parametrize(("text", "message"), [
    ("train: [images/train\nnames: [a]\n", "data.yaml:2: not valid YAML"),
    ("train: 5\nnames: [a]\n", "'train' must be a path or a list of paths, got 5"),
    ("train: images/train\nval: {a: 1}\nnames: [a]\n", "'val' must be a path or a list of paths"),
    ("path: [x]\ntrain: images/train\n", "'path' must be a folder"),
])
def test_malformed_dataset_yamls_are_one_line_in_the_cli(tmp_path, text, message, capsys):
    write_dataset(tmp_path, "names: [a]")
    (tmp_path / "data.yaml").write_text(text)
    assert main(["train", "--data", str(tmp_path / "data.yaml"), "--epochs", "1", "--img", "64", "--batch", "2",
                 "--workers", "0", "--project", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_shared_label_files_and_all_empty_labels_are_named(tmp_path):
    data = write_dataset(tmp_path, "names: [a]", {"a.jpg": "0 0.5 0.5 0.2 0.2\n", "a.png": None, "b.jpg": ""})
    with pytest.warns(DataWarning, match=r"1 x images sharing one label file: .*a.txt <- a.jpg, a.png"):
        verify_split(resolve_source(data).train, 1, "train")
    empty = write_dataset(tmp_path / "empty", "names: [a]", {"c.jpg": "", "d.jpg": None})
    with pytest.warns(DataWarning, match="no boxes in the whole split: 2 images, every one a background"):
        verify_split(resolve_source(empty).train, 1, "train")


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` pixels (and holds a few bytes of image data)."""
    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + \
        chunk(b"IEND", b"")


def test_huge_images_are_skipped_before_decoding(tmp_path, monkeypatch):
    data = write_dataset(tmp_path, "names: [a]", {"a.jpg": "0 0.5 0.5 0.2 0.2\n", "b.jpg": "0 0.5 0.5 0.2 0.2\n"})
    (tmp_path / "images" / "train" / "huge.png").write_bytes(png_header(60000, 60000))
    (tmp_path / "images" / "train" / "big.png").write_bytes(png_header(12000, 10000))
    with pytest.warns(DataWarning, match=r"(?s)big.png: image 12000x10000 has more than 100 MP.*huge.png: image "
                      r"has more than \d+ MP"):
        index = verify_split(resolve_source(data).train, 1, "train")
    assert [p.name for p in index.files] == ["a.jpg", "b.jpg"]
    monkeypatch.setenv("YOLOTRAIN_MAX_IMAGE_PIXELS", "1000")  # 40x40 = 1600 px is now over the cap
    (tmp_path / "labels" / "train.yolotrain.cache").unlink()
    with pytest.raises(ValueError, match="no usable images left"), warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        verify_split(resolve_source(data).train, 1, "train")


def test_val_refuses_a_model_with_other_classes_unless_mapped(tmp_path):
    data = write_dataset(tmp_path, "names: [a, b]", {f"{i}.jpg": "1 0.5 0.5 0.4 0.4\n" for i in range(2)})
    model = Yolov5("n", num_classes=3, names=["b", "x", "a"])
    with pytest.raises(ValueError, match="the model predicts 3 classes but the data has 2"):
        val(model, data, img_size=64, workers=0, verbose=False, plots=False)
    metrics = val(model, data, img_size=64, workers=0, verbose=False, plots=False, map_classes=True)
    assert metrics.names == ["a", "b"]
    stranger = Yolov5("n", num_classes=3, names=["x", "y", "z"])
    with pytest.raises(ValueError, match="none of the data's classes"):
        val(stranger, data, img_size=64, workers=0, verbose=False, plots=False, map_classes=True)


def test_a_project_path_that_is_a_file_is_one_line(tmp_path, capsys):
    data = write_dataset(tmp_path, "names: [a]")
    (tmp_path / "taken").write_text("a file, not a folder")
    assert main(["train", "--data", str(data), "--epochs", "1", "--img", "64", "--batch", "2", "--workers", "0",
                 "--project", str(tmp_path / "taken")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "taken" in err[0], err


tokens = st.one_of(st.sampled_from(["0", "1", "-1", "0.5", "1e9", "nan", "inf", "-0.2", "2.5", "x", "1,2", ""]),
                   st.text(max_size=6))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.lists(tokens, max_size=9).map(" ".join), max_size=8))
def test_fuzzed_label_files_give_valid_rows_or_named_issues(tmp_path, lines):
    path = tmp_path / "fuzz.txt"
    path.write_text("\n".join(lines))
    issues: list[tuple[str, str]] = []
    rows, polygons = _check_labels(path, 3, issues)
    assert rows.dtype == np.float32 and rows.shape[1:] == (5,) and len(polygons) == len(rows)
    assert all(p.shape == (0, 2) or (p.shape[0] >= 3 and ((p >= 0) & (p <= 1)).all()) for p in polygons)
    assert np.isfinite(rows).all() and ((rows[:, 0] >= 0) & (rows[:, 0] < 3)).all()
    assert ((rows[:, 1:] >= 0) & (rows[:, 1:] <= 1)).all()
    assert all(isinstance(kind, str) and isinstance(where, str) for kind, where in issues)


yaml_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=8),
              st.sampled_from(["images/train", ".", "missing", "x.txt"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.dictionaries(st.sampled_from(["path", "train", "val", "names", "nc", "other"]), yaml_values,
                           max_size=5))
@example(doc={"train": "\n"})  # a path that is a line break: its message once broke the line
@example(doc={"path": "a\tb", "train": "images/train"})
def test_fuzzed_dataset_yamls_resolve_or_fail_clearly(tmp_path, doc):
    (tmp_path / "images" / "train").mkdir(parents=True, exist_ok=True)
    if not (tmp_path / "images" / "train" / "a.jpg").exists():
        cv2.imwrite(str(tmp_path / "images" / "train" / "a.jpg"), np.full((20, 20, 3), 90, np.uint8))
    path = tmp_path / "data.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        source = resolve_source(path)
    except (ValueError, FileNotFoundError) as error:
        assert "\n" not in str(error)
        return
    assert all(isinstance(n, str) for n in source.names) and source.train


@pytest.fixture(scope="module")
def saved_document(tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(folder / "last", Yolov5("n", num_classes=2))
    return folder, json.loads((folder / "last.json").read_text())


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(edits=st.dictionaries(st.sampled_from(["format", "format_version", "version", "nc", "names", "anchors",
                                              "strides", "in_channels", "files", "epoch", "img_size"]),
                             json_values, min_size=1, max_size=3))
def test_fuzzed_checkpoint_json_is_valid_or_one_line(saved_document, edits):
    folder, document = saved_document
    path = folder / "fuzzed.json"
    path.write_text(json.dumps({**document, **edits}))
    (folder / "fuzzed.safetensors").write_bytes((folder / "last.safetensors").read_bytes())
    try:
        metadata, _ = read_metadata(path)
    except CheckpointError as error:
        assert "\n" not in str(error)
        return
    assert 1 <= metadata["nc"] <= 10_000 and len(metadata["names"]) == metadata["nc"]


def test_a_dataset_path_with_a_line_break_is_named_on_one_line(tmp_path):
    (tmp_path / "data.yaml").write_text(yaml.safe_dump({"train": "images\ntrain"}))
    with pytest.raises(FileNotFoundError) as error:
        resolve_source(tmp_path / "data.yaml")
    assert str(error.value) == "dataset path does not exist: " + repr(str(tmp_path / "images\ntrain"))
    assert str(error.value).endswith("images\\ntrain'")  # escaped: the message is one line
