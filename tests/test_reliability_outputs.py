"""Outputs land only where the command may write: its own run folder (a plain ``--name`` inside
``--project``, locked while written), or a named file that is new or an earlier output of its kind;
outputs of equal input names stay apart."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import cv2
import pytest
import torch

from yolotrain import Yolov5, predict
from yolotrain.checkpoint import save_checkpoint
from yolotrain.cli import main
from yolotrain.data import generate_shapes_dataset
from yolotrain.interop.formats import REGISTRY, export_metadata_of
from yolotrain.runs import LOCK_NAME, run_dir

SIZE = 64
TORCHSCRIPT = ["--format", "torchscript", "--img", str(SIZE)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2, names=["circle", "rectangle"]).eval()
    return save_checkpoint(tmp_path_factory.mktemp("run") / "weights" / "best", model, state={"epoch": 0})


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=2, n_val=2, img_size=SIZE)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_error(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"yolotrain {command}: error: ") and err.count("\n") == 1, err
    return err


# ------------------------------------------------------------------------------------ export --output
def test_export_never_replaces_a_file_it_did_not_write(tmp_path, checkpoint, capsys):
    dataset_yaml = tmp_path / "data.yaml"
    dataset_yaml.write_text("path: .\nnames: [circle, rectangle]\n")
    other = save_checkpoint(tmp_path / "other" / "weights" / "best", Yolov5("n", num_classes=2).eval(),
                            state={"epoch": 0})
    other_set = {p: digest(p) for p in other.parent.iterdir()}
    for target in (dataset_yaml, other.with_suffix(".safetensors"), other):
        before = digest(target)
        assert main(["export", "--weights", str(checkpoint), *TORCHSCRIPT, "--output", str(target)]) == 1
        err = one_error(capsys, "export")
        assert f"the output {target} exists and is not an export to TorchScript written by yolotrain export" in err
        assert "pass --force to replace it" in err
        assert digest(target) == before
    assert {p: digest(p) for p in other.parent.iterdir()} == other_set


def test_export_replaces_its_earlier_export_and_with_force_any_file_but_an_input(tmp_path, checkpoint, capsys):
    out = tmp_path / "model.torchscript"
    for _ in range(2):  # the second run replaces the first one's export
        assert main(["export", "--weights", str(checkpoint), *TORCHSCRIPT, "--output", str(out)]) == 0
        assert capsys.readouterr().out == f"{out}\n"
    assert export_metadata_of(out, REGISTRY["torchscript"])["producer"] == "yolotrain"
    own = tmp_path / "notes.torchscript"
    own.write_text("my notes")
    assert main(["export", "--weights", str(checkpoint), *TORCHSCRIPT, "--output", str(own), "--force"]) == 0
    assert export_metadata_of(own, REGISTRY["torchscript"]) is not None
    weights = checkpoint.with_suffix(".safetensors")
    before = digest(weights)
    assert main(["export", "--weights", str(checkpoint), *TORCHSCRIPT, "--output", str(weights), "--force"]) == 1
    assert "outputs never overwrite inputs" in one_error(capsys, "export")
    assert digest(weights) == before


def test_an_export_of_another_format_is_not_an_earlier_output(tmp_path, checkpoint, capsys):
    out = tmp_path / "model.torchscript"
    assert main(["export", "--weights", str(checkpoint), *TORCHSCRIPT, "--output", str(out)]) == 0
    before = digest(out)
    assert main(["export", "--weights", str(checkpoint), "--format", "onnx", "--img", str(SIZE),
                 "--output", str(out)]) == 1
    assert f"the output {out} exists and is not an export to ONNX written" in one_error(capsys, "export")
    assert digest(out) == before


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (lengths below 128 bytes)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_onnx_metadata_is_read_from_the_protobuf_without_the_onnx_package(tmp_path):
    """ModelProto: ir_version (field 1, a number), graph (7, skipped), metadata_props (14: key 1, value 2)."""
    entries = b"".join(_field(14, _field(1, k.encode()) + _field(2, v.encode()))
                       for k, v in (("producer", "yolotrain"), ("nc", "2")))
    path = tmp_path / "model.onnx"
    path.write_bytes(bytes([1 << 3, 8]) + _field(7, b"\x00" * 100) + entries)
    assert export_metadata_of(path, REGISTRY["onnx"]) == {"producer": "yolotrain", "nc": "2"}
    path.write_bytes(path.read_bytes()[:-3])  # cut inside the last field
    assert export_metadata_of(path, REGISTRY["onnx"]) is None
    path.write_text("path: .\nnames: [a, b]\n")  # a YAML file is not an ONNX export
    assert export_metadata_of(path, REGISTRY["onnx"]) is None


def test_openvino_metadata_is_read_from_the_ir_xml(tmp_path):
    path = tmp_path / "model.xml"
    path.write_text('<?xml version="1.0"?>\n<net name="m" version="11"><layers/><edges/><rt_info>'
                    '<yolotrain><producer value="yolotrain"/><nc value="2"/></yolotrain></rt_info></net>\n')
    assert export_metadata_of(path, REGISTRY["openvino"]) == {"producer": "yolotrain", "nc": "2"}
    path.write_text('<net name="m" version="11"><rt_info/></net>')
    assert export_metadata_of(path, REGISTRY["openvino"]) is None


# ------------------------------------------------------------------------------------ --name
@pytest.mark.parametrize("name", ["../../../escaped", "a/b", "..", ".", "", "/abs"])
def test_a_run_name_is_one_folder_inside_the_project(tmp_path, name):
    with pytest.raises(ValueError, match="a run folder name is one folder name inside --project"):
        run_dir(tmp_path / "runs", name)


@pytest.mark.parametrize("command", ["train", "evolve", "tune", "val", "predict", "track"])
def test_every_command_refuses_a_name_outside_its_project(tmp_path, data, checkpoint, command, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    project = tmp_path / "a" / "b" / "runs"
    image = next((data / "images" / "val").iterdir())
    weights = ["--weights", str(checkpoint), "--img", str(SIZE)]
    training = ["--data", str(data / "data.yaml"), "--epochs", "1", "--img", str(SIZE), "--batch", "2",
                "--workers", "0"]
    argv = {"train": ["train", *training], "evolve": ["train", *training, "--evolve", "1"],
            "tune": ["tune", *training, "--trials", "1"], "val": ["val", *weights, "--data", str(data / "data.yaml")],
            "predict": ["predict", *weights, "--source", str(image)],
            "track": ["track", *weights, "--source", str(image)]}[command]
    assert main([*argv, "--project", str(project), "--name", "../../escaped"]) == 1
    err = one_error(capsys, "train" if command == "evolve" else command)
    assert "--name '../../escaped': a run folder name is one folder name inside --project" in err
    assert not (tmp_path / "a" / "escaped").exists() and not project.exists()


def test_train_refuses_a_name_outside_its_project_before_reading_data_or_model(tmp_path, capsys):
    """Settings first: a dataset scan (minutes on a large one) is not made before the name is found unusable."""
    assert main(["train", "--data", str(tmp_path / "missing.yaml"), "--model", str(tmp_path / "missing.pt"),
                 "--project", str(tmp_path / "runs"), "--name", "a/b"]) == 1
    assert "--name 'a/b': a run folder name is one folder name inside --project" in one_error(capsys, "train")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------ equal input names
def test_predict_gives_sources_of_equal_names_outputs_of_their_own(tmp_path, data, checkpoint):
    first, second = tmp_path / "a" / "x.jpg", tmp_path / "b" / "x.jpg"
    for path, (h, w) in ((first, (SIZE, SIZE)), (second, (48, 80))):
        path.parent.mkdir()
        cv2.imwrite(str(path), cv2.resize(cv2.imread(str(next((data / "images" / "val").iterdir()))), (w, h)))
    upper = tmp_path / "c" / "X.jpg"  # equal to x.jpg on case-insensitive file systems
    upper.parent.mkdir()
    upper.write_bytes(first.read_bytes())
    run = tmp_path / "runs" / "exp"
    assert main(["predict", "--weights", str(checkpoint), "--img", str(SIZE), "--source", str(first), str(second),
                 str(upper), "--save-txt", "--conf", "0.001", "--project", str(run.parent), "--name", run.name]) == 0
    assert sorted(p.name for p in run.glob("*.jpg")) == ["X_3.jpg", "x.jpg", "x_2.jpg"]
    assert cv2.imread(str(run / "x.jpg")).shape[:2] == (SIZE, SIZE)
    assert cv2.imread(str(run / "x_2.jpg")).shape[:2] == (48, 80)
    assert sorted(p.name for p in (run / "labels").iterdir()) == ["X_3.txt", "x.txt", "x_2.txt"]
    saved = json.loads((run / "predictions.json").read_text())
    assert [(entry["source"], entry["saved_as"]) for entry in saved] == [
        (str(first), "x"), (str(second), "x_2"), (str(upper), "X_3")]


def test_val_save_txt_gives_images_of_equal_names_label_files_of_their_own(tmp_path, data, checkpoint):
    both = tmp_path / "both.yaml"  # train and val images carry the same file names (00000.jpg ...)
    both.write_text(f"path: {data}\ntrain: images/train\nval: [images/train, images/val]\nnames: [circle, rectangle]\n")
    run = tmp_path / "runs" / "val"
    assert main(["val", "--weights", str(checkpoint), "--data", str(both), "--img", str(SIZE), "--workers", "0",
                 "--save-txt", "--project", str(run.parent), "--name", run.name]) == 0
    stems = sorted(p.stem for p in (data / "images" / "train").iterdir())
    assert sorted(p.stem for p in (run / "labels").iterdir()) == sorted(stems + [f"{s}_2" for s in stems])


# ------------------------------------------------------------------------------------ run folder locks
HOLDER = """
import sys
from yolotrain.runs import RunLock
with RunLock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


@pytest.mark.parametrize("command", ["predict", "val", "track"])
def test_a_second_writer_of_a_predict_val_or_track_folder_is_refused(tmp_path, data, checkpoint, command, capsys):
    """Another process (here a second run's stand-in) holds the run folder: the command stops in the one line
    train gives, before writing anything there."""
    run = tmp_path / "runs" / "exp"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        source = ["--source", str(data / "images" / "val")]
        extra = {"predict": [*source, "--save-txt"], "track": source,
                 "val": ["--data", str(data / "data.yaml"), "--workers", "0", "--save-txt"]}[command]
        assert main([command, "--weights", str(checkpoint), "--img", str(SIZE), *extra, "--project", str(run.parent),
                     "--name", run.name, "--exist-ok"]) == 1
        err = one_error(capsys, command)
        assert f"{run} is being written by process {holder.pid}: wait for it to end or stop it" in err
        assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]
    finally:
        holder.stdin.close()
        holder.wait()
    assert main([command, "--weights", str(checkpoint), "--img", str(SIZE), *extra, "--project", str(run.parent),
                 "--name", run.name, "--exist-ok"]) == 0
    assert not (run / LOCK_NAME).exists() and len(list(run.iterdir())) > 0


def test_a_predict_stream_holds_its_folder_until_it_ends(tmp_path, data, checkpoint):
    images = sorted((data / "images" / "val").iterdir())
    stream = predict(str(checkpoint), images, img_size=SIZE, save_dir=tmp_path / "out", stream=True)
    next(stream)
    assert (tmp_path / "out" / LOCK_NAME).is_file()
    stream.close()
    assert not (tmp_path / "out" / LOCK_NAME).exists()
    unstarted = predict(str(checkpoint), images, img_size=SIZE, save_dir=tmp_path / "out", stream=True)
    assert (tmp_path / "out" / LOCK_NAME).is_file()
    del unstarted  # dropped before its first step: released when collected
    assert not (tmp_path / "out" / LOCK_NAME).exists()
