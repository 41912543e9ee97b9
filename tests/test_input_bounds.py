"""Every input bounded and checked once: YAML files (duplicate keys, alias bombs, tags), option values
(--max-det, --classes, --freeze, --name), duplicate class names, and the length of any error printed."""

from __future__ import annotations

import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from yolotrain import Yolov5, val
from yolotrain.checkpoint import save_checkpoint
from yolotrain.cli import main
from yolotrain.data.sources import resolve_source
from yolotrain.messages import MAX_MESSAGE_CHARS, brief, shorten
from yolotrain.names import DuplicateClassNamesWarning
from yolotrain.runs import next_run_dir
from yolotrain.yamlio import MAX_YAML_VALUES, YamlError, read_yaml


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err[:3]
    return err[0]


def alias_bomb(levels: int, width: int = 9) -> str:
    """A "billion laughs" document: each level lists the previous one ``width`` times (width**levels values)."""
    rows = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    rows += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(rows) + f"\nlr0: *l{levels - 1}\n"


def test_an_alias_bomb_is_one_short_line_in_a_moment(tmp_path, capsys):
    # 9**7 = 4.8 million values from a 600-byte file; before, its repr went into the error message.
    hyp = tmp_path / "hyp.yaml"
    hyp.write_text(alias_bomb(7))
    assert hyp.stat().st_size < 1000
    start = time.perf_counter()
    assert main(["train", "--hyp", str(hyp), "--project", str(tmp_path / "runs")]) == 1
    line = one_error_line(capsys)
    assert time.perf_counter() - start < 5
    assert line.startswith(f"yolotrain train: error: {hyp}:7: its aliases expand to more than {MAX_YAML_VALUES}")
    assert len(line) < 300


def test_a_bomb_too_large_to_build_is_measured_not_expanded(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(10, 10))  # 10**10 values
    start = time.perf_counter()
    with pytest.raises(YamlError, match="aliases expand to more than"):
        read_yaml(path)
    assert time.perf_counter() - start < 1


@pytest.mark.parametrize(("text", "line", "message"), [
    ("lr0: 0.01\nmosaic: 1.0\nlr0: 0.02\n", 3, "duplicate key 'lr0' (first given on line 1)"),
    ("optim:\n  lr0: 0.01\n  lr0: 0.02\n", 3, "duplicate key 'lr0' (first given on line 2)"),
    ("{a: 1, b: 2, a: 3}\n", 1, "duplicate key 'a' (first given on line 1)"),
    ("names:\n  0: a\n  1: b\n  0x1: c\n", 4, "duplicate key 1 (first given on line 3)"),
    ("a: &x [1, *x]\n", 1, "an alias refers to a value that contains it"),
    ("a: !!python/object/apply:os.system ['echo owned']\n", 1, "could not determine a constructor for the tag"),
    ("a: [1, 2\n", 2, "not valid YAML"),
])
def test_yaml_files_are_plain_data_with_unique_keys(tmp_path, text, line, message):
    path = tmp_path / "x.yaml"
    path.write_text(text)
    with pytest.raises(YamlError) as info:
        read_yaml(path)
    assert str(info.value).startswith(f"{path}:{line}: ") and message in str(info.value), str(info.value)


def test_merge_keys_may_override_what_they_merge(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("base: &b {lr0: 0.01, mosaic: 1.0}\nrun:\n  <<: *b\n  lr0: 0.02\n")
    assert read_yaml(path) == {"base": {"lr0": 0.01, "mosaic": 1.0}, "run": {"lr0": 0.02, "mosaic": 1.0}}


@pytest.mark.parametrize("flag", ["--hyp", "--config", "--data", "--cfg"])
def test_every_yaml_the_cli_reads_refuses_duplicate_keys(tmp_path, capsys, flag):
    path = tmp_path / "dup.yaml"
    path.write_text("nc: 2\nnames: [a, b]\ntrain: images\nnames: [c, d]\n")
    assert main(["train", flag, str(path), "--project", str(tmp_path / "runs")]) == 1
    assert f"{path}:4: duplicate key 'names' (first given on line 2)" in one_error_line(capsys)


keys = st.sampled_from(["a", "b", "train", "names", "0", "1", "<<"])
scalars = st.sampled_from(["1", "0x1", "x", "'a'", "null", "true", "1.5", "*a", "*b", "*c", "!!str 3",
                           "!!python/name:os.system", "[", "}", ":", "- x", "&a 1"])


def flow(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    anchored = st.tuples(st.sampled_from(["", "&a ", "&b ", "&c "]), inner).map("".join)
    return st.one_of(
        st.lists(anchored, max_size=4).map(lambda items: f"[{', '.join(items)}]"),
        st.lists(st.tuples(keys, anchored), max_size=4).map(
            lambda pairs: "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"))


values = st.recursive(scalars, flow, max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(st.tuples(keys, st.sampled_from(["", "&a ", "&b ", "&c "]), values), max_size=6),
       indent=st.booleans())
def test_generated_yaml_is_safe_load_or_one_line(tmp_path, entries, indent):
    """Random keys (often repeated), anchors, aliases, merges, tags and nesting: the result is exactly
    ``yaml.safe_load``'s, or one line naming the file; never another exception."""
    text = "".join(f"{'  ' if indent and i else ''}{k}: {anchor}{v}\n" for i, (k, anchor, v) in enumerate(entries))
    path = tmp_path / "gen.yaml"
    path.write_text(text)
    try:
        expected = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, TypeError):
        expected = YamlError
    try:
        got = read_yaml(path)
    except YamlError as error:
        message = str(error)
        assert message.startswith(f"{path}") and "\n" not in message and len(message) < 500
        return
    assert expected is not YamlError, text
    assert got == expected


def test_messages_echoing_user_content_are_bounded(tmp_path, capsys):
    assert brief(list(range(10**6))).endswith("...]") and len(brief(list(range(10**6)))) < 100
    assert shorten("x" * 5000) == "x" * MAX_MESSAGE_CHARS + "... (4000 more characters)"
    # A settings value of ten thousand numbers (no alias needed) is echoed in a few characters.
    hyp = tmp_path / "hyp.yaml"
    hyp.write_text(f"lr0: [{', '.join(['1'] * 10**4)}]\n")
    assert main(["train", "--hyp", str(hyp), "--project", str(tmp_path / "runs")]) == 1
    line = one_error_line(capsys)
    assert "lr0" in line and len(line) < 300


def write_image_dataset(root: Path, names: str) -> Path:
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        cv2.imwrite(str(root / "images" / split / "a.jpg"), np.full((64, 64, 3), 90, np.uint8))
        (root / "labels" / split / "a.txt").write_text("0 0.5 0.5 0.3 0.3\n")
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames: {names}\n")
    return root / "data.yaml"


def test_duplicate_class_names_are_a_named_warning_and_refused_where_names_matter(tmp_path):
    data = write_image_dataset(tmp_path, "[car, bus, car, van, bus]")
    with pytest.warns(DuplicateClassNamesWarning, match=r"2 names given to several classes: 'car' \(ids 0, 2\), "
                                                        r"'bus' \(ids 1, 4\)"):
        source = resolve_source(data)
    assert source.names == ["car", "bus", "car", "van", "bus"]  # training by class id is unaffected
    model = Yolov5("n", num_classes=3, names=["car", "bus", "van"])
    with pytest.warns(DuplicateClassNamesWarning), \
            pytest.raises(ValueError, match="--map-classes matches classes by name, but the data's 2 names"):
        val(model, data, img_size=64, workers=0, verbose=False, plots=False, map_classes=True)


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("w")
    save_checkpoint(folder / "best", Yolov5("n", num_classes=3, names=["a", "b", "c"]))
    cv2.imwrite(str(folder / "img.jpg"), np.full((64, 64, 3), 90, np.uint8))
    return folder / "best.json", folder / "img.jpg"


@pytest.mark.parametrize(("options", "message"), [
    (["--classes", "99"], "classes (--classes) [99]: this model's class ids are 0..2"),
    (["--classes", "0", "-1"], "classes (--classes) [-1]: this model's class ids are 0..2"),
    (["--max-det", "0"], "max_det (--max-det) must be an integer from 1 to 30000, got 0"),
    (["--max-det", "-5"], "max_det (--max-det) must be an integer from 1 to 30000, got -5"),
    (["--max-det", "1000000000"], "max_det (--max-det) must be an integer from 1 to 30000"),
    (["--name", "n" * 300], "--name: the folder name 'nnnn"),
    (["--img", "100000"], "img_size must be at most 7680, got 100000"),
])
def test_predict_options_out_of_range_are_one_line(tmp_path, capsys, weights, options, message):
    model, image = weights
    code = main(["predict", "--weights", str(model), "--source", str(image), "--img", "64",
                 "--project", str(tmp_path / "runs"), *options])  # a later --img wins
    line = one_error_line(capsys)
    assert code == 1 and message in line, line
    assert not (tmp_path / "runs").exists()


def test_export_image_size_is_bounded(tmp_path, capsys, weights):
    out = tmp_path / "m.onnx"
    assert main(["export", "--weights", str(weights[0]), "--img-size", "99968", "--output", str(out)]) == 1
    assert "img_size must be at most 7680, got [99968]" in one_error_line(capsys)
    assert not out.exists()


def test_val_max_det_is_bounded(tmp_path, capsys, weights):
    data = write_image_dataset(tmp_path, "[a, b, c]")
    assert main(["val", "--weights", str(weights[0]), "--data", str(data), "--img", "64", "--max-det", "-1",
                 "--project", str(tmp_path / "runs")]) == 1
    assert "max_det (--max-det) must be an integer from 1 to 30000, got -1" in one_error_line(capsys)


def test_train_max_det_is_bounded(tmp_path, capsys):
    assert main(["train", "--max-det", "100000", "--project", str(tmp_path / "runs")]) == 1
    assert "eval.max_det: must be at most 30000, got 100000" in one_error_line(capsys)


def test_run_folder_names_longer_than_file_systems_allow_are_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"^--project: the folder name .* is 300 bytes long, more than the 255"):
        next_run_dir(tmp_path / ("p" * 300), "exp")
    with pytest.raises(ValueError, match=r"^--name: the folder name .* is 201 bytes long, more than the 200"):
        next_run_dir(tmp_path, "é" * 100 + "x")
    # Any other file name the system refuses is one line too, naming the file.
    assert main(["val", "--weights", str(tmp_path / ("w" * 300 + ".pt")), "--data", str(tmp_path)]) == 1
    assert "file name too long" in one_error_line(capsys)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    from yolotrain.data import generate_shapes_dataset

    return generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=4, n_val=2, img_size=64) \
        / "data.yaml"


@pytest.mark.parametrize(("freeze", "message"), [
    (["100"], "--freeze 100: the model has 25 layers (0..24)"),
    (["3", "25"], "--freeze 3 25: the model has 25 layers (0..24)"),
    (["25"], "--freeze 25 freezes every layer of the model: nothing to train"),
    ([str(i) for i in range(25)], "freezes every layer of the model: nothing to train"),
])
def test_freeze_beyond_the_model_or_of_everything_is_one_line(tmp_path, capsys, shapes, freeze, message):
    code = main(["train", "--data", str(shapes), "--epochs", "1", "--img", "64", "--batch", "2", "--workers", "0",
                 "--no-val", "--project", str(tmp_path / "runs"), "--freeze", *freeze])
    line = one_error_line(capsys)
    assert code == 1 and message in line, line


def test_a_dataset_of_more_classes_than_a_model_may_have_is_one_line(tmp_path, capsys):
    data = write_image_dataset(tmp_path, "[" + ", ".join(f"c{i}" for i in range(20_000)) + "]")
    assert main(["train", "--data", str(data), "--epochs", "1", "--img", "64", "--batch", "2", "--workers", "0",
                 "--project", str(tmp_path / "runs")]) == 1
    assert "num_classes must be from 1 to 10000, got 20000" in one_error_line(capsys)
