"""The anchor-free loss (YOLOv8/YOLO11/YOLOv5u) and its task-aligned assigner against ultralytics 8's
``v8DetectionLoss``, ``v8SegmentationLoss`` and ``TaskAlignedAssigner`` (the oracle): the total, each part and the
gradients with respect to the head maps and prototypes, on the same tensors."""

import zlib
from types import SimpleNamespace

import pytest
import torch
from conftest import offline_ultralytics

from yolotrain.loss import AnchorFreeLoss, AnchorFreeLossConfig, AnchorFreeSegmentLoss, DivergenceError
from yolotrain.loss.assign import TaskAlignedAssigner
from yolotrain.settings import ConfigError

NC = 3
TOLERANCE = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """ultralytics' models (seeded, 3 classes) with their criteria, offline, its settings in a temporary folder."""
    with offline_ultralytics(tmp_path_factory):
        from ultralytics.nn.tasks import DetectionModel, SegmentationModel
        from ultralytics.utils.loss import v8DetectionLoss, v8SegmentationLoss
        from ultralytics.utils.tal import TaskAlignedAssigner as TheirAssigner
        from ultralytics.utils.tal import make_anchors

        torch.manual_seed(0)
        detect = DetectionModel("yolov8n.yaml", nc=NC, verbose=False)
        segment = SegmentationModel("yolov8n-seg.yaml", nc=NC, verbose=False)
        for model in (detect, segment):  # the hyperparameters ultralytics' criteria read (its defaults)
            model.args = SimpleNamespace(box=7.5, cls=0.5, dfl=1.5, overlap_mask=True)
        yield SimpleNamespace(detect=detect, segment=segment, detection_loss=v8DetectionLoss(detect),
                              segmentation_loss=v8SegmentationLoss, assigner=TheirAssigner, make_anchors=make_anchors)


def adapter(model) -> SimpleNamespace:
    """What our criteria read of a model: its head (nc, reg_max, stride, nm)."""
    return SimpleNamespace(head=model.model[-1])


def random_maps(generator: torch.Generator, batch: int, size: tuple[int, int], channels: int,
                strides=(8, 16, 32), reg_max: int = 16) -> list[torch.Tensor]:
    """Head maps whose boxes and class scores vary enough to give the assigner real choices: the box bins lean
    towards short distances (boxes of a few strides, which overlap the targets), the rest is noise."""
    lean = torch.zeros(channels)
    lean[:4 * reg_max] = -0.6 * torch.arange(reg_max).repeat(4)
    return [(torch.randn(batch, channels, size[0] // s, size[1] // s, generator=generator) * 1.5
             + lean[:, None, None]).requires_grad_() for s in strides]


def random_targets(generator: torch.Generator, counts: list[int], *, centre=(0.05, 0.95), side=(0.05, 0.6)
                   ) -> torch.Tensor:
    """``[N, 6]`` targets, image by image (ultralytics' layout), ``counts[i]`` in image ``i``."""
    n = sum(counts)
    image = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts)).float()
    cls = torch.randint(0, NC, (n,), generator=generator).float()
    xy = torch.rand(n, 2, generator=generator) * (centre[1] - centre[0]) + centre[0]
    wh = torch.rand(n, 2, generator=generator) * (side[1] - side[0]) + side[0]
    return torch.cat((image[:, None], cls[:, None], xy, wh), 1)


def their_batch(targets: torch.Tensor, **extra) -> dict:
    return {"batch_idx": targets[:, 0].clone(), "cls": targets[:, 1:2].clone(), "bboxes": targets[:, 2:6].clone(),
            **extra}


def their_preds(maps: list[torch.Tensor], reg_max: int, nc: int, proto: torch.Tensor | None = None) -> dict:
    """ultralytics' training outputs made of our per-level maps (box bins, class logits, coefficients)."""
    flat = torch.cat([m.flatten(2) for m in maps], 2)
    preds = {"boxes": flat[:, :4 * reg_max], "scores": flat[:, 4 * reg_max:4 * reg_max + nc], "feats": maps}
    if proto is not None:
        preds.update(mask_coefficient=flat[:, 4 * reg_max + nc:], proto=proto)
    return preds


def assert_same_loss(ours: torch.Tensor, ours_parts: torch.Tensor, theirs: torch.Tensor, their_parts: dict,
                     inputs: list[torch.Tensor]) -> None:
    """Totals, parts (ultralytics' items, in its order) and gradients with respect to ``inputs`` equal."""
    their_total = theirs.sum()
    torch.testing.assert_close(ours, their_total, **TOLERANCE)
    torch.testing.assert_close(ours_parts, torch.stack(list(their_parts.values()))[:len(ours_parts)], **TOLERANCE)
    our_grads = torch.autograd.grad(ours, inputs)
    their_grads = torch.autograd.grad(their_total, inputs)
    for ours_grad, their_grad in zip(our_grads, their_grads):
        torch.testing.assert_close(ours_grad, their_grad, **TOLERANCE)


DETECTION_CASES = {
    "random": dict(counts=[3, 5]),
    "image without labels": dict(counts=[4, 0, 2]),
    "batch without labels": dict(counts=[0, 0]),
    "tiny boxes": dict(counts=[6, 4], side=(0.003, 0.03)),
    "boxes at the border": dict(counts=[5, 5], centre=(0.0, 0.02), side=(0.02, 0.3)),
    "many per image (topk)": dict(counts=[40, 25], side=(0.1, 0.5)),
}


@pytest.mark.parametrize("case", DETECTION_CASES)
def test_detection_loss_and_gradients_equal_ultralytics(oracle, case):
    options = dict(DETECTION_CASES[case])
    generator = torch.Generator().manual_seed(zlib.crc32(case.encode()))
    counts = options.pop("counts")
    targets = random_targets(generator, counts, **options)
    if case == "boxes at the border":  # the other half at the right and bottom borders
        targets[1::2, 2:4] = 1 - targets[1::2, 2:4]
    head = oracle.detect.model[-1]
    maps = random_maps(generator, len(counts), (64, 96), 4 * head.reg_max + NC)

    criterion = AnchorFreeLoss(adapter(oracle.detect), rect_training=True)
    ours = criterion(maps, targets, pred_size=(64, 96))
    theirs, their_parts = oracle.detection_loss(their_preds(maps, head.reg_max, NC), their_batch(targets))
    assert_same_loss(ours, criterion.components, theirs, their_parts, maps)
    if targets.shape[0]:
        assert criterion.components[0] > 0 and criterion.components[2] > 0


def test_maps_of_ultralytics_own_forward_give_its_loss(oracle):
    """The layout of the maps (box bins first, then class logits, per level) is the head's own: the maps cut from
    the training outputs of ultralytics' model (its initial biases: wide boxes, rare classes) give its loss."""
    model = oracle.detect.train()
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(8))
    preds = model(images)
    sizes = [feature.shape[2:] for feature in preds["feats"]]
    counts = [h * w for h, w in sizes]
    maps = [torch.cat((boxes, scores), 1).unflatten(2, size).detach().requires_grad_()
            for boxes, scores, size in zip(preds["boxes"].split(counts, 2), preds["scores"].split(counts, 2), sizes)]
    targets = random_targets(torch.Generator().manual_seed(9), [3, 2])
    criterion = AnchorFreeLoss(adapter(model))
    ours = criterion(maps, targets)
    theirs, their_parts = oracle.detection_loss(their_preds(maps, 16, NC), their_batch(targets))
    assert_same_loss(ours, criterion.components, theirs, their_parts, maps)
    torch.testing.assert_close(theirs.sum(), oracle.detection_loss(preds, their_batch(targets))[0].sum(), **TOLERANCE)


def test_detection_rows_in_any_image_order_give_the_same_loss(oracle):
    """Targets need not come image by image: each image's own order is what counts."""
    generator = torch.Generator().manual_seed(5)
    targets = random_targets(generator, [4, 3, 5])
    within = torch.cat([torch.arange(n) for n in (4, 3, 5)])
    interleaved = targets[torch.argsort(within * 10 + targets[:, 0], stable=True)]
    maps = random_maps(generator, 3, (64, 64), 4 * 16 + NC)
    criterion = AnchorFreeLoss(adapter(oracle.detect))
    torch.testing.assert_close(criterion(maps, interleaved), criterion(maps, targets), rtol=0, atol=0)


SEGMENTATION_CASES = {
    "random, overlap": dict(counts=[3, 4], overlap=True),
    "random, one mask per target": dict(counts=[3, 4], overlap=False),
    "image without labels": dict(counts=[0, 5], overlap=True),
    "batch without labels": dict(counts=[0, 0], overlap=True),
    "masks at twice the prototypes' size": dict(counts=[2, 3], overlap=True, mask_scale=2),
    "many per image, tiny and at the border": dict(counts=[30, 12], overlap=False, tiny=True),
}


@pytest.mark.parametrize("case", SEGMENTATION_CASES)
def test_segmentation_loss_and_gradients_equal_ultralytics(oracle, case):
    options = SEGMENTATION_CASES[case]
    generator = torch.Generator().manual_seed(zlib.crc32(case.encode()))
    counts, overlap = options["counts"], options["overlap"]
    targets = random_targets(generator, counts, **(dict(side=(0.005, 0.05), centre=(0.0, 1.0))
                                                   if options.get("tiny") else {}))
    head = oracle.segment.model[-1]
    batch, size = len(counts), (96, 96)
    maps = random_maps(generator, batch, size, 4 * head.reg_max + NC + head.nm)
    proto = torch.randn(batch, head.nm, size[0] // 4, size[1] // 4, generator=generator).requires_grad_()
    mask_size = (size[0] // 4 * options.get("mask_scale", 1), size[1] // 4 * options.get("mask_scale", 1))
    if overlap:  # each pixel belongs to one of its image's targets (1-based) or to none
        masks = torch.stack([torch.randint(0, n + 1, mask_size, generator=generator) for n in counts]).float()
    else:
        masks = (torch.rand(targets.shape[0], *mask_size, generator=generator) > 0.5).float()

    criterion = AnchorFreeSegmentLoss(adapter(oracle.segment), overlap=overlap)
    ours = criterion((maps, proto), targets, masks, pred_size=size)
    oracle.segment.args.overlap_mask = overlap
    their_criterion = oracle.segmentation_loss(oracle.segment)
    theirs, their_parts = their_criterion(their_preds(maps, head.reg_max, NC, proto),
                                          their_batch(targets, masks=masks.clone()))
    assert_same_loss(ours, criterion.components, theirs, their_parts, [*maps, proto])
    assert criterion.component_names == ("box", "seg", "cls", "dfl")
    if targets.shape[0]:
        assert criterion.components[1] > 0


def test_assigner_equals_ultralytics(oracle):
    generator = torch.Generator().manual_seed(11)
    maps = [torch.zeros(2, 1, 96 // s, 64 // s) for s in (8, 16, 32)]
    points, strides = oracle.make_anchors(maps, torch.tensor([8.0, 16.0, 32.0]), 0.5)
    points = points * strides
    batch, most = 2, 12
    scores = torch.rand(batch, points.shape[0], NC, generator=generator)
    centres = torch.rand(batch, points.shape[0], 2, generator=generator) * torch.tensor([64.0, 96.0])
    sides = torch.rand(batch, points.shape[0], 2, generator=generator) * 40 + 2
    boxes = torch.cat((centres - sides / 2, centres + sides / 2), -1)
    gt_centres = torch.rand(batch, most, 2, generator=generator) * torch.tensor([64.0, 96.0])
    gt_sides = torch.rand(batch, most, 2, generator=generator) * 40 + 1
    gt_boxes = torch.cat((gt_centres - gt_sides / 2, gt_centres + gt_sides / 2), -1)
    gt_valid = torch.arange(most)[None] < torch.tensor([[most], [7]])
    gt_boxes = gt_boxes * gt_valid[..., None]
    gt_labels = torch.randint(0, NC, (batch, most), generator=generator) * gt_valid

    ours = TaskAlignedAssigner(NC, topk=10, alpha=0.5, beta=6.0, min_side=16)(
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
    head = oracle.segment.model[-1]
    maps = random_maps(generator, 2, (64, 64), 4 * head.reg_max + NC + head.nm)
    proto = torch.randn(2, head.nm, 16, 16, generator=generator).requires_grad_()
    targets = random_targets(generator, [3, 2])
    masks = torch.stack([torch.randint(0, n + 1, (16, 16), generator=generator) for n in (3, 2)]).float()
    inputs = [*maps, proto, targets, masks]
    versions, copies = [t._version for t in inputs], [t.detach().clone() for t in inputs]
    AnchorFreeSegmentLoss(adapter(oracle.segment))((maps, proto), targets, masks).backward()
    assert [t._version for t in inputs] == versions
    for tensor, copy in zip(inputs, copies):
        assert torch.equal(tensor.detach(), copy)


def test_non_square_batch_needs_rect_training(oracle):
    criterion = AnchorFreeLoss(adapter(oracle.detect))
    maps = random_maps(torch.Generator().manual_seed(0), 1, (64, 96), 4 * 16 + NC)
    with pytest.raises(ValueError, match="non-square batch 64x96"):
        criterion(maps, torch.zeros(0, 6))
    with pytest.raises(ValueError, match="does not match"):
        criterion([m[:, :-1] for m in maps], torch.zeros(0, 6))


@pytest.mark.parametrize(("column", "value", "message"), [(0, 2, "image indices must lie in 0..1"),
                                                         (1, NC, "classes must lie in 0..2"),
                                                         (2, float("nan"), "NaN or infinite")])
def test_targets_outside_the_batch_or_classes_are_refused(oracle, column, value, message):
    generator = torch.Generator().manual_seed(2)
    maps = random_maps(generator, 2, (64, 64), 4 * 16 + NC)
    targets = random_targets(generator, [2, 2])
    targets[-1, column] = value
    with pytest.raises(ValueError, match=message):
        AnchorFreeLoss(adapter(oracle.detect))(maps, targets)


def test_non_finite_maps_raise_divergence_error_in_training_only(oracle):
    generator = torch.Generator().manual_seed(4)
    maps = random_maps(generator, 2, (64, 64), 4 * 16 + NC)
    class_logit = (torch.tensor([0]), torch.tensor([4 * 16]), torch.tensor([0]), torch.tensor([0]))
    broken = [maps[0].detach().index_put(class_logit, torch.tensor(float("nan"))), *maps[1:]]
    criterion = AnchorFreeLoss(adapter(oracle.detect))
    with pytest.raises(DivergenceError, match="non-finite loss at step 1"):
        criterion(broken, random_targets(generator, [2, 2]))
    with torch.no_grad():  # validation reports whatever the loss is
        assert not torch.isfinite(criterion(broken, random_targets(generator, [2, 2])))
    saturated = [maps[0].detach() * 0 + 2000.0, *maps[1:]]
    with pytest.raises(DivergenceError, match="head logits reach 2e\\+03"):
        criterion(saturated, random_targets(generator, [2, 2]))


def test_half_maps_are_scored_in_float32(oracle):
    generator = torch.Generator().manual_seed(6)
    maps = [m.detach().bfloat16() for m in random_maps(generator, 2, (64, 64), 4 * 16 + NC)]
    targets = random_targets(generator, [3, 1])
    criterion = AnchorFreeLoss(adapter(oracle.detect))
    loss = criterion(maps, targets)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, criterion([m.float() for m in maps], targets), rtol=0, atol=0)


def test_config_defaults_and_bounds():
    config = AnchorFreeLossConfig()
    assert (config.box, config.cls, config.dfl, config.topk, config.alpha, config.beta) == (7.5, 0.5, 1.5, 10, 0.5, 6.0)
    with pytest.raises(ConfigError, match="topk"):
        AnchorFreeLoss(SimpleNamespace(head=SimpleNamespace(nc=1, reg_max=16, stride=torch.tensor([8.0]))),
                       hyp={"topk": 0})
