"""Official Ultralytics checkpoints (YOLOv8, YOLO11, YOLOv5u) read as data, against files its own code writes."""

from __future__ import annotations

import copy
import os
import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import offline_ultralytics

from yolotrain.checkpoint import CheckpointError
from yolotrain.interop import UnsafeCheckpointError, UnsupportedCheckpointError, read_torch_file
from yolotrain.interop.loading import hub
from yolotrain.interop.loading.classify import read_classifier
from yolotrain.interop.loading.ultralytics import (
    UltralyticsWeights,
    architecture_name,
    is_ultralytics_checkpoint,
    read_ultralytics,
)

NAMES = {0: "circle", 1: "rectangle", 2: "triangle"}
# yaml → (model class, task, head index)
SUPPORTED = {
    "yolov8n.yaml": ("DetectionModel", "detect", 22),
    "yolo11n.yaml": ("DetectionModel", "detect", 23),
    "yolov5nu.yaml": ("DetectionModel", "detect", 24),
    "yolov8n-seg.yaml": ("SegmentationModel", "segment", 22),
    "yolov8n-obb.yaml": ("OBBModel", "obb", 22),
    "yolov8n-cls.yaml": ("ClassificationModel", "classify", 9),
    "yolov8n-pose.yaml": ("PoseModel", "pose", 22),
}
UNSUPPORTED = {
    "yolo26n.yaml": ("DetectionModel", "an end-to-end (NMS-free) model: its ultralytics.nn.modules.head.Detect head"),
    "yolov10n.yaml": ("DetectionModel", "an end-to-end (NMS-free) model: its ultralytics.nn.modules.head.v10Detect"),
}


class RunsShell:
    """Pickles as a call to os.system that would create the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> SimpleNamespace:
    """Ultralytics models built from its bundled YAMLs (3 classes) and the checkpoints its trainer writes of them
    (``last.pt``: ``model`` None, the half-precision EMA model under ``ema``, optimizer and metrics); yolov8n also as
    ``strip_optimizer`` finalises a release file (the model under ``model``, ``ema`` None)."""
    folder = tmp_path_factory.mktemp("checkpoints")
    with offline_ultralytics(tmp_path_factory):
        from ultralytics.nn import tasks
        from ultralytics.utils import DEFAULT_CFG_DICT, IterableSimpleNamespace
        from ultralytics.utils.torch_utils import convert_optimizer_state_dict_to_fp16, strip_optimizer

        torch.manual_seed(0)
        models, paths = {}, {}
        for yaml_name, (model_class, *_) in {**SUPPORTED, **UNSUPPORTED}.items():
            model = getattr(tasks, model_class)(yaml_name, nc=len(NAMES), verbose=False)
            model.names = dict(NAMES)
            args = IterableSimpleNamespace(**{**DEFAULT_CFG_DICT, "model": yaml_name})
            model.args = args  # as the trainer attaches its settings
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            for parameter in model.parameters():
                parameter.grad = torch.zeros_like(parameter)
            optimizer.step()  # momentum buffers in the optimizer's state (a zero step leaves the weights as they are)
            ema = copy.deepcopy(model).half()
            paths[yaml_name] = folder / yaml_name.replace(".yaml", ".pt")
            torch.save({"epoch": 0, "best_fitness": np.float64(0.5), "model": None, "ema": ema, "updates": 1,
                        "optimizer": convert_optimizer_state_dict_to_fp16(copy.deepcopy(optimizer.state_dict())),
                        "train_args": vars(args), "train_metrics": {"fitness": np.float64(0.25)},
                        "date": "2026-01-01T00:00:00+00:00", "version": "8.4.0",
                        "license": "AGPL-3.0 (https://ultralytics.com/license)"}, paths[yaml_name])
            models[yaml_name] = model
        release = folder / "yolov8n-release.pt"
        strip_optimizer(paths["yolov8n.yaml"], str(release))
    return SimpleNamespace(models=models, paths=paths, release=release, folder=folder)


def read(path: Path, use_ema: bool = True) -> UltralyticsWeights:
    return read_ultralytics(read_torch_file(path), str(path), use_ema=use_ema)


@pytest.mark.parametrize("yaml_name", list(SUPPORTED))
def test_weights_yaml_names_and_task_are_ultralytics_own(made, yaml_name):
    model, path = made.models[yaml_name], made.paths[yaml_name]
    _, task, head_index = SUPPORTED[yaml_name]
    weights = read(path)
    expected = model.state_dict()
    assert list(weights.state_dict) == list(expected)  # the names (and order) of Ultralytics' state_dict()
    for key, value in expected.items():
        ours = weights.state_dict[key]
        assert ours.shape == value.shape, key
        if value.is_floating_point():
            assert ours.dtype == torch.float16 and torch.equal(ours.float(), value.half().float()), key
        else:
            assert torch.equal(ours, value), key
    assert weights.yaml == model.yaml and {"scale", "scales", "yaml_file"} <= set(weights.yaml)
    assert weights.task == task and weights.names == list(NAMES.values()) and weights.nc == len(NAMES)
    assert weights.in_channels == 3 and weights.architecture == yaml_name.removesuffix(".yaml")
    assert weights.kind.startswith(f"official Ultralytics {weights.architecture} checkpoint (ultralytics.nn.tasks.")
    assert weights.kpt_shape == ((17, 3) if task == "pose" else None)
    if task == "classify":
        assert weights.reg_max is None and weights.stride == ()
    else:
        head = model.model[head_index]
        assert weights.reg_max == head.reg_max == 16 and weights.stride == tuple(head.stride.tolist())
        assert f"model.{head_index}.dfl.conv.weight" in weights.state_dict


def test_a_release_file_written_by_strip_optimizer_is_read_alike(made):
    contents = read_torch_file(made.release)
    assert contents["ema"] is None and is_ultralytics_checkpoint(contents)
    released, trained = read(made.release), read(made.paths["yolov8n.yaml"])
    assert released.state_dict.keys() == trained.state_dict.keys()
    assert all(torch.equal(released.state_dict[key], value) for key, value in trained.state_dict.items())
    assert (released.yaml, released.names, released.task) == (trained.yaml, trained.names, trained.task)
    assert "ultralytics " in released.kind


def test_the_ema_entry_is_read_first_unless_use_ema_is_off(made):
    v8, v11 = (read_torch_file(made.paths[name])["ema"] for name in ("yolov8n.yaml", "yolo11n.yaml"))
    both = {"model": v8, "ema": v11, "version": "8.4.0"}
    assert read_ultralytics(both, "both").architecture == "yolo11n"
    assert read_ultralytics(both, "both", use_ema=False).architecture == "yolov8n"
    assert read(made.paths["yolov8n.yaml"], use_ema=False).architecture == "yolov8n"  # no 'model': the EMA
    bare = read_ultralytics(v8, "bare")  # a bare pickled model
    assert bare.architecture == "yolov8n" and bare.kind.endswith("(ultralytics.nn.tasks.DetectionModel)")


def test_ultralytics_checkpoints_are_told_from_yolov5_ones(made, tmp_path):
    assert all(is_ultralytics_checkpoint(read_torch_file(path)) for path in made.paths.values())
    state = tmp_path / "state.pt"
    torch.save({"model.0.conv.weight": torch.ones(1)}, state)
    assert not is_ultralytics_checkpoint(read_torch_file(state))
    assert not is_ultralytics_checkpoint({"model": None, "ema": None}) and not is_ultralytics_checkpoint([1])
    with pytest.raises(CheckpointError, match="not an Ultralytics checkpoint"):
        read_ultralytics(read_torch_file(state), str(state))
    # An Ultralytics classifier is not a YOLOv5 one: the YOLOv5 classifier reader leaves it alone.
    path = made.paths["yolov8n-cls.yaml"]
    assert read_classifier(read_torch_file(path), str(path)) is None


@pytest.mark.parametrize("yaml_name", list(UNSUPPORTED))
def test_unsupported_models_are_named_in_one_line(made, yaml_name):
    path = made.paths[yaml_name]
    with pytest.raises(UnsupportedCheckpointError) as info:
        read(path)
    message = str(info.value)
    assert message.startswith(f"{path}: unsupported checkpoint: {UNSUPPORTED[yaml_name][1]}") and "\n" not in message
    assert message.endswith("; YOLOv8, YOLO11 and YOLOv5u detection, segmentation, oriented-box (OBB), classification "
                            "and pose models are supported")


def test_a_head_that_does_not_fit_its_tensors_is_refused(made):
    contents = read_torch_file(made.paths["yolov8n.yaml"])
    head = contents["ema"].get("_modules")["model"].get("_modules")["22"]
    head.state["nc"] = 5
    with pytest.raises(CheckpointError, match=r"the head's cv3\.0 ends in 3 channels, 5 expected for nc=5, reg_max=16"):
        read_ultralytics(contents, "edited")


def test_code_in_an_ultralytics_checkpoint_is_refused_and_never_runs(made, tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"model": copy.deepcopy(made.models["yolov8n.yaml"]).half(), "train_args": RunsShell(marker)}, path)
    with pytest.raises(UnsafeCheckpointError) as info:
        read_torch_file(path)
    assert str(info.value).startswith(f"{path}: refusing to load '{os.system.__module__}.system'")
    assert not marker.exists()
    # A dotted name inside the Ultralytics namespace is not walked to os.system either.
    sneaky = tmp_path / "sneaky.pt"
    sneaky.write_bytes(b"\x80\x04\x8c\x14ultralytics.nn.tasks\x94\x8c\tos.system\x94\x93\x94\x8c\x04true\x94\x85\x94R\x94.")
    with pytest.raises(UnsafeCheckpointError, match="refusing to load 'ultralytics.nn.tasks.os.system'"):
        read_torch_file(sneaky)


def test_a_truncated_ultralytics_checkpoint_is_one_line(made, tmp_path):
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(made.paths["yolo11n.yaml"].read_bytes()[:50000])
    with pytest.raises(CheckpointError) as info:
        read_torch_file(truncated)
    assert str(info.value).startswith(f"{truncated}: not a readable PyTorch checkpoint") and "\n" not in str(info.value)


@pytest.mark.parametrize(("yaml", "expected"), [
    ({"yaml_file": "yolov8n.yaml", "scale": "n"}, "yolov8n"),
    ({"yaml_file": "yolov8.yaml", "scale": "s", "scales": {"n": [], "s": []}}, "yolov8s"),
    ({"yaml_file": "my_configs/yolo11m-seg.yaml", "scale": "m"}, "yolo11m-seg"),
    ({"yaml_file": "C:\\cfg\\yolov5xu.yaml"}, "yolov5xu"),  # before Ultralytics recorded the scale
    ({"yaml_file": "yolov8n-cls.yaml", "scale": "x"}, None),  # contradicts its name
    ({"yaml_file": "yolov8.yaml", "scale": "q", "scales": {"n": []}}, None),
    ({"yaml_file": "my-detector.yaml", "scale": "n"}, None),
    ({"scale": "n"}, None),
])
def test_architecture_names(yaml, expected):
    assert architecture_name(yaml) == expected


def test_an_ultralytics_name_is_found_on_disk_and_never_downloaded(tmp_path, monkeypatch):
    folder = tmp_path / "weights"
    monkeypatch.setenv("YOLOTRAIN_WEIGHTS", str(folder))
    monkeypatch.chdir(tmp_path)

    def no_network(*args, **kwargs):
        raise AssertionError("no download may be attempted")

    monkeypatch.setattr(hub.urllib.request, "urlopen", no_network)
    assert {"yolov8n.pt", "yolo11x-seg.pt", "yolov8s-cls.pt", "yolov5nu.pt"} <= set(hub.ULTRALYTICS_WEIGHTS)
    assert hub.is_official_name("yolo11n.pt") and not hub.is_official_name("runs/yolo11n.pt")
    assert not set(hub.ULTRALYTICS_WEIGHTS) & set(hub.SHA256)
    with pytest.raises(hub.WeightsUnavailableError) as info:
        hub.resolve_weights("yolov8n.pt")
    message = str(info.value)
    assert "\n" not in message and str(folder) in message and "no SHA-256" in message
    assert "https://github.com/ultralytics/assets/releases/download/v8.3.0/yolov8n.pt" in message
    assert not folder.exists()
    folder.mkdir()
    (folder / "yolov8n.pt").write_bytes(b"x")
    assert hub.resolve_weights("yolov8n.pt") == folder / "yolov8n.pt"
    (tmp_path / "yolov8n.pt").write_bytes(b"x")
    assert hub.resolve_weights("yolov8n.pt") == Path("yolov8n.pt")  # the working folder's own file


def test_a_missing_ultralytics_name_is_one_line_from_the_command_line(tmp_path, monkeypatch, capsys):
    from yolotrain.cli import main

    monkeypatch.setenv("YOLOTRAIN_WEIGHTS", str(tmp_path / "weights"))
    monkeypatch.chdir(tmp_path)
    assert main(["export", "--weights", "yolo11n.pt", "--format", "torchscript"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "releases/download/v8.3.0/yolo11n.pt" in err
    assert str(tmp_path / "weights") in err


def test_ultralytics_weights_are_plain_pickle_free_values(made):
    weights = read(made.paths["yolov8n-seg.yaml"])
    assert pickle.loads(pickle.dumps(weights.yaml)) == weights.yaml
    assert all(type(value) is torch.Tensor for value in weights.state_dict.values())
