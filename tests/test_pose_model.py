"""The anchor-free keypoint (pose) models against ultralytics 8.4, the oracle: parameters and state dict names of
every scale and keypoint shape, train-mode maps and decoded eval outputs with the oracle's weights, model YAMLs with
a Pose head, and Ultralytics PoseModel checkpoints read through the restricted loader."""

import copy
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import offline_ultralytics

from yolotrain.checkpoint import CheckpointError
from yolotrain.families.anchor_free import FAMILY
from yolotrain.interop import UnsupportedCheckpointError, read_torch_file
from yolotrain.interop.loading.anchor_free import build_architecture, from_ultralytics, published_architecture
from yolotrain.interop.loading.pretrained import load_model
from yolotrain.interop.loading.ultralytics import read_ultralytics
from yolotrain.model.anchor_free import AnchorFreePose, AnchorFreeSpec, AnchorFreeYolo, build_layers, builtin_spec
from yolotrain.model.anchor_free.spec import PUBLISHED, SCALE_NAMES, matching_name

FAMILIES = ("yolov8", "yolo11", "yolov5u")
TOLERANCE = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def ultralytics(tmp_path_factory):
    """ultralytics' model builders, offline, its settings file in a temporary folder."""
    with offline_ultralytics(tmp_path_factory):
        from ultralytics.nn import tasks

        yield tasks


def pose_name(family: str, scale: str) -> str:
    return f"yolov5{scale}u-pose" if family == "yolov5u" else f"{family}{scale}-pose"


def reference_cfg(ultralytics, name: str, kpt_shape=(17, 3)) -> dict:
    """The reference's model YAML of a pose architecture; YOLOv5u-pose (not one of its YAMLs) is its YOLOv5u YAML
    with the Pose head of its -pose YAMLs."""
    if name.startswith("yolov5"):
        cfg = ultralytics.yaml_model_load(name.removesuffix("-pose") + ".yaml")
        cfg["head"][-1] = [cfg["head"][-1][0], 1, "Pose", ["nc", "kpt_shape"]]
    else:
        cfg = ultralytics.yaml_model_load(name + ".yaml")
    return {**cfg, "kpt_shape": list(kpt_shape)}


def randomised(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """``model`` with random BatchNorm statistics and affine parameters, so that every layer's numbers matter."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                n = module.num_features
                module.running_mean.copy_(torch.randn(n, generator=generator) * 0.1)
                module.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
                module.weight.copy_(torch.rand(n, generator=generator) + 0.5)
                module.bias.copy_(torch.randn(n, generator=generator) * 0.1)
    return model


def test_the_issues_parameter_count_and_published_ones():
    """yolov8n-pose for one class and COCO's 17 keypoints (the issue's figure), and the reference's YAML summaries
    of yolo11-pose at its nc of 80."""
    assert sum(p.numel() for p in AnchorFreeYolo("yolov8n-pose", num_classes=1).parameters()) == 3_295_470
    for name, parameters in {"yolo11n-pose": 2_908_507, "yolo11s-pose": 9_948_811, "yolo11m-pose": 20_973_273,
                             "yolo11l-pose": 26_230_745, "yolo11x-pose": 58_889_881}.items():
        built = build_layers(builtin_spec(name), 80, 3, build=False)
        assert sum(p.numel() for m in built.modules for p in m.parameters()) == parameters, name


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kpt_shape", [(17, 3), (5, 2)])
def test_every_scale_has_the_oracles_parameters_and_state_dict(ultralytics, family, kpt_shape):
    for scale in SCALE_NAMES:
        name = pose_name(family, scale)
        cfg = reference_cfg(ultralytics, name, kpt_shape)
        with torch.device("meta"):
            reference, _ = ultralytics.parse_model(copy.deepcopy(cfg), ch=3, verbose=False)
        spec = dataclasses.replace(builtin_spec(name), kpt_shape=kpt_shape)
        ours = torch.nn.Sequential(*build_layers(spec, cfg["nc"], 3, build=False).modules)
        assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in reference.parameters()), name
        expected = {k: v.shape for k, v in reference.state_dict().items()}
        assert {k: v.shape for k, v in ours.state_dict().items()} == expected, name


def flat_maps(maps: list[torch.Tensor]) -> torch.Tensor:
    """Per-level maps ``[B, C, H, W]`` as the oracle's ``[B, C, N]`` (levels' cells one after another)."""
    return torch.cat([m.flatten(2) for m in maps], 2)


@pytest.mark.parametrize(("name", "kpt_shape", "nc"), [("yolov8n-pose", (17, 3), 1), ("yolo11n-pose", (17, 3), 3),
                                                       ("yolov5nu-pose", (5, 2), 2), ("yolov8n-pose", (4, 3), 2)])
def test_outputs_equal_the_oracles_with_its_weights(ultralytics, name, kpt_shape, nc):
    torch.manual_seed(0)
    reference = randomised(ultralytics.PoseModel(reference_cfg(ultralytics, name, kpt_shape), nc=nc, verbose=False))
    ours = AnchorFreeYolo(name, num_classes=nc, kpt_shape=kpt_shape)
    ours.load_state_dict(reference.state_dict())  # strict: the same names and shapes
    assert (ours.arch_name, ours.task, ours.kpt_shape, ours.num_masks) == (name, "pose", kpt_shape, 0)
    assert isinstance(ours.head, AnchorFreePose)
    nk = kpt_shape[0] * kpt_shape[1]
    imgs = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(1))
    # Train mode: the raw maps are the oracle's distance, class and keypoint outputs. Both models update their
    # BatchNorm statistics from the same batch, so they stay equal for eval mode.
    maps = ours.train()(imgs)
    expected = reference.train()(imgs)
    assert [m.shape[1] for m in maps] == [64 + nc + nk] * 3
    boxes, scores, keypoints = flat_maps(maps).split((64, nc, nk), 1)
    torch.testing.assert_close(boxes, expected["boxes"], **TOLERANCE)
    torch.testing.assert_close(scores, expected["scores"], **TOLERANCE)
    torch.testing.assert_close(keypoints, expected["kpts"], **TOLERANCE)
    # Eval mode: boxes, an objectness of 1, class scores, then the keypoints in pixels (and visibility).
    ours.eval()
    reference.eval()
    with torch.no_grad():
        decoded = ours(imgs)
        expected = reference(imgs)[0].transpose(1, 2)
        fused = copy.deepcopy(ours).fuse()(imgs)
    cells = sum((64 // s) * (96 // s) for s in (8, 16, 32))
    assert decoded.shape == (2, cells, 5 + nc + nk)
    torch.testing.assert_close(decoded[..., :4], expected[..., :4], **TOLERANCE)
    assert torch.equal(decoded[..., 4], torch.ones_like(decoded[..., 4]))
    torch.testing.assert_close(decoded[..., 5:], expected[..., 4:], **TOLERANCE)
    torch.testing.assert_close(fused, decoded, **TOLERANCE)
    if kpt_shape[1] == 3:  # visibility is a probability
        visibility = decoded[..., 5 + nc + 2::3]
        assert visibility.min() >= 0 and visibility.max() <= 1


def test_keypoint_columns_decode_from_the_cells():
    """Zero keypoint offsets decode to each cell's top-left corner: x = column * stride, y = row * stride."""
    model = AnchorFreeYolo("yolov8n-pose", num_classes=1, kpt_shape=(2, 3)).eval()
    maps = [torch.zeros(1, 64 + 1 + 6, 64 // s, 96 // s) for s in (8, 16, 32)]
    decoded = model.head.decode(maps)
    rows, columns = torch.meshgrid(torch.arange(8.0), torch.arange(12.0), indexing="ij")
    first_level = decoded[0, :96]
    torch.testing.assert_close(first_level[:, 6], columns.flatten() * 8)
    torch.testing.assert_close(first_level[:, 7], rows.flatten() * 8)
    torch.testing.assert_close(first_level[:, 8], torch.full((96,), 0.5))
    torch.testing.assert_close(first_level[:, 9:11], first_level[:, 6:8])


POSE_YAML = """\
nc: 2
kpt_shape: [4, 2]
scales:
  n: [0.33, 0.25, 1024]
backbone:
  - [-1, 1, Conv, [64, 3, 2]]  # 0 P1/2
  - [-1, 1, Conv, [128, 3, 2]]  # 1 P2/4
  - [-1, 2, C2f, [128, True]]
  - [-1, 1, Conv, [256, 3, 2]]  # 3 P3/8
  - [-1, 2, C3k2, [256, False, 0.25]]
  - [-1, 1, Conv, [512, 3, 2]]  # 5 P4/16
  - [-1, 1, SPPF, [512, 5]]
head:
  - [-1, 1, nn.Upsample, [None, 2, "nearest"]]
  - [[-1, 4], 1, Concat, [1]]
  - [-1, 2, C2f, [256]]  # 9 (P3/8)
  - [-1, 1, Conv, [256, 3, 2]]
  - [[-1, 6], 1, Concat, [1]]
  - [-1, 2, C2f, [512]]  # 12 (P4/16)
  - [[9, 12], 1, Pose, [nc, kpt_shape]]
"""


def test_a_custom_pose_yaml_builds_as_the_oracle_builds_it(ultralytics, tmp_path):
    path = tmp_path / "custom-pose.yaml"
    path.write_text(POSE_YAML)
    torch.manual_seed(0)
    reference = randomised(ultralytics.PoseModel(str(path), verbose=False)).eval()
    ours = AnchorFreeYolo.from_yaml(path).eval()
    assert (ours.version, ours.task, ours.num_classes, ours.kpt_shape) == ("custom", "pose", 2, (4, 2))
    ours.load_state_dict(reference.state_dict())
    imgs = torch.rand(1, 3, 64, 96)
    with torch.no_grad():
        decoded, expected = ours(imgs), reference(imgs)[0]
    torch.testing.assert_close(decoded[..., [0, 1, 2, 3, *range(5, decoded.shape[2])]], expected.transpose(1, 2),
                               **TOLERANCE)
    # The spec's mapping form (what a checkpoint stores) keeps the keypoint shape.
    assert AnchorFreeSpec.from_mapping(ours.spec.to_dict()).kpt_shape == (4, 2)
    bad = tmp_path / "bad.yaml"
    bad.write_text(POSE_YAML.replace("Pose, [nc, kpt_shape]", "Pose, [nc, [17, 3]]"))
    with pytest.raises(ValueError, match=r"bad.yaml:20: Pose's keypoint shape \[17, 3\] differs from the YAML's "
                                         r"kpt_shape=\[4, 2\]"):
        AnchorFreeYolo.from_yaml(bad)


def test_published_names_and_other_keypoint_shapes():
    for family in FAMILIES:
        for scale in SCALE_NAMES:
            assert pose_name(family, scale) in PUBLISHED
    assert "yolov8n-pose-p6" in PUBLISHED
    model = published_architecture("yolov8s-pose", None, None)
    assert (model.num_classes, model.kpt_shape, model.names) == (1, (17, 3), ["0"])
    other = build_architecture(builtin_spec("yolo11n-pose"), 3, None, kpt_shape=(5, 2))
    assert other.kpt_shape == (5, 2) and other.head.cv4[0][-1].out_channels == 10
    # The keypoint shape, like the class count, is the data's: the architecture is still the published one.
    assert other.version == "yolo11n-pose" and matching_name(other.spec) == "yolo11n-pose"
    with pytest.raises(ValueError, match="kpt_shape is for a Pose head"):
        AnchorFreeYolo("yolov8n", kpt_shape=(17, 3))
    with pytest.raises(ValueError, match=r"kpt_shape must be \[keypoints 1..1000, 2 or 3 values each\]"):
        AnchorFreeYolo("yolov8n-pose", kpt_shape=(17, 4))


def test_our_checkpoint_fields_rebuild_a_pose_model_with_its_keypoints():
    model = AnchorFreeYolo("yolov8n-pose", num_classes=2, kpt_shape=(5, 3))
    metadata = {**FAMILY.checkpoint_architecture(model), "names": ["a", "b"]}
    assert metadata["kpt_shape"] == [5, 3] and metadata["version"] == "yolov8n-pose" and "cfg" not in metadata

    def bad(field, message):
        return CheckpointError(f"{field} {message}")

    FAMILY.validate_checkpoint(metadata, bad)
    rebuilt = FAMILY.rebuild_checkpoint(metadata, model.state_dict(), "x.json")
    assert rebuilt.kpt_shape == (5, 3) and rebuilt.names == ["a", "b"]
    with pytest.raises(CheckpointError, match="kpt_shape must be"):
        FAMILY.validate_checkpoint({**metadata, "kpt_shape": [5, 7]}, bad)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> SimpleNamespace:
    """Ultralytics pose models (3 classes; yolov8n-pose with 5 keypoints of x, y, yolo11n-pose with COCO's) and the
    ``last.pt`` its trainer writes of each (the half-precision EMA model under ``ema``)."""
    folder = tmp_path_factory.mktemp("pose-checkpoints")
    with offline_ultralytics(tmp_path_factory):
        from ultralytics.nn import tasks
        from ultralytics.utils import DEFAULT_CFG_DICT, IterableSimpleNamespace

        made = {}
        for yaml_name, kpt_shape in (("yolov8n-pose.yaml", (5, 2)), ("yolo11n-pose.yaml", (17, 3))):
            torch.manual_seed(0)
            model = randomised(tasks.PoseModel(yaml_name, nc=3, data_kpt_shape=kpt_shape, verbose=False))
            model.names = {0: "cat", 1: "dog", 2: "horse"}
            model.args = IterableSimpleNamespace(**{**DEFAULT_CFG_DICT, "model": yaml_name})
            path = folder / yaml_name.replace(".yaml", ".pt")
            torch.save({"epoch": 0, "best_fitness": np.float64(0.5), "model": None,
                        "ema": copy.deepcopy(model).half(), "updates": 1, "train_args": vars(model.args),
                        "date": "2026-01-01T00:00:00+00:00", "version": "8.4.0"}, path)
            made[yaml_name] = (model.eval(), path, kpt_shape)
    return SimpleNamespace(made=made)


@pytest.mark.parametrize("yaml_name", ["yolov8n-pose.yaml", "yolo11n-pose.yaml"])
def test_ultralytics_pose_checkpoints_load_with_their_keypoints(checkpoints, yaml_name):
    reference, path, kpt_shape = checkpoints.made[yaml_name]
    weights = read_ultralytics(read_torch_file(path), str(path))
    assert (weights.task, weights.kpt_shape, weights.nc) == ("pose", kpt_shape, 3)
    assert weights.architecture == yaml_name.removesuffix(".yaml")
    model = load_model(path)
    assert isinstance(model, AnchorFreeYolo) and not model.training
    assert (model.task, model.kpt_shape, model.names, model.version) == \
        ("pose", kpt_shape, ["cat", "dog", "horse"], yaml_name.removesuffix(".yaml"))
    imgs = torch.rand(1, 3, 64, 96, generator=torch.Generator().manual_seed(2))
    half = copy.deepcopy(reference).half().float()  # the checkpoint's weights are the half-precision EMA's
    with torch.no_grad():
        torch.testing.assert_close(model(imgs)[..., [0, 1, 2, 3, *range(5, 5 + 3 + kpt_shape[0] * kpt_shape[1])]],
                                   half(imgs)[0].transpose(1, 2), **TOLERANCE)


def test_a_pose_checkpoint_whose_keypoints_do_not_fit_its_head_is_refused(checkpoints):
    _, path, _ = checkpoints.made["yolov8n-pose.yaml"]
    contents = read_torch_file(path)
    contents["ema"].get("yaml")["kpt_shape"] = [5, 3]
    with pytest.raises(CheckpointError, match=r"the model yaml says kpt_shape=\[5, 3\], its head \[5, 2\]"):
        read_ultralytics(contents, "edited")
    contents = read_torch_file(path)
    head = contents["ema"].get("_modules")["model"].get("_modules")["22"]
    head.state["kpt_shape"] = (6, 2)
    contents["ema"].get("yaml")["kpt_shape"] = (6, 2)
    with pytest.raises(CheckpointError, match=r"the head's cv4\.0 ends in 10 channels, 12 expected"):
        read_ultralytics(contents, "edited")
    weights = read_ultralytics(read_torch_file(path), "ok")
    edited = SimpleNamespace(**{**vars(weights), "yaml": {**weights.yaml, "kpt_shape": [5, 9]}})
    with pytest.raises(UnsupportedCheckpointError, match="kpt_shape must be"):
        from_ultralytics(edited, "edited")


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("kpt_shape", [(17, 3), (5, 2)])
def test_the_decoded_keypoints_export_to_onnx_for_any_size(tmp_path, kpt_shape):
    onnxruntime = pytest.importorskip("onnxruntime")
    model = AnchorFreeYolo("yolov8n-pose", num_classes=2, kpt_shape=kpt_shape).eval()
    path = tmp_path / "pose.onnx"
    torch.onnx.export(model, (torch.rand(1, 3, 64, 96),), str(path), dynamo=False, input_names=["images"],
                      output_names=["out"], dynamic_axes={"images": {0: "batch", 2: "height", 3: "width"}})
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    imgs = torch.rand(2, 3, 96, 64)  # the anchor points follow the input's size
    (exported,) = session.run(None, {"images": imgs.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(exported), model(imgs), **TOLERANCE)
