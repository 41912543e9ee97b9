"""The anchor-free oriented-box models (YOLOv8-obb, YOLO11-obb and YOLOv5u-obb) against ultralytics 8.4, the oracle:
parameters and state dict names of every scale, outputs in train and eval mode with the oracle's weights, its
checkpoints read through the restricted loader, and the OBB entry of model YAMLs."""

import copy
from pathlib import Path

import pytest
import torch
from conftest import offline_ultralytics
from test_anchor_free_model import randomised

from yolotrain.checkpoint import CheckpointError
from yolotrain.interop import load_model, read_torch_file
from yolotrain.interop.loading.ultralytics import read_ultralytics
from yolotrain.model.anchor_free import AnchorFreeOBB, AnchorFreeYolo, angle_from_logits, build_layers, builtin_spec
from yolotrain.model.anchor_free.spec import PUBLISHED, SCALE_NAMES, matching_name, read_model_yaml

OBB_LAYOUTS = ("yolov8-obb", "yolo11-obb", "yolov5u-obb")
IMAGE_SIZES = ((64, 96), (64, 64))
DOTA_CLASSES = 15


@pytest.fixture(scope="module")
def ultralytics(tmp_path_factory):
    """ultralytics' model builders, offline, its settings file in a temporary folder."""
    with offline_ultralytics(tmp_path_factory):
        from ultralytics.nn import tasks

        yield tasks


def reference_cfg(ultralytics, name: str) -> dict:
    """The oracle's model YAML of a published OBB name; YOLOv5u-obb, which it does not publish, is its yolov5 YAML
    with the OBB head of its -obb YAMLs on the same levels."""
    if not name.startswith("yolov5"):
        return ultralytics.yaml_model_load(f"{name}.yaml")
    cfg = copy.deepcopy(ultralytics.yaml_model_load(name.removesuffix("-obb") + ".yaml"))
    cfg["head"][-1] = [cfg["head"][-1][0], 1, "OBB", ["nc", 1]]
    return cfg


def reference_model(ultralytics, name: str, nc: int) -> torch.nn.Module:
    return ultralytics.OBBModel(reference_cfg(ultralytics, name), nc=nc, verbose=False)


def flat_maps(maps: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([m.flatten(2) for m in maps], 2)


@pytest.mark.parametrize("layout", OBB_LAYOUTS)
def test_every_scale_has_the_oracles_parameters_and_state_dict_names(ultralytics, layout):
    for scale in SCALE_NAMES:
        name = next(n for n, (lay, s) in PUBLISHED.items() if lay == layout and s == scale)
        cfg = reference_cfg(ultralytics, name)
        cfg["scale"] = scale
        for nc in (DOTA_CLASSES, 80):
            cfg["nc"] = nc
            with torch.device("meta"):
                reference, _ = ultralytics.parse_model(copy.deepcopy(cfg), ch=3, verbose=False)
            ours = torch.nn.Sequential(*build_layers(builtin_spec(name), nc, 3, build=False).modules)
            assert isinstance(ours[-1], AnchorFreeOBB) and ours[-1].task == "obb"
            assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in reference.parameters()), name
            theirs = {k: v.shape for k, v in reference.state_dict().items()}
            assert {k: v.shape for k, v in ours.state_dict().items()} == theirs, name


def test_yolov8n_obb_for_dota_has_the_published_parameter_count(ultralytics):
    model = AnchorFreeYolo("yolov8n-obb", num_classes=DOTA_CLASSES)
    assert sum(p.numel() for p in model.parameters()) == 3_085_440
    assert sum(p.numel() for p in reference_model(ultralytics, "yolov8n-obb", DOTA_CLASSES).parameters()) == 3_085_440
    assert (model.task, model.arch_name, model.num_masks) == ("obb", "yolov8n-obb", 0)


def assert_outputs_equal(ours: AnchorFreeYolo, reference: torch.nn.Module, nc: int) -> None:
    """Train-mode maps and eval-mode decoded predictions of ``ours`` equal the oracle's at each image size."""
    reg_max = ours.head.reg_max
    for size in IMAGE_SIZES:
        imgs = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(size[1]))
        # Train mode: distance, class and angle logits; the oracle hands its loss the angle already in radians.
        maps = ours.train()(imgs)
        expected = reference.train()(imgs)
        assert [m.shape[1] for m in maps] == [4 * reg_max + nc + 1] * 3
        boxes, scores, angle_logits = flat_maps(maps).split((4 * reg_max, nc, 1), 1)
        torch.testing.assert_close(boxes, expected["boxes"], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(scores, expected["scores"], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(angle_from_logits(angle_logits), expected["angle"], atol=1e-4, rtol=1e-4)
        # Eval mode: the oracle's [B, 4 + nc + 1, N] (cx, cy, w, h, scores, angle) is ours with an objectness of 1.
        ours.eval()
        reference.eval()
        with torch.no_grad():
            decoded = ours(imgs)
            expected = reference(imgs)[0].transpose(1, 2)
        cells = sum((size[0] // s) * (size[1] // s) for s in (8, 16, 32))
        assert decoded.shape == (2, cells, 5 + nc + 1)
        torch.testing.assert_close(decoded[..., :4], expected[..., :4], atol=1e-4, rtol=1e-4)
        assert torch.equal(decoded[..., 4], torch.ones_like(decoded[..., 4]))
        torch.testing.assert_close(decoded[..., 5:], expected[..., 4:], atol=1e-4, rtol=1e-4)
        angles = decoded[..., -1]
        assert angles.min() >= -torch.pi / 4 and angles.max() < 3 * torch.pi / 4


@pytest.mark.parametrize("name", ["yolov8n-obb", "yolo11n-obb", "yolov5nu-obb"])
def test_outputs_equal_the_oracles_with_its_weights(ultralytics, name):
    torch.manual_seed(0)
    reference = randomised(reference_model(ultralytics, name, DOTA_CLASSES))
    ours = AnchorFreeYolo(name, num_classes=DOTA_CLASSES)
    ours.load_state_dict(reference.state_dict())  # strict: the same names and shapes
    assert ours.arch_name == name and ours.stride.tolist() == [8, 16, 32]
    assert_outputs_equal(ours, reference, DOTA_CLASSES)
    imgs = torch.rand(1, 3, 64, 96)
    with torch.no_grad():
        decoded = ours.eval()(imgs)
        fused = copy.deepcopy(ours).fuse()(imgs)  # BatchNorm folded into the convolutions
    torch.testing.assert_close(fused, decoded, atol=1e-4, rtol=1e-4)


def test_decoding_is_differentiable_and_rotates_the_distances():
    model = AnchorFreeYolo("yolov8n-obb", num_classes=2).train()
    maps = [m.detach().requires_grad_() for m in model(torch.rand(1, 3, 64, 64))]
    decoded = model.head.decode(maps)
    decoded.sum().backward()
    assert all(m.grad is not None and torch.isfinite(m.grad).all() for m in maps)
    # A quarter turn of a box whose right distance exceeds its left moves its centre down, not right.
    head = model.head
    level = torch.full((1, 4 * head.reg_max + head.nc + 1, 1, 1), -30.0)
    level[0, [0, head.reg_max, 2 * head.reg_max + 3, 3 * head.reg_max]] = 30.0  # right: 3 bins, the others 0
    level[0, -1] = torch.tensor(3.0).log()  # sigmoid 3/4: an angle of π/2
    coarse = [torch.full((1, level.shape[1], 1, 1), -30.0)] * 2
    row = head.decode([level, *coarse])[0, 0]
    torch.testing.assert_close(row[:2], torch.tensor([0.5, 0.5 + 1.5]) * 8, atol=1e-3, rtol=0)
    torch.testing.assert_close(row[2:4], torch.tensor([24.0, 0.0]), atol=1e-3, rtol=0)
    torch.testing.assert_close(row[-1], torch.tensor(torch.pi / 2), atol=1e-5, rtol=0)


def test_an_ultralytics_obb_checkpoint_loads_through_the_restricted_loader(ultralytics, tmp_path):
    """A trainer's ``last.pt`` of an OBBModel (the half-precision EMA model pickled) loads as our OBB model."""
    from ultralytics.utils import DEFAULT_CFG_DICT, IterableSimpleNamespace

    torch.manual_seed(0)
    reference = randomised(ultralytics.OBBModel("yolov8n-obb.yaml", nc=3, verbose=False))
    reference.names = {0: "plane", 1: "ship", 2: "storage-tank"}
    reference.args = IterableSimpleNamespace(**{**DEFAULT_CFG_DICT, "model": "yolov8n-obb.yaml", "task": "obb"})
    path = tmp_path / "last.pt"
    torch.save({"epoch": 0, "model": None, "ema": copy.deepcopy(reference).half(), "updates": 1,
                "train_args": vars(reference.args), "version": "8.4.0"}, path)
    model = load_model(path)
    assert isinstance(model, AnchorFreeYolo) and isinstance(model.head, AnchorFreeOBB)
    assert (model.task, model.arch_name, model.names) == ("obb", "yolov8n-obb", ["plane", "ship", "storage-tank"])
    reference = reference.half().float().eval()  # the weights as the file holds them
    imgs = torch.rand(1, 3, 64, 96)
    with torch.no_grad():
        decoded, expected = model(imgs), reference(imgs)[0].transpose(1, 2)
    torch.testing.assert_close(decoded[..., :4], expected[..., :4], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(decoded[..., 5:], expected[..., 4:], atol=1e-4, rtol=1e-4)
    contents = read_torch_file(path)
    contents["ema"].get("_modules")["model"].get("_modules")["22"].state["ne"] = 2
    with pytest.raises(CheckpointError, match=r"^edited: the OBB head predicts 2 angles .* one angle per box"):
        read_ultralytics(contents, "edited")


def test_the_oracles_obb_yamls_are_the_published_models(ultralytics, tmp_path):
    config = Path(ultralytics.__file__).parent.parent / "cfg" / "models"
    for path in (config / "v8" / "yolov8-obb.yaml", config / "11" / "yolo11-obb.yaml"):
        for scale in SCALE_NAMES:
            assert matching_name(read_model_yaml(path, scale)) == f"{path.stem[:-4]}{scale}-obb"
    yaml = (config / "v8" / "yolov8-obb.yaml").read_text()
    custom = tmp_path / "yolov8s-obb-two.yaml"
    custom.write_text(yaml.replace("OBB, [nc, 1]]", "OBB, [nc, 2]]"))
    with pytest.raises(ValueError, match=r"yolov8s-obb-two\.yaml:\d+: OBB predicts 1 angle per box, got 2"):
        AnchorFreeYolo.from_yaml(custom)
    custom.write_text(yaml)
    model = AnchorFreeYolo.from_yaml(custom, num_classes=4)
    assert (model.version, model.task, model.spec.scale, model.head.no) == ("yolov8s-obb", "obb", "s", 64 + 4 + 1)
