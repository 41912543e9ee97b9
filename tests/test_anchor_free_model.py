"""The anchor-free family (YOLOv5u, YOLOv8, YOLO11) against ultralytics 8.4, the oracle: layers, parameters and
state dict names of every published architecture, outputs in train and eval mode with the oracle's weights,
fusion, the classifiers, and model YAMLs (custom ones, errors by line)."""

import copy
import json
import re
from pathlib import Path

import pytest
import torch
from conftest import offline_ultralytics

from yolotrain.detector import BoxDetector
from yolotrain.model import Yolov5
from yolotrain.model.anchor_free import (
    AnchorFreeSpec,
    AnchorFreeYolo,
    anchor_free_classifier,
    build_layers,
    builtin_spec,
    read_model_yaml,
)
from yolotrain.model.anchor_free.spec import LAYOUTS, PUBLISHED, SCALE_NAMES, matching_name
from yolotrain.nms import non_max_suppression

# The figures the reference publishes (its YAMLs' summaries) at 80 classes.
PUBLISHED_PARAMETERS = {"yolov5nu": 2_654_816, "yolov8n": 3_157_200, "yolov8n-seg": 3_409_968, "yolo11n": 2_624_080,
                        "yolov8s": 11_166_560, "yolov8n-p6": 4_984_352, "yolo11s": 9_458_752,
                        "yolo11n-seg": 2_876_848}
IMAGE_SIZES = ((64, 96), (64, 64))
# The layouts the reference has YAMLs of (YOLOv5u-obb is ours alone: tests/test_obb_model.py checks it).
REFERENCE_LAYOUTS = [layout for layout in LAYOUTS if layout != "yolov5u-obb"]


@pytest.fixture(scope="module")
def ultralytics(tmp_path_factory):
    """ultralytics' model builders, offline, its settings file in a temporary folder."""
    with offline_ultralytics(tmp_path_factory):
        from ultralytics.nn import tasks

        yield tasks


def reference_yaml(name: str) -> str:
    """The reference's YAML name for a published architecture (its P6 YOLOv5u YAMLs are ``yolov5n-p6``)."""
    return name.replace("6u", "-p6") if name.startswith("yolov5") and name.endswith("6u") else name


def reference_cfg(ultralytics, name: str) -> dict:
    """The reference's model YAML of a published architecture; for YOLOv5u-pose, which the reference does not
    publish, its YOLOv5u YAML with the Pose head of its -pose YAMLs (COCO's 17 keypoints)."""
    if name.startswith("yolov5") and name.endswith("u-pose"):
        cfg = ultralytics.yaml_model_load(name.removesuffix("-pose") + ".yaml")
        cfg["head"][-1] = [cfg["head"][-1][0], 1, "Pose", ["nc", "kpt_shape"]]
        return {**cfg, "kpt_shape": [17, 3]}
    return ultralytics.yaml_model_load(reference_yaml(name) + ".yaml")


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


@pytest.mark.parametrize("layout", REFERENCE_LAYOUTS)
def test_every_scale_has_the_oracles_layers_parameters_and_state_dict_names(ultralytics, layout):
    for scale in SCALE_NAMES:
        name = next(n for n, (lay, s) in PUBLISHED.items() if lay == layout and s == scale)
        cfg = reference_cfg(ultralytics, name)
        with torch.device("meta"):
            reference, _ = ultralytics.parse_model(copy.deepcopy(cfg), ch=3, verbose=False)
        ours = torch.nn.Sequential(*build_layers(builtin_spec(name), cfg["nc"], 3, build=False).modules)
        assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in reference.parameters()), name
        theirs = {k: v.shape for k, v in reference.state_dict().items()}
        assert {k: v.shape for k, v in ours.state_dict().items()} == theirs, name


@pytest.mark.parametrize(("name", "parameters"), PUBLISHED_PARAMETERS.items())
def test_parameter_counts_are_the_published_ones(name, parameters):
    built = build_layers(builtin_spec(name), 80, 3, build=False)
    assert sum(p.numel() for m in built.modules for p in m.parameters()) == parameters


def flat_maps(maps: list[torch.Tensor]) -> torch.Tensor:
    """Per-level maps ``[B, C, H, W]`` as the oracle's ``[B, C, N]`` (levels' cells one after another)."""
    return torch.cat([m.flatten(2) for m in maps], 2)


@pytest.mark.parametrize("name", ["yolov8n", "yolo11n", "yolov5nu", "yolov8n-seg"])
def test_outputs_equal_the_oracles_with_its_weights(ultralytics, name):
    builder = ultralytics.SegmentationModel if name.endswith("-seg") else ultralytics.DetectionModel
    torch.manual_seed(0)
    reference = randomised(builder(f"{name}.yaml", nc=80, verbose=False))
    ours = AnchorFreeYolo(name, num_classes=80)
    ours.load_state_dict(reference.state_dict())  # strict: the same names and shapes
    assert ours.arch_name == name and ours.max_stride == 32 and ours.stride.tolist() == [8, 16, 32]
    nc, nm, reg_max = 80, ours.num_masks, ours.head.reg_max
    for size in IMAGE_SIZES:
        imgs = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(size[1]))
        # Train mode: the raw maps are the oracle's distance, class (and mask coefficient) outputs. Both models
        # update their BatchNorm statistics from the same batch, so they stay equal for eval mode.
        maps = ours.train()(imgs)
        expected = reference.train()(imgs)
        if nm:
            maps, proto = maps
            torch.testing.assert_close(proto, expected["proto"], atol=1e-4, rtol=1e-4)
        assert [m.shape[1] for m in maps] == [4 * reg_max + nc + nm] * 3
        boxes, scores, coefficients = flat_maps(maps).split((4 * reg_max, nc, nm), 1)
        torch.testing.assert_close(boxes, expected["boxes"], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(scores, expected["scores"], atol=1e-4, rtol=1e-4)
        if nm:
            torch.testing.assert_close(coefficients, expected["mask_coefficient"], atol=1e-4, rtol=1e-4)
        # Eval mode: boxes, an objectness of 1, class scores (and raw coefficients) per cell.
        ours.eval()
        reference.eval()
        with torch.no_grad():
            decoded = ours(imgs)
            expected = reference(imgs)[0]
        if nm:
            (decoded, proto), (expected, expected_proto) = decoded, expected
            torch.testing.assert_close(proto, expected_proto, atol=1e-4, rtol=1e-4)
        cells = sum((size[0] // s) * (size[1] // s) for s in (8, 16, 32))
        assert decoded.shape == (2, cells, 5 + nc + nm)
        expected = expected.transpose(1, 2)
        torch.testing.assert_close(decoded[..., :4], expected[..., :4], atol=1e-4, rtol=1e-4)
        assert torch.equal(decoded[..., 4], torch.ones_like(decoded[..., 4]))
        torch.testing.assert_close(decoded[..., 5:], expected[..., 4:], atol=1e-4, rtol=1e-4)
    with torch.no_grad():  # the fused model (BatchNorm folded into the convolutions) at the last size
        fused = ours.fuse()(imgs)
    torch.testing.assert_close(fused[0] if nm else fused, decoded, atol=1e-4, rtol=1e-4)
    if nm:
        torch.testing.assert_close(fused[1], proto, atol=1e-4, rtol=1e-4)


def test_published_tables_are_the_oracles_yamls(ultralytics):
    """Each architecture table, read back from the reference's own YAML at each scale, is that published model."""
    folders = {"yolov5": "v5", "yolov8": "v8", "yolo11": "11"}
    for layout in REFERENCE_LAYOUTS:
        if layout == "yolov5u-pose":  # not one of the reference's YAMLs (see reference_cfg)
            continue
        family = layout[:6]
        path = (Path(ultralytics.__file__).parent.parent / "cfg" / "models" / folders[family]
                / f"{layout.replace('yolov5u', 'yolov5')}.yaml")
        for scale in SCALE_NAMES:
            name = next(n for n, (lay, s) in PUBLISHED.items() if lay == layout and s == scale)
            assert matching_name(read_model_yaml(path, scale)) == name


def test_nms_of_the_decoded_predictions_keeps_the_oracles_detections(ultralytics):
    """The objectness column of 1 leaves the YOLOv5 NMS's scores the class scores: the oracle's detections."""
    from ultralytics.utils.nms import non_max_suppression as reference_nms

    torch.manual_seed(0)
    reference = randomised(ultralytics.DetectionModel("yolov8n.yaml", nc=80, verbose=False)).eval()
    ours = AnchorFreeYolo("yolov8n").eval()
    ours.load_state_dict(reference.state_dict())
    imgs = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        decoded, expected = ours(imgs), reference(imgs)[0]
    conf = decoded[..., 5:].amax(2).median().item()  # about half of the cells are candidates
    kept = non_max_suppression(decoded, conf=conf, iou=0.5, max_det=300)
    expected_kept = reference_nms(expected, conf_thres=conf, iou_thres=0.5, max_det=300)
    for ours_image, reference_image in zip(kept, expected_kept):
        assert len(ours_image) > 0
        torch.testing.assert_close(ours_image, reference_image, atol=1e-4, rtol=1e-4)


def test_models_are_box_detectors():
    model = AnchorFreeYolo("yolo11n-seg", num_classes=2, names=["a", "b"])
    assert isinstance(model, BoxDetector)
    assert (model.task, model.num_masks, model.num_protos, model.size_multiple, model.default_img_size,
            model.end_to_end, model.precision) == ("segment", 32, 64, 32, 640, False, "fp32")
    assert AnchorFreeYolo("yolov8n-p6").default_img_size == 1280
    # A spec survives its mapping form (what a checkpoint stores) as the same published architecture.
    stored = json.loads(json.dumps(model.spec.to_dict()))
    assert matching_name(AnchorFreeSpec.from_mapping(stored)) == "yolo11n-seg"
    with pytest.raises(ValueError, match="not Detect, Segment, OBB or Pose: a classifier is built by anchor_free_"):
        AnchorFreeYolo("yolov8n-cls")


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
def test_decoding_is_differentiable_and_exports_to_onnx_for_any_size(tmp_path):
    model = AnchorFreeYolo("yolov8n-seg", num_classes=3)
    imgs = torch.rand(1, 3, 64, 96)
    maps, _ = model(imgs)
    decoded = model.head.decode(maps)
    decoded[..., :4].sum().backward()  # through the DFL expectation into the box branch
    assert model.head.cv2[0][-1].weight.grad.abs().sum() > 0
    onnxruntime = pytest.importorskip("onnxruntime")
    model.eval()
    path = tmp_path / "model.onnx"
    torch.onnx.export(model, (imgs,), str(path), dynamo=False, input_names=["images"], output_names=["out", "proto"],
                      dynamic_axes={"images": {0: "batch", 2: "height", 3: "width"}})
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for shape in ((1, 3, 64, 96), (2, 3, 96, 64)):  # the anchor points follow the input's size
        imgs = torch.rand(shape)
        exported, proto = session.run(None, {"images": imgs.numpy()})
        with torch.no_grad():
            expected, expected_proto = model(imgs)
        torch.testing.assert_close(torch.from_numpy(exported), expected, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(torch.from_numpy(proto), expected_proto, atol=1e-4, rtol=1e-4)


@pytest.mark.filterwarnings("ignore::DeprecationWarning:thop.*")
def test_classifiers_equal_the_oracles(ultralytics):
    imgs = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    for name in ("yolov8n-cls", "yolo11n-cls"):
        torch.manual_seed(0)
        reference = randomised(ultralytics.ClassificationModel(f"{name}.yaml", nc=10, verbose=False)).eval()
        ours = anchor_free_classifier(name, num_classes=10, names=[f"c{i}" for i in range(10)])
        ours.load_state_dict(reference.state_dict())
        ours.eval()
        assert ours.arch_name == name and ours.task == "classify"
        with torch.no_grad():
            logits = ours(imgs)
            torch.testing.assert_close(logits, reference(imgs)[1], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(copy.deepcopy(ours).fuse()(imgs), logits, atol=1e-4, rtol=1e-4)


def test_yolov5_weights_transfer_to_yolov5u_backbone_and_neck():
    yolov5 = Yolov5("n", num_classes=80)
    yolov5u = AnchorFreeYolo("yolov5nu", num_classes=80)
    left = yolov5u.load_matching(yolov5.state_dict())
    assert left and all(k.startswith("model.24.") for k in left)
    torch.testing.assert_close(yolov5u.model[23].cv3.conv.weight, yolov5.model[23].cv3.conv.weight)


CUSTOM_YAML = """\
nc: 5
scales:
  n: [0.33, 0.25, 1024]
  s: [0.33, 0.50, 1024]
backbone:
  - [-1, 1, Conv, [64, 3, 2]]  # 0 P1/2
  - [-1, 1, Conv, [128, 3, 2]]  # 1 P2/4
  - [-1, 2, C2f, [128, True]]
  - [-1, 1, Conv, [256, 3, 2]]  # 3 P3/8
  - [-1, 2, C3k2, [256, False, 0.25]]
  - [-1, 1, Conv, [512, 3, 2]]  # 5 P4/16
  - [-1, 1, SPPF, [512, 5]]
  - [-1, 2, C2PSA, [512]]
head:
  - [-1, 1, nn.Upsample, [None, 2, "nearest"]]
  - [[-1, 4], 1, Concat, [1]]
  - [-1, 3, C3, [256, False]]  # 10 (P3/8)
  - [-1, 1, Conv, [256, 3, 2]]
  - [[-1, 7], 1, Concat, [1]]
  - [-1, 3, C2, [512, False]]  # 13 (P4/16)
  - [[10, 13], 1, Segment, [nc, 16, 64]]
"""


def test_a_custom_yaml_builds_as_the_oracle_builds_it(ultralytics, tmp_path):
    path = tmp_path / "custom-yolov8s.yaml"  # the scale in the name, as the reference guesses it
    path.write_text(CUSTOM_YAML)
    torch.manual_seed(0)
    reference = randomised(ultralytics.SegmentationModel(str(path), verbose=False)).eval()
    ours = AnchorFreeYolo.from_yaml(path).eval()
    assert (ours.version, ours.task, ours.num_classes, ours.num_masks, ours.spec.scale) == \
        ("custom", "segment", 5, 16, "s")
    ours.load_state_dict(reference.state_dict())
    imgs = torch.rand(1, 3, 64, 96)
    with torch.no_grad():
        (decoded, proto), ((expected, expected_proto), _) = ours(imgs), reference(imgs)
    torch.testing.assert_close(proto, expected_proto, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(decoded[..., [0, 1, 2, 3, *range(5, decoded.shape[2])]], expected.transpose(1, 2),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("line", "replacement", "message"), [
    (8, "  - [-1, 2, C2fCIB, [128, True]]", "unknown block 'C2fCIB'"),
    (12, "  - [-1, 1, SPPF, [512, 5, 3]]", "SPPF takes at most 2 arguments"),
    (15, "  - [[-1, 9], 1, Concat, [1]]", "'from' 9 does not name an earlier layer"),
    (13, "  - [-1, 2, C2PSA, [1024]]", "C2PSA keeps its channels"),
    (17, "  - [-1, 400, C3, [256, False]]", "more than 100"),
    (21, "  - [[10, 13], 1, Segment, [nc, 16, 64, 3]]", "Segment takes [nc, masks, protos]"),
])
def test_a_bad_entry_is_one_line_naming_file_and_line(tmp_path, line, replacement, message):
    lines = CUSTOM_YAML.splitlines()
    lines[line - 1] = replacement
    path = tmp_path / "bad.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as error:
        AnchorFreeYolo.from_yaml(path)
    text = str(error.value)
    assert text.startswith(f"{path}:{line}: ") and message in text and "\n" not in text


def test_bad_keypoint_shapes_and_unknown_scales_are_refused_in_one_line(tmp_path):
    path = tmp_path / "pose.yaml"
    path.write_text("kpt_shape: [17, 4]\n" + CUSTOM_YAML)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:1: kpt_shape must be \[keypoints 1..1000, 2 or 3"):
        AnchorFreeYolo.from_yaml(path)
    path.write_text(CUSTOM_YAML.replace("Segment, [nc, 16, 64]", "Pose, [nc, kpt_shape]"))
    with pytest.raises(ValueError, match=r":21: a Pose head needs the YAML's kpt_shape"):
        AnchorFreeYolo.from_yaml(path)
    path.write_text(CUSTOM_YAML)
    with pytest.raises(ValueError, match=r":2: no scale 'x' \(the YAML has 'n', 's'\)"):
        AnchorFreeYolo.from_yaml(path, scale="x")
    with pytest.raises(ValueError, match="unknown anchor-free architecture 'yolov9t'"):
        AnchorFreeYolo("yolov9t")
