"""Model YAMLs in the reference's format: ``Yolov5.from_yaml``, errors by line, checkpoints, training."""

import copy
import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from yolotrain import Yolov5, train
from yolotrain.checkpoint import CheckpointError, read_metadata, save_checkpoint
from yolotrain.data import generate_shapes_dataset
from yolotrain.interop import load_checkpoint
from yolotrain.model import read_model_yaml

# The structure of the reference's models/yolov5s.yaml (PyPI yolov5 7.0.14), comments included.
YOLOV5S_YAML = """\
# Parameters
nc: 80  # number of classes
depth_multiple: 0.33  # model depth multiple
width_multiple: 0.50  # layer channel multiple
anchors:
  - [10,13, 16,30, 33,23]  # P3/8
  - [30,61, 62,45, 59,119]  # P4/16
  - [116,90, 156,198, 373,326]  # P5/32

# YOLOv5 v6.0 backbone
backbone:
  # [from, number, module, args]
  [[-1, 1, Conv, [64, 6, 2, 2]],  # 0-P1/2
   [-1, 1, Conv, [128, 3, 2]],  # 1-P2/4
   [-1, 3, C3, [128]],
   [-1, 1, Conv, [256, 3, 2]],  # 3-P3/8
   [-1, 6, C3, [256]],
   [-1, 1, Conv, [512, 3, 2]],  # 5-P4/16
   [-1, 9, C3, [512]],
   [-1, 1, Conv, [1024, 3, 2]],  # 7-P5/32
   [-1, 3, C3, [1024]],
   [-1, 1, SPPF, [1024, 5]],  # 9
  ]

# YOLOv5 v6.0 head
head:
  [[-1, 1, Conv, [512, 1, 1]],
   [-1, 1, nn.Upsample, [None, 2, 'nearest']],
   [[-1, 6], 1, Concat, [1]],  # cat backbone P4
   [-1, 3, C3, [512, False]],  # 13

   [-1, 1, Conv, [256, 1, 1]],
   [-1, 1, nn.Upsample, [None, 2, 'nearest']],
   [[-1, 4], 1, Concat, [1]],  # cat backbone P3
   [-1, 3, C3, [256, False]],  # 17 (P3/8-small)

   [-1, 1, Conv, [256, 3, 2]],
   [[-1, 14], 1, Concat, [1]],  # cat head P4
   [-1, 3, C3, [512, False]],  # 20 (P4/16-medium)

   [-1, 1, Conv, [512, 3, 2]],
   [[-1, 10], 1, Concat, [1]],  # cat head P5
   [-1, 3, C3, [1024, False]],  # 23 (P5/32-large)

   [[17, 20, 23], 1, Detect, [nc, anchors]],  # Detect(P3, P4, P5)
  ]
"""

# A layout of our own: Focus stem, repeated Bottlenecks, SPP, two detection levels (P4, P5).
CUSTOM_YAML = """\
nc: 3
depth_multiple: 0.33
width_multiple: 0.25
anchors:
  - [30,61, 62,45, 59,119]  # P4/16
  - [116,90, 156,198, 373,326]  # P5/32
backbone:
  [[-1, 1, Focus, [64, 3]],  # 0-P1/2
   [-1, 1, Conv, [128, 3, 2]],  # 1-P2/4
   [-1, 3, C3, [128]],
   [-1, 1, Conv, [256, 3, 2]],  # 3-P3/8
   [-1, 6, Bottleneck, [256]],  # 4: two Bottlenecks in an nn.Sequential
   [-1, 1, Conv, [512, 3, 2]],  # 5-P4/16
   [-1, 3, C3, [512]],
   [-1, 1, Conv, [1024, 3, 2]],  # 7-P5/32
   [-1, 1, SPP, [1024, [5, 9, 13]]],  # 8
  ]
head:
  [[-1, 1, Conv, [512, 1, 1]],  # 9
   [-1, 1, nn.Upsample, [None, 2, 'nearest']],
   [[-1, 6], 1, Concat, [1]],
   [-1, 3, C3, [512, False]],  # 12 (P4/16)
   [[12, 9], 1, Detect, [nc, anchors]],
  ]
"""


def write(tmp_path: Path, text: str, name: str = "model.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_reference_yolov5s_yaml_builds_yolov5s(tmp_path):
    path = write(tmp_path, YOLOV5S_YAML)
    torch.manual_seed(7)
    built = Yolov5.from_yaml(path, num_classes=2)
    torch.manual_seed(7)
    ours = Yolov5("s", num_classes=2)
    assert (built.version, built.num_classes, read_model_yaml(path).nc) == ("s", 2, 80)
    assert sum(p.numel() for p in built.parameters()) == sum(p.numel() for p in ours.parameters()) == 7_025_023
    assert [name for name, _ in built.named_modules()] == [name for name, _ in ours.named_modules()]
    assert {k: v.shape for k, v in built.state_dict().items()} == {k: v.shape for k, v in ours.state_dict().items()}
    assert list(built.state_dict()) == list(ours.state_dict())
    imgs = torch.rand(2, 3, 64, 96)
    for a, b in zip(built.train()(imgs), ours.train()(imgs)):
        assert torch.equal(a, b)
    with torch.no_grad():
        assert torch.equal(built.eval()(imgs), ours.eval()(imgs))


def test_custom_layout_equals_the_reference_built_from_the_same_yaml(reference, tmp_path):
    path = write(tmp_path, CUSTOM_YAML)
    torch.manual_seed(3)
    ref = reference.models.yolo.Model(str(path))
    torch.manual_seed(3)
    ours = Yolov5.from_yaml(path)
    assert (ours.version, ours.num_classes, ours.stride.tolist()) == ("custom", 3, [16.0, 32.0])
    assert ref.stride.tolist() == [16.0, 32.0]
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert type(ours.model[4]).__name__ == "Sequential" and len(ours.model[4]) == 2
    ref_params = dict(ref.named_parameters())
    for key, value in ours.named_parameters():
        assert torch.equal(value, ref_params[key]), key
    ours.load_state_dict(ref.state_dict())  # the reference's stride probe moved its BatchNorm statistics
    imgs = torch.rand(2, 3, 64, 96)
    for a, b in zip(ours.train()(imgs), ref.train()(imgs)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(imgs), ref.eval()(imgs)[0], rtol=1e-5, atol=1e-4)


# (text in yolov5s.yaml, its replacement, expected message after "file:line: ")
BROKEN = [
    ("[-1, 1, SPPF, [1024, 5]]", "[-1, 1, C2f, [1024, 5]]", "unknown block 'C2f' (supported: Conv, C3, SPPF"),
    ("[-1, 3, C3, [128]],", "[-1, 3, C3],", "a layer must be [from, number, module, args], got [-1, 3, 'C3']"),
    ("[[-1, 6], 1, Concat, [1]]", "[[-1, 4], 1, Concat, [1]]",
     "Concat of maps of different sizes (layer 11 at stride 16, layer 4 at stride 8)"),
    ("[[-1, 6], 1, Concat, [1]]", "[[-1, 30], 1, Concat, [1]]", "'from' 30 does not name an earlier layer"),
    ("[-1, 1, Conv, [128, 3, 2]],", "[-1, 1, Conv, [wide, 3, 2]],", "output channels must be a positive integer"),
    ("[-1, 1, Conv, [128, 3, 2]],", "[-1, 1, Conv, [128, 3, 2, 1, 1, 1, False]],", "Conv takes at most 5 arguments"),
    ("[-1, 9, C3, [512]],", "[-1, 0, C3, [512]],", "number must be a positive integer, got 0"),
    ("[-1, 1, nn.Upsample, [None, 2, 'nearest']],", "[-1, 1, nn.Upsample, [None, 2, 'bilinear']],",
     "nn.Upsample mode 'bilinear' is not supported"),
    ("[[17, 20, 23], 1, Detect, [nc, anchors]]", "[[17, 20], 1, Detect, [nc, anchors]]",
     "3 anchor rows for 2 detection levels"),
    ("depth_multiple: 0.33", "depth_multiple: deep", "depth_multiple must be a positive number, got 'deep'"),
    ("[[-1, 1, Conv, [64, 6, 2, 2]],", "[[-1, 1, Conv, [64, 6, 2, 2],", "not valid YAML"),
    # Bounds: kernels, strides, repeats, widths and the parameter count, before any layer is built.
    ("[-1, 1, Conv, [128, 3, 2]],", "[-1, 1, Conv, [128, -3, 2]],", "kernel size must be an integer from 1 to 31"),
    ("[-1, 1, Conv, [128, 3, 2]],", "[-1, 1, Conv, [128, 0, 2]],", "kernel size must be an integer from 1 to 31"),
    ("[-1, 1, Conv, [128, 3, 2]],", "[-1, 1, Conv, [128, 3, 0]],", "stride must be an integer from 1 to 16"),
    ("[-1, 1, Conv, [128, 3, 2]],", "[-1, 1, Conv, [128, 3, 2, -1]],", "padding must be None or an integer"),
    ("[-1, 1, SPPF, [1024, 5]]", "[-1, 1, SPPF, [1024, -5]]", "kernel size must be an integer from 1 to 31"),
    ("[-1, 9, C3, [512]],", "[-1, 1000000000, C3, [512]],", "number 1000000000 x depth_multiple 0.33 gives"),
    ("[-1, 1, Conv, [128, 3, 2]],", "[-1, 1, Conv, [100000000, 3, 2]],",
     "100000000 output channels x width_multiple 0.5 gives 50000000, more than 16384"),
    ("[-1, 1, Conv, [1024, 3, 2]],", "[-1, 1, Conv, [16384, 31, 2]],", "the model would have more than 300,000,000"),
    ("width_multiple: 0.50", "width_multiple: 1.0e+9", "width_multiple 1e+09 is more than 16"),
]


@pytest.mark.parametrize(("old", "new", "expected"), BROKEN, ids=[b[2].split(" (")[0][:40] for b in BROKEN])
def test_bad_entries_get_one_line_naming_the_yaml_line(tmp_path, old, new, expected):
    assert YOLOV5S_YAML.count(old) >= 1
    text = YOLOV5S_YAML.replace(old, new, 1)
    path = write(tmp_path, text, "my.yaml")
    line = next(i for i, row in enumerate(text.splitlines(), 1) if new in row)
    with pytest.raises(ValueError) as info:
        Yolov5.from_yaml(path)
    message = str(info.value)
    assert "\n" not in message
    if expected == "not valid YAML":  # the parser reports where it noticed, a few lines on
        assert message.startswith(f"{path}:") and expected in message
    else:
        assert message.startswith(f"{path}:{line}: {expected}"), message


hostile = st.sampled_from([-(10**9), -3, -1, 0, 1, 2, 3, 7, 10**9, 2.5, "x", None, True, [], [3, 3], "nc"])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_layer_entries_build_or_fail_in_one_line(tmp_path, data):
    """One value of one layer entry (its from, number or an argument) replaced by a hostile one: the
    model builds, or the YAML is refused in one line naming its line; never another exception."""
    spec = read_model_yaml(write(tmp_path, CUSTOM_YAML))
    entries = [*spec.backbone, *spec.head]
    index = data.draw(st.integers(0, len(entries) - 1))
    entry = copy.deepcopy(entries[index])
    slot = data.draw(st.integers(0, 1 + len(entry[3])))
    value = data.draw(hostile)
    if slot < 2:
        entry[slot] = value
    else:
        entry[3][slot - 2] = value
    lines = CUSTOM_YAML.splitlines()
    first = index in (0, len(spec.backbone))  # the line that also opens its list
    lines[spec.lines[index] - 1] = ("  [" if first else "   ") + json.dumps(entry) + ","
    path = write(tmp_path, "\n".join(lines) + "\n", "fuzzed.yaml")
    try:
        Yolov5.from_yaml(path)
    except ValueError as error:
        assert str(error).startswith(f"{path}:") and "\n" not in str(error), str(error)


def test_missing_sections_and_autoanchor_counts_are_named(tmp_path):
    no_head = write(tmp_path, YOLOV5S_YAML.split("# YOLOv5 v6.0 head")[0], "no_head.yaml")
    with pytest.raises(ValueError, match=f"^{no_head}: no 'head' entry$"):
        Yolov5.from_yaml(no_head)
    counted = write(tmp_path, YOLOV5S_YAML.replace("anchors:\n", "anchors: 3\nold_anchors:\n"), "counted.yaml")
    with pytest.raises(ValueError, match=f"^{counted}:5: anchors: 3 gives a count without sizes, which needs auto"):
        Yolov5.from_yaml(counted)
    with pytest.raises(FileNotFoundError, match="model YAML not found"):
        Yolov5.from_yaml(tmp_path / "absent.yaml")


def test_official_checkpoint_of_a_custom_layout_is_rebuilt_from_its_yaml(reference, tmp_path):
    """A reference model built from a custom YAML, pickled as the reference does: the pickled model
    yaml gives the layout (read without running pickled code), the outputs are the reference's."""
    import numpy as np
    from test_interop import MAKE_CHECKPOINTS, reference_env, run_python

    from yolotrain.interop import load_model

    write(tmp_path, CUSTOM_YAML, "custom.yaml")
    inputs = tmp_path / "inputs.npy"
    np.save(inputs, torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(0)).numpy())
    run_python([str(MAKE_CHECKPOINTS), "reference", str(tmp_path), str(inputs), "custom.yaml:3:float32:1"],
               reference_env(tmp_path))
    model = load_model(tmp_path / "custom.pt")
    assert (model.version, model.num_classes, model.names) == ("custom", 3, ["class0", "class1", "class2"])
    assert type(model.model[0]).__name__ == "Focus" and model.stride.tolist() == [16.0, 32.0]
    with torch.no_grad():
        ours = model(torch.from_numpy(np.load(inputs))).numpy()
    np.testing.assert_allclose(ours, np.load(tmp_path / "custom.npy"), rtol=1e-6, atol=1e-4)


def test_checkpoint_of_a_yaml_model_is_self_contained(tmp_path):
    path = write(tmp_path, CUSTOM_YAML)
    torch.manual_seed(0)
    model = Yolov5.from_yaml(path, names=["a", "b", "c"]).eval()
    json_path = save_checkpoint(tmp_path / "run" / "best", model)
    path.unlink()  # the checkpoint records the layers, not where they came from
    meta = json.loads(json_path.read_text())
    assert meta["version"] == "custom" and meta["cfg"]["backbone"][0] == [-1, 1, "Focus", [64, 3]]
    loaded, _ = load_checkpoint(json_path)
    assert (loaded.version, loaded.names, loaded.stride.tolist()) == ("custom", ["a", "b", "c"], [16.0, 32.0])
    imgs = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(loaded(imgs), model(imgs))
    # A published architecture keeps the short form.
    plain = json.loads(save_checkpoint(tmp_path / "s" / "best", Yolov5("n6", num_classes=2)).read_text())
    assert plain["version"] == "n6" and "cfg" not in plain and plain["strides"] == [8.0, 16.0, 32.0, 64.0]
    assert load_checkpoint(tmp_path / "s" / "best.json")[0].version == "n6"


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda cfg: cfg["backbone"][1][3].__setitem__(1, -3), "layer 1: kernel size must be an integer from 1 to 31"),
    (lambda cfg: cfg.__setitem__("width_multiple", 4096.0), "width_multiple 4096 is more than 16"),
    (lambda cfg: cfg["backbone"][2].__setitem__(1, 10**9), "layer 2: number 1000000000 x depth_multiple 0.33"),
    (lambda cfg: cfg["backbone"][7][3].__setitem__(0, 600000), "layer 7: 600000 output channels"),
    (lambda cfg: cfg.__setitem__("head", "x"), "head must be a list"),
], ids=["negative-kernel", "width", "repeats", "channels", "head"])
def test_an_edited_checkpoint_cfg_is_refused_with_its_other_fields(tmp_path, edit, expected):
    model = Yolov5.from_yaml(write(tmp_path, CUSTOM_YAML))
    json_path = save_checkpoint(tmp_path / "best", model)
    meta = json.loads(json_path.read_text())
    edit(meta["cfg"])
    json_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError) as info:
        read_metadata(json_path)  # the json alone: no tensor is read, no layer built
    message = str(info.value)
    assert message.startswith(f"{json_path}: field 'cfg' is not a valid architecture") and expected in message
    assert "\n" not in message


def test_training_builds_the_model_of_a_yaml(tmp_path):
    data = generate_shapes_dataset(root=tmp_path / "shapes", n_train=4, n_val=2, img_size=64) / "data.yaml"
    cfg = write(tmp_path, CUSTOM_YAML)
    result = train(data=str(data), model=str(cfg), img_size=64, batch_size=2, epochs=1, workers=0, val=False,
                   plots=False, project=str(tmp_path / "runs"))
    model, meta = load_checkpoint(result.last)
    # The dataset's two classes replace the YAML's nc: 3.
    assert (model.version, model.num_classes, model.names) == ("custom", 2, ["circle", "rectangle"])
    assert meta["cfg"]["head"][-1] == [[12, 9], 1, "Detect", ["nc", "anchors"]]


def test_cli_reports_a_bad_model_yaml_in_one_line(tmp_path, capsys):
    from yolotrain.cli import main

    data = generate_shapes_dataset(root=tmp_path / "shapes", n_train=2, n_val=1, img_size=64) / "data.yaml"
    text = YOLOV5S_YAML.replace("[-1, 1, SPPF, [1024, 5]]", "[-1, 1, C2f, [1024, 5]]")
    cfg = write(tmp_path, text, "my.yaml")
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "C2f" in row)
    assert main(["train", "--data", str(data), "--model", str(cfg), "--project", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"yolotrain train: error: {cfg}:{line}: unknown block 'C2f'") and err.count("\n") == 1
