"""The anchor-free oriented-box loss and its rotated task-aligned assigner against ultralytics 8.4's ``v8OBBLoss``
and ``RotatedTaskAlignedAssigner`` (the oracle): the total, each part and the gradients with respect to the head
maps, on the same tensors."""

import math
import zlib
from types import SimpleNamespace

import pytest
import torch
from conftest import offline_ultralytics
from test_anchor_free_loss import assert_same_loss, random_maps

from yolotrain.loss import AnchorFreeLossConfig, AnchorFreeOBBLoss, AnchorFreeOBBLossConfig, DivergenceError
from yolotrain.loss.anchor_free_obb import rotated_boxes, rotated_distances
from yolotrain.loss.assign import RotatedTaskAlignedAssigner
from yolotrain.settings import ConfigError

NC = 3
REG_MAX = 16
CHANNELS = 4 * REG_MAX + NC + 1


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """ultralytics' OBB model (seeded, 3 classes) with its criterion, offline, its settings in a temporary folder."""
    with offline_ultralytics(tmp_path_factory):
        from ultralytics.nn.tasks import OBBModel
        from ultralytics.utils.loss import v8OBBLoss
        from ultralytics.utils.tal import RotatedTaskAlignedAssigner as TheirAssigner
        from ultralytics.utils.tal import make_anchors

        torch.manual_seed(0)
        model = OBBModel("yolov8n-obb.yaml", nc=NC, verbose=False)
        model.args = SimpleNamespace(box=7.5, cls=0.5, dfl=1.5, angle=1.0)  # its defaults, which its loss reads
        yield SimpleNamespace(model=model, loss=v8OBBLoss(model), assigner=TheirAssigner, make_anchors=make_anchors)


def adapter(model) -> SimpleNamespace:
    """What our criteria read of a model: its head (nc, reg_max, stride, nm, ne)."""
    return SimpleNamespace(head=model.model[-1])


def random_obb_targets(generator: torch.Generator, counts: list[int], *, centre=(0.05, 0.95), side=(0.05, 0.6)
                       ) -> torch.Tensor:
    """``[N, 7]`` targets, image by image (ultralytics' layout), ``counts[i]`` in image ``i``, angles in
    [-pi/4, 3pi/4)."""
    n = sum(counts)
    image = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts)).float()
    cls = torch.randint(0, NC, (n,), generator=generator).float()
    xy = torch.rand(n, 2, generator=generator) * (centre[1] - centre[0]) + centre[0]
    wh = torch.rand(n, 2, generator=generator) * (side[1] - side[0]) + side[0]
    angle = torch.rand(n, 1, generator=generator) * math.pi - math.pi / 4
    return torch.cat((image[:, None], cls[:, None], xy, wh, angle), 1)


def their_batch(targets: torch.Tensor) -> dict:
    return {"batch_idx": targets[:, 0].clone(), "cls": targets[:, 1:2].clone(), "bboxes": targets[:, 2:7].clone()}


def their_preds(maps: list[torch.Tensor]) -> dict:
    """ultralytics' training outputs made of our per-level maps: its head hands the loss the angle in radians."""
    flat = torch.cat([m.flatten(2) for m in maps], 2)
    boxes, scores, angle_logits = flat.split((4 * REG_MAX, NC, 1), 1)
    return {"boxes": boxes, "scores": scores, "angle": (angle_logits.sigmoid() - 0.25) * math.pi, "feats": maps}


CASES = {
    "random": dict(counts=[3, 5]),
    "image without labels": dict(counts=[4, 0, 2]),
    "batch without labels": dict(counts=[0, 0]),
    "tiny boxes, some under 2 pixels": dict(counts=[6, 4], side=(0.01, 0.05)),
    "boxes at the border": dict(counts=[5, 5], centre=(0.0, 0.02), side=(0.02, 0.3)),
    "many per image (topk)": dict(counts=[40, 25], side=(0.1, 0.5)),
}


@pytest.mark.parametrize("case", CASES)
def test_loss_and_gradients_equal_ultralytics(oracle, case):
    options = dict(CASES[case])
    generator = torch.Generator().manual_seed(zlib.crc32(case.encode()))
    counts = options.pop("counts")
    targets = random_obb_targets(generator, counts, **options)
    if case == "boxes at the border":  # the other half at the right and bottom borders
        targets[1::2, 2:4] = 1 - targets[1::2, 2:4]
    maps = random_maps(generator, len(counts), (64, 96), CHANNELS)
    if case.startswith("tiny"):  # sides under 2 pixels (of 96 x 64) in both directions are dropped
        sides = targets[:, 4:6] * torch.tensor([96.0, 64.0])
        assert (sides < 2).any(1).sum() >= 2 and (sides >= 2).all(1).sum() >= 2

    criterion = AnchorFreeOBBLoss(adapter(oracle.model), rect_training=True)
    ours = criterion(maps, targets, pred_size=(64, 96))
    theirs, their_parts = oracle.loss(their_preds(maps), their_batch(targets))
    assert list(their_parts) == ["box_loss", "cls_loss", "dfl_loss", "angle_loss"]
    assert criterion.component_names == ("box", "cls", "dfl", "angle")
    assert_same_loss(ours, criterion.components, theirs, their_parts, maps)
    kept = (targets[:, 4:6] * torch.tensor([96.0, 64.0]) >= 2).all(1)
    assert (criterion.components[[0, 2, 3]] > 0).all() == bool(kept.any())


def test_maps_of_ultralytics_own_forward_give_its_loss(oracle):
    """The layout of the maps (box bins, class logits, angle logit per level) is the head's own: maps cut from the
    training outputs of ultralytics' model give its loss on those outputs."""
    model = oracle.model.train()
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        preds = model(images)
        logits = torch.cat([branch(feature).flatten(2) for branch, feature in zip(model.model[-1].cv4, preds["feats"])],
                           2)
    sizes = [feature.shape[2:] for feature in preds["feats"]]
    counts = [h * w for h, w in sizes]
    flat = torch.cat((preds["boxes"], preds["scores"], logits), 1)
    maps = [level.unflatten(2, size).detach().requires_grad_() for level, size in zip(flat.split(counts, 2), sizes)]
    targets = random_obb_targets(torch.Generator().manual_seed(9), [3, 2])
    ours = AnchorFreeOBBLoss(adapter(model))(maps, targets)
    torch.testing.assert_close(ours, oracle.loss(preds, their_batch(targets))[0].sum(), rtol=1e-5, atol=1e-6)


def test_rows_in_any_image_order_give_the_same_loss(oracle):
    generator = torch.Generator().manual_seed(5)
    maps = random_maps(generator, 3, (64, 64), CHANNELS)
    targets = random_obb_targets(generator, [4, 2, 3])
    criterion = AnchorFreeOBBLoss(adapter(oracle.model))
    expected = criterion(maps, targets)
    order = torch.tensor([6, 0, 4, 8, 1, 5, 2, 7, 3])  # images interleaved, each image's rows in their order
    torch.testing.assert_close(criterion(maps, targets[order]), expected, rtol=0, atol=0)


def test_rotated_boxes_and_distances_are_inverse():
    generator = torch.Generator().manual_seed(1)
    points = torch.rand(50, 2, generator=generator) * 10
    distances = torch.rand(50, 4, generator=generator) * 5
    angle = torch.rand(50, 1, generator=generator) * math.pi - math.pi / 4
    boxes = rotated_boxes(distances, angle, points)
    torch.testing.assert_close(rotated_distances(boxes, points), distances, rtol=1e-5, atol=1e-5)


def test_rotated_assigner_equals_ultralytics(oracle):
    generator = torch.Generator().manual_seed(11)
    maps = [torch.zeros(2, 1, 96 // s, 64 // s) for s in (8, 16, 32)]
    points, strides = oracle.make_anchors(maps, torch.tensor([8.0, 16.0, 32.0]), 0.5)
    points = points * strides
    batch, most = 2, 12

    def xywhr(count: int, side: float, low: float) -> torch.Tensor:
        centres = torch.rand(batch, count, 2, generator=generator) * torch.tensor([64.0, 96.0])
        sides = torch.rand(batch, count, 2, generator=generator) * side + low
        angles = torch.rand(batch, count, 1, generator=generator) * math.pi - math.pi / 4
        return torch.cat((centres, sides, angles), -1)

    scores = torch.rand(batch, points.shape[0], NC, generator=generator)
    boxes = xywhr(points.shape[0], 40, 2)
    gt_valid = torch.arange(most)[None] < torch.tensor([[most], [7]])
    gt_boxes = xywhr(most, 40, 1) * gt_valid[..., None]
    gt_labels = torch.randint(0, NC, (batch, most), generator=generator) * gt_valid

    ours = RotatedTaskAlignedAssigner(NC, topk=10, alpha=0.5, beta=6.0, min_side=16)(
        scores, boxes, points, gt_labels, gt_boxes, gt_valid)
    theirs = oracle.assigner(topk=10, num_classes=NC, alpha=0.5, beta=6.0, stride=[8, 16, 32])(
        scores, boxes, points, gt_labels[..., None].float(), gt_boxes, gt_valid[..., None].float())
    labels, their_boxes, their_scores, foreground, target_index = theirs
    assert ours.foreground.sum() > 20
    assert torch.equal(ours.foreground, foreground)
    assert torch.equal(ours.target_index, target_index)
    assert torch.equal(ours.labels, labels)
    assert torch.equal(ours.boxes, their_boxes)
    torch.testing.assert_close(ours.scores, their_scores.float(), rtol=1e-6, atol=1e-7)


def test_loss_never_writes_into_its_inputs(oracle):
    generator = torch.Generator().manual_seed(3)
    maps = random_maps(generator, 2, (64, 64), CHANNELS)
    targets = random_obb_targets(generator, [3, 2])
    targets[0, 4] = 0.01  # a tiny target, dropped
    inputs = [*maps, targets]
    versions, copies = [t._version for t in inputs], [t.detach().clone() for t in inputs]
    AnchorFreeOBBLoss(adapter(oracle.model))(maps, targets).backward()
    assert [t._version for t in inputs] == versions
    for tensor, copy in zip(inputs, copies):
        assert torch.equal(tensor.detach(), copy)


def test_bad_outputs_targets_and_heads_are_refused(oracle):
    criterion = AnchorFreeOBBLoss(adapter(oracle.model))
    maps = random_maps(torch.Generator().manual_seed(0), 2, (64, 64), CHANNELS)
    with pytest.raises(ValueError, match=r"does not match \[B, 68, H, W\] \(4 x 16 box bins, 3 classes, 1 angle\)"):
        criterion([m[:, :-1] for m in maps], torch.zeros(0, 7))
    with pytest.raises(ValueError, match=r"oriented-box targets must be \[N, 7\]"):
        criterion(maps, torch.zeros(2, 6))
    targets = random_obb_targets(torch.Generator().manual_seed(1), [1, 1])
    targets[1, 1] = NC
    with pytest.raises(ValueError, match="classes must lie in 0..2"):
        criterion(maps, targets)
    detect_head = SimpleNamespace(head=SimpleNamespace(nc=1, reg_max=16, stride=torch.tensor([8.0, 16.0]), nm=0))
    with pytest.raises(ValueError, match="needs an OBB head"):
        AnchorFreeOBBLoss(detect_head)


def test_non_finite_maps_raise_divergence_error_in_training_only(oracle):
    generator = torch.Generator().manual_seed(4)
    maps = random_maps(generator, 2, (64, 64), CHANNELS)
    class_logit = (torch.tensor([0]), torch.tensor([4 * REG_MAX]), torch.tensor([0]), torch.tensor([0]))
    broken = [maps[0].detach().index_put(class_logit, torch.tensor(float("nan"))), *maps[1:]]
    criterion = AnchorFreeOBBLoss(adapter(oracle.model))
    with pytest.raises(DivergenceError, match="non-finite loss at step 1"):
        criterion(broken, random_obb_targets(generator, [2, 2]))
    with torch.no_grad():  # validation reports whatever the loss is
        assert not torch.isfinite(criterion(broken, random_obb_targets(generator, [2, 2])))


def test_config_adds_the_angle_gain():
    config = AnchorFreeOBBLossConfig()
    assert (config.box, config.cls, config.dfl, config.angle, config.topk) == (7.5, 0.5, 1.5, 1.0, 10)
    head = SimpleNamespace(head=SimpleNamespace(nc=1, reg_max=16, stride=torch.tensor([8.0]), nm=0, ne=1))
    assert AnchorFreeOBBLoss(head, hyp=AnchorFreeLossConfig(box=5.0)).hyp == AnchorFreeOBBLossConfig(box=5.0)
    assert AnchorFreeOBBLoss(head, hyp={"angle": 2.0}).hyp.angle == 2.0
    with pytest.raises(ConfigError, match="angle"):
        AnchorFreeOBBLoss(head, hyp={"angle": -1.0})
