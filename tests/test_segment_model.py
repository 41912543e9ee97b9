"""The YOLOv5 segmentation models: sizes, output contracts, reference state dicts and checkpoints, model YAMLs,
detection weights taken over."""

import collections
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from yolotrain import Yolov5
from yolotrain.checkpoint import save_checkpoint
from yolotrain.interop import load_checkpoint, load_model
from yolotrain.interop.loading.hub import WeightsUnavailableError, resolve_weights
from yolotrain.interop.loading.unpickler import UnsafeCheckpointError, read_torch_file
from yolotrain.model import Detect, Proto, Segment, read_model_yaml

# Parameter counts of the reference's SegmentationModel (models/segment/yolov5*-seg.yaml, unfused), per
# size and class count; test_reference_state_dict_loads_and_gives_its_outputs measures one live.
REFERENCE_PARAMETERS = {
    ("n", 2): 1_886_015, ("n", 80): 1_991_549,
    ("s", 2): 7_410_911, ("s", 80): 7_621_277,
    ("m", 2): 21_675_199, ("m", 80): 21_990_397,
    ("l", 2): 47_504_927, ("l", 80): 47_924_957,
    ("x", 2): 88_294_655, ("x", 80): 88_819_517,
}


@pytest.mark.parametrize(("version", "nc"), sorted(REFERENCE_PARAMETERS))
def test_parameter_count_equals_reference(version, nc):
    model = Yolov5(version, num_classes=nc, task="segment")
    assert sum(p.numel() for p in model.parameters()) == REFERENCE_PARAMETERS[(version, nc)]
    # The reference scales the 256 prototype channels by the width multiple.
    assert (model.task, model.version, model.num_masks) == ("segment", f"{version}-seg", 32)
    assert model.num_protos == {"n": 64, "s": 128, "m": 192, "l": 256, "x": 320}[version]


def test_train_mode_returns_maps_and_prototypes():
    model = Yolov5("n", num_classes=3, task="segment").train()
    maps, proto = model(torch.rand(2, 3, 64, 96))
    assert [tuple(m.shape) for m in maps] == [(2, 3, 64 // s, 96 // s, 5 + 3 + 32) for s in (8, 16, 32)]
    assert tuple(proto.shape) == (2, 32, 16, 24)


def test_eval_mode_decodes_boxes_and_keeps_raw_mask_coefficients():
    model = Yolov5("n-seg", num_classes=3)
    imgs = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        decoded, eval_proto = model.eval()(imgs)
        maps, proto = model.forward_maps(imgs)  # the raw maps of the same (eval-mode) network
    n = 3 * (8 * 8 + 4 * 4 + 2 * 2)
    assert tuple(decoded.shape) == (1, n, 5 + 3 + 32) and tuple(eval_proto.shape) == (1, 32, 16, 16)
    assert torch.equal(proto, eval_proto)
    # The boxes and scores are the detection decoding of the first 5+nc outputs; the coefficients stay raw.
    head = model.head
    detection_head = Detect(3, head.anchors * head.stride.view(-1, 1, 1), tuple(c.in_channels for c in head.m),
                            tuple(int(s) for s in head.stride))
    boxes = detection_head.decode([m[..., :8] for m in maps])
    torch.testing.assert_close(decoded[..., :8], boxes)
    coefficients = torch.cat([m[..., 8:].reshape(1, -1, 32) for m in maps], 1)
    torch.testing.assert_close(decoded[..., 8:], coefficients)
    assert decoded[..., 8:].min() < 0  # not squashed by a sigmoid


def test_task_and_version_must_agree():
    assert Yolov5("yolov5s-seg", num_classes=2).task == "segment"
    assert Yolov5("s", num_classes=2).task == "detect" and Yolov5("s").num_masks == 0
    with pytest.raises(ValueError, match="has a Segment head, which makes a segment model, not a detect one"):
        Yolov5("n-seg", task="detect")
    with pytest.raises(ValueError, match="no published segmentation model of the P6 layout yolov5n6"):
        Yolov5("n6", task="segment")
    with pytest.raises(ValueError, match="unknown task 'classify'"):
        Yolov5("n", task="classify")


def test_segment_bias_priors_leave_the_mask_coefficients_at_zero():
    head = Yolov5("n", num_classes=4, task="segment").head
    assert isinstance(head, Segment) and isinstance(head.proto, Proto)
    for conv in head.m:
        bias = conv.bias.detach().view(head.na, -1)
        assert bias.shape[1] == 5 + 4 + 32
        init_bound = conv.in_channels ** -0.5  # nn.Conv2d's uniform bias initialisation
        assert torch.all(bias[:, 4] < -3) and torch.all(bias[:, 5:9] < -1)
        assert torch.all(bias[:, 9:].abs() <= init_bound)


def _reference_segmentation_model(reference, version: str, nc: int):
    from yolov5.models.yolo import SegmentationModel

    config = Path(reference.__file__).parent / "models" / "segment" / f"yolov5{version}-seg.yaml"
    return SegmentationModel(str(config), nc=nc)


def test_reference_state_dict_loads_and_gives_its_outputs(reference):
    torch.manual_seed(0)
    ref = _reference_segmentation_model(reference, "n", 2)
    ours = Yolov5("n", num_classes=2, task="segment")
    assert list(ref.state_dict()) == list(ours.state_dict())
    assert sum(p.numel() for p in ref.parameters()) == REFERENCE_PARAMETERS[("n", 2)]
    ours.load_state_dict(ref.state_dict())
    imgs = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        (ref_maps, ref_proto), (our_maps, our_proto) = ref.train()(imgs), ours.train()(imgs)
        for a, b in zip(ref_maps, our_maps):
            torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
        torch.testing.assert_close(our_proto, ref_proto, atol=1e-5, rtol=0)
        ref_decoded, ref_proto, _ = ref.eval()(imgs)
        our_decoded, our_proto = ours.eval()(imgs)
    torch.testing.assert_close(our_decoded, ref_decoded, atol=1e-4, rtol=1e-6)
    torch.testing.assert_close(our_proto, ref_proto, atol=1e-5, rtol=0)


SEGMENT_YAML = """\
nc: 80
depth_multiple: 0.33
width_multiple: 0.25
anchors:
  - [10,13, 16,30, 33,23]  # P3/8
  - [30,61, 62,45, 59,119]  # P4/16
  - [116,90, 156,198, 373,326]  # P5/32
backbone:
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
   [[17, 20, 23], 1, Segment, [nc, anchors, 32, 256]],  # Detect(P3, P4, P5)
  ]
"""


def test_segment_yaml_builds_the_published_model_or_its_own_sizes(tmp_path):
    path = tmp_path / "yolov5n-seg.yaml"
    path.write_text(SEGMENT_YAML)
    model = Yolov5.from_yaml(path, num_classes=2)
    assert (model.version, model.task) == ("n-seg", "segment")
    assert sum(p.numel() for p in model.parameters()) == REFERENCE_PARAMETERS[("n", 2)]
    custom = tmp_path / "custom-seg.yaml"
    custom.write_text(SEGMENT_YAML.replace("Segment, [nc, anchors, 32, 256]", "Segment, [nc, anchors, 16]"))
    model = Yolov5.from_yaml(custom, num_classes=2)
    assert (model.version, model.num_masks, model.num_protos) == ("custom", 16, 64)
    maps, proto = model.train()(torch.rand(1, 3, 64, 64))
    assert maps[0].shape[-1] == 5 + 2 + 16 and proto.shape[1] == 16
    # The checkpoint of a custom segmentation layout carries its layers.
    save_checkpoint(tmp_path / "custom", model)
    loaded, meta = load_checkpoint(tmp_path / "custom")
    assert (loaded.task, loaded.num_masks, meta["version"]) == ("segment", 16, "custom")


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("Segment, [nc, anchors, 32, 256]", "Segment, [nc, anchors, 0, 256]",
     ":35: Segment's mask count must be an integer from 1 to 256, got 0"),
    ("Segment, [nc, anchors, 32, 256]", "Segment, [nc, anchors, 32, 256, 1]",
     ":35: Segment takes [nc, anchors, masks, protos], got"),
    ("[-1, 3, C3, [1024, False]],  # 23", "[[17, 20], 1, Segment, [nc, anchors]],  # 23",
     ":34: Segment must be the last layer"),
])
def test_bad_segment_entries_get_one_line_naming_the_yaml_line(tmp_path, old, new, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(SEGMENT_YAML.replace(old, new))
    with pytest.raises(ValueError) as info:
        Yolov5.from_yaml(path)
    assert str(info.value).startswith(f"{path}{expected}") and "\n" not in str(info.value)


def test_checkpoint_round_trip_keeps_the_segmentation_model(tmp_path):
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=3, task="segment", names=["a", "b", "c"]).eval()
    save_checkpoint(tmp_path / "seg", model)
    loaded, meta = load_checkpoint(tmp_path / "seg")
    assert (meta["version"], loaded.task, loaded.names) == ("n-seg", "segment", ["a", "b", "c"])
    imgs = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        for a, b in zip(model(imgs), loaded(imgs)):
            assert torch.equal(a, b)
    # A bare state dict of a segmentation model is recognised from its Proto tensors.
    torch.save(model.state_dict(), tmp_path / "bare.pt")
    bare = load_model(tmp_path / "bare.pt")
    assert (bare.version, bare.num_classes, bare.task) == ("n-seg", 3, "segment")


def test_detection_weights_are_taken_over_by_a_segmentation_model():
    """As the reference's ``--cfg yolov5n-seg.yaml --weights yolov5n.pt``: every tensor of the same name and
    shape (backbone, neck, anchors), and here also the head's box, objectness and class outputs; the mask
    coefficients and Proto start fresh, so the boxes and scores are the detector's."""
    torch.manual_seed(0)
    detector = Yolov5("n", num_classes=3).eval()
    segmenter = Yolov5("n", num_classes=3, task="segment")
    before = segmenter.state_dict()["model.24.m.0.weight"].clone()
    fresh = segmenter.load_matching(detector.state_dict())
    assert fresh and all(".proto." in k for k in fresh)
    for key, value in detector.state_dict().items():
        if not key.startswith("model.24.m."):
            assert torch.equal(segmenter.state_dict()[key], value), key
    coefficients = segmenter.state_dict()["model.24.m.0.weight"].view(3, 40, -1)[:, 8:]
    assert torch.equal(coefficients, before.view(3, 40, -1)[:, 8:])
    imgs = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(segmenter.eval()(imgs)[0][..., :8], detector(imgs))
    # Another class count: only the tensors of the same shape.
    other = Yolov5("n", num_classes=2, task="segment")
    assert {k.split(".")[2] for k in other.load_matching(detector.state_dict())} == {"m", "proto"}


@pytest.mark.slow
def test_checkpoints_written_by_the_reference_load_exactly(reference, tmp_path):
    """A genuine reference SegmentationModel (with EMA) pickled in the official layout, read without running
    pickled code: the decoded output and the prototypes are the reference's."""
    from test_interop import MAKE_CHECKPOINTS, reference_env, run_python

    inputs = tmp_path / "inputs.npy"
    np.save(inputs, torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(0)).numpy())
    spec = "n-seg:2:float32:1"
    run_python([str(MAKE_CHECKPOINTS), "reference", str(tmp_path), str(inputs), spec], reference_env(tmp_path))
    stem = tmp_path / spec.replace(":", "-")
    model = load_model(stem.with_suffix(".pt"))
    assert (model.version, model.task, model.num_classes, model.names) == ("n-seg", "segment", 2,
                                                                          ["class0", "class1"])
    with torch.no_grad():
        decoded, proto = model(torch.from_numpy(np.load(inputs)))
    np.testing.assert_allclose(decoded.numpy(), np.load(stem.with_suffix(".npy")), rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(proto.numpy(), np.load(stem.with_suffix(".proto.npy")), rtol=1e-6, atol=1e-5)


class GetattrOfABuiltin:
    """Pickles as ``getattr(collections.OrderedDict, 'fromkeys')``: a real callable fetched by name."""

    def __reduce__(self):
        return getattr, (collections.OrderedDict, "fromkeys")


def test_getattr_in_a_pickle_reads_only_model_class_attributes(tmp_path):
    path = tmp_path / "getattr.pt"
    path.write_bytes(pickle.dumps({"model": GetattrOfABuiltin()}, protocol=2))
    with pytest.raises(UnsafeCheckpointError, match="refusing to load 'builtins.getattr' on <class 'collections"):
        read_torch_file(path)


def test_official_segmentation_weights_are_not_downloaded_unverified(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("YOLOTRAIN_WEIGHTS", str(tmp_path / "weights"))
    monkeypatch.setenv("YOLOTRAIN_WEIGHTS_URL", "http://127.0.0.1:9")  # never reached
    with pytest.raises(WeightsUnavailableError) as info:
        resolve_weights("yolov5s-seg.pt")
    assert str(info.value).startswith("yolov5s-seg.pt: no verified SHA-256 for it is known")
    assert "\n" not in str(info.value) and not (tmp_path / "weights").exists()


def test_read_model_yaml_keeps_the_segment_entry(tmp_path):
    path = tmp_path / "seg.yaml"
    path.write_text(SEGMENT_YAML)
    assert read_model_yaml(path).head[-1] == [[17, 20, 23], 1, "Segment", ["nc", "anchors", 32, 256]]
