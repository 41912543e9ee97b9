"""The anchor-free keypoint (pose) loss against ultralytics 8's ``v8PoseLoss`` (the oracle): the total, each part
and the gradients with respect to the head maps, on the same tensors, for keypoints with and without visibility."""

import zlib
from types import SimpleNamespace

import pytest
import torch
from conftest import offline_ultralytics

from yolotrain.loss import (
    COCO_KEYPOINT_SIGMAS,
    AnchorFreeLossConfig,
    AnchorFreePoseLoss,
    AnchorFreePoseLossConfig,
    DivergenceError,
    keypoint_sigmas,
)
from yolotrain.model.anchor_free import AnchorFreeYolo
from yolotrain.settings import ConfigError

NC = 2
TOLERANCE = dict(rtol=1e-5, atol=1e-6)
HYP = dict(box=7.5, cls=0.5, dfl=1.5, pose=12.0, kobj=1.0)


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """ultralytics' pose models by keypoint shape (2 classes, seeded) with their criterion, offline."""
    with offline_ultralytics(tmp_path_factory):
        from ultralytics.nn.tasks import PoseModel
        from ultralytics.utils.loss import v8PoseLoss

        models = {}

        def model(kpt_shape: tuple[int, int]):
            if kpt_shape not in models:
                torch.manual_seed(0)
                built = PoseModel("yolov8n-pose.yaml", nc=NC, data_kpt_shape=kpt_shape, verbose=False)
                built.args = SimpleNamespace(**HYP)  # the hyperparameters its criterion reads (its defaults)
                models[kpt_shape] = built
            return models[kpt_shape]

        yield SimpleNamespace(model=model, loss=v8PoseLoss)


def adapter(model) -> SimpleNamespace:
    """What our criterion reads of a model: its head (nc, reg_max, stride, kpt_shape)."""
    return SimpleNamespace(head=model.model[-1])


def random_maps(generator: torch.Generator, batch: int, size: tuple[int, int], nc: int, keypoint_values: int,
                strides=(8, 16, 32), reg_max: int = 16) -> list[torch.Tensor]:
    """Head maps whose boxes lean towards a few strides (so that they overlap the targets) and whose keypoint
    offsets are noise of about a stride."""
    channels = 4 * reg_max + nc + keypoint_values
    lean = torch.zeros(channels)
    lean[:4 * reg_max] = -0.6 * torch.arange(reg_max).repeat(4)
    return [(torch.randn(batch, channels, size[0] // s, size[1] // s, generator=generator) * 1.5
             + lean[:, None, None]).requires_grad_() for s in strides]


def random_targets(generator: torch.Generator, counts: list[int], kpt_shape: tuple[int, int], *,
                   invisible: float = 0.2, side=(0.05, 0.6)) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, 6]`` targets image by image and their ``[N, K, D]`` keypoints inside their boxes (normalised), a share
    ``invisible`` of them unlabelled (visibility 0, at 0, 0 as label files write them) when D == 3."""
    n = sum(counts)
    image = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts)).float()
    cls = torch.randint(0, NC, (n,), generator=generator).float()
    wh = torch.rand(n, 2, generator=generator) * (side[1] - side[0]) + side[0]
    xy = torch.rand(n, 2, generator=generator) * (1 - wh) + wh / 2
    targets = torch.cat((image[:, None], cls[:, None], xy, wh), 1)
    count, dimensions = kpt_shape
    offsets = torch.rand(n, count, 2, generator=generator) - 0.5
    keypoints = xy[:, None] + offsets * wh[:, None]
    if dimensions == 3:
        visibility = torch.randint(1, 3, (n, count, 1), generator=generator).float()
        hidden = torch.rand(n, count, 1, generator=generator) < invisible
        keypoints = torch.cat((torch.where(hidden, 0.0, keypoints), torch.where(hidden, 0.0, visibility)), -1)
    return targets, keypoints


def their_batch(targets: torch.Tensor, keypoints: torch.Tensor) -> dict:
    return {"batch_idx": targets[:, 0].clone(), "cls": targets[:, 1:2].clone(), "bboxes": targets[:, 2:6].clone(),
            "keypoints": keypoints.clone()}


def their_preds(maps: list[torch.Tensor], nc: int, reg_max: int = 16) -> dict:
    """ultralytics' training outputs made of our per-level maps (box bins, class logits, keypoints)."""
    flat = torch.cat([m.flatten(2) for m in maps], 2)
    return {"boxes": flat[:, :4 * reg_max], "scores": flat[:, 4 * reg_max:4 * reg_max + nc],
            "kpts": flat[:, 4 * reg_max + nc:], "feats": maps}


CASES = {
    "random, COCO's 17 keypoints": dict(counts=[3, 5], kpt_shape=(17, 3)),
    "image without labels": dict(counts=[4, 0, 2], kpt_shape=(17, 3)),
    "batch without labels": dict(counts=[0, 0], kpt_shape=(17, 3)),
    "keypoints without visibility (D = 2)": dict(counts=[3, 4], kpt_shape=(5, 2)),
    "17 keypoints without visibility": dict(counts=[2, 3], kpt_shape=(17, 2)),
    "mostly unlabelled keypoints": dict(counts=[4, 3], kpt_shape=(4, 3), invisible=0.8),
    "targets whose keypoints are all unlabelled": dict(counts=[3, 2], kpt_shape=(4, 3), invisible=1.0),
    "many per image": dict(counts=[30, 20], kpt_shape=(6, 3), side=(0.1, 0.5)),
}


@pytest.mark.parametrize("case", CASES)
def test_pose_loss_and_gradients_equal_ultralytics(oracle, case):
    options = dict(CASES[case])
    generator = torch.Generator().manual_seed(zlib.crc32(case.encode()))
    counts, kpt_shape = options.pop("counts"), options.pop("kpt_shape")
    targets, keypoints = random_targets(generator, counts, kpt_shape, **options)
    model = oracle.model(kpt_shape)
    size = (64, 96)
    maps = random_maps(generator, len(counts), size, NC, kpt_shape[0] * kpt_shape[1])

    criterion = AnchorFreePoseLoss(adapter(model), rect_training=True)
    ours = criterion(maps, targets, keypoints, pred_size=size)
    theirs, their_parts = oracle.loss(model)(their_preds(maps, NC), their_batch(targets, keypoints))
    their_total = theirs.sum()
    torch.testing.assert_close(ours, their_total, **TOLERANCE)
    torch.testing.assert_close(criterion.components, torch.stack(list(their_parts.values())), **TOLERANCE)
    assert criterion.component_names == ("box", "pose", "kobj", "cls", "dfl")
    for our_grad, their_grad in zip(torch.autograd.grad(ours, maps), torch.autograd.grad(their_total, maps)):
        torch.testing.assert_close(our_grad, their_grad, **TOLERANCE)
    if targets.shape[0] and case != "targets whose keypoints are all unlabelled":
        assert criterion.components[1] > 0
    if targets.shape[0] and kpt_shape[1] == 3:
        assert criterion.components[2] > 0


def test_labels_with_visibility_train_a_model_without_it(oracle):
    """Keypoints labelled with visibility (D' = 3) for a head of x, y only: the unlabelled ones are left out of
    the location term, and there is no visibility term, as in the reference."""
    generator = torch.Generator().manual_seed(21)
    targets, keypoints = random_targets(generator, [3, 3], (5, 3), invisible=0.5)
    model = oracle.model((5, 2))
    maps = random_maps(generator, 2, (64, 64), NC, 10)
    criterion = AnchorFreePoseLoss(adapter(model))
    ours = criterion(maps, targets, keypoints)
    theirs, their_parts = oracle.loss(model)(their_preds(maps, NC), their_batch(targets, keypoints))
    torch.testing.assert_close(ours, theirs.sum(), **TOLERANCE)
    torch.testing.assert_close(criterion.components, torch.stack(list(their_parts.values())), **TOLERANCE)
    assert criterion.components[2] == 0


def test_rows_in_any_image_order_give_the_same_loss(oracle):
    """Targets and their keypoints need not come image by image: each image's own order is what counts."""
    generator = torch.Generator().manual_seed(5)
    targets, keypoints = random_targets(generator, [4, 3, 5], (17, 3))
    within = torch.cat([torch.arange(n) for n in (4, 3, 5)])
    order = torch.argsort(within * 10 + targets[:, 0], stable=True)
    maps = random_maps(generator, 3, (64, 64), NC, 17 * 3)
    criterion = AnchorFreePoseLoss(adapter(oracle.model((17, 3))))
    torch.testing.assert_close(criterion(maps, targets[order], keypoints[order]), criterion(maps, targets, keypoints),
                               rtol=0, atol=0)


def test_our_pose_models_maps_give_ultralytics_loss(oracle):
    """The layout of our model's train-mode maps is the one the criterion reads: with ultralytics' weights, its own
    forward and ours give the same loss."""
    reference = oracle.model((17, 3)).train()
    ours = AnchorFreeYolo("yolov8n-pose", num_classes=NC)
    ours.load_state_dict(reference.state_dict())
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(8))
    targets, keypoints = random_targets(torch.Generator().manual_seed(9), [3, 2], (17, 3))
    loss = AnchorFreePoseLoss(ours.train())(ours(images), targets, keypoints)
    theirs, _ = oracle.loss(reference)(reference(images), their_batch(targets, keypoints))
    torch.testing.assert_close(loss, theirs.sum(), rtol=1e-4, atol=1e-4)


def test_loss_never_writes_into_its_inputs(oracle):
    generator = torch.Generator().manual_seed(3)
    maps = random_maps(generator, 2, (64, 64), NC, 17 * 3)
    targets, keypoints = random_targets(generator, [3, 2], (17, 3))
    inputs = [*maps, targets, keypoints]
    versions, copies = [t._version for t in inputs], [t.detach().clone() for t in inputs]
    AnchorFreePoseLoss(adapter(oracle.model((17, 3))))(maps, targets, keypoints).backward()
    assert [t._version for t in inputs] == versions
    for tensor, copy in zip(inputs, copies):
        assert torch.equal(tensor.detach(), copy)


def test_non_finite_maps_raise_divergence_error_in_training_only(oracle):
    generator = torch.Generator().manual_seed(4)
    maps = random_maps(generator, 2, (64, 64), NC, 17 * 3)
    targets, keypoints = random_targets(generator, [2, 2], (17, 3))
    class_logit = (torch.tensor([0]), torch.tensor([4 * 16]), torch.tensor([0]), torch.tensor([0]))
    broken = [maps[0].detach().index_put(class_logit, torch.tensor(float("nan"))), *maps[1:]]
    criterion = AnchorFreePoseLoss(adapter(oracle.model((17, 3))))
    with pytest.raises(DivergenceError, match="non-finite loss at step 1"):
        criterion(broken, targets, keypoints)
    with torch.no_grad():  # validation reports whatever the loss is
        assert not torch.isfinite(criterion(broken, targets, keypoints))


def test_keypoints_that_do_not_fit_are_refused(oracle):
    generator = torch.Generator().manual_seed(5)
    maps = random_maps(generator, 2, (64, 64), NC, 17 * 3)
    targets, keypoints = random_targets(generator, [2, 2], (17, 3))
    criterion = AnchorFreePoseLoss(adapter(oracle.model((17, 3))))
    with pytest.raises(ValueError, match=r"do not match \[4 targets, 17 keypoints, 2 or 3 values\]"):
        criterion(maps, targets, keypoints[:, :5])
    with pytest.raises(ValueError, match="do not match"):
        criterion(maps, targets, keypoints[:3])
    with pytest.raises(ValueError, match="needs the target keypoints"):
        criterion(maps, targets)
    bad = keypoints.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="keypoints contain NaN"):
        criterion(maps, targets, bad)
    with pytest.raises(ValueError, match=r"10 keypoint values \(5 x 2\)"):
        AnchorFreePoseLoss(adapter(oracle.model((5, 2))))(maps, targets, keypoints)


def test_sigmas_config_and_heads_without_keypoints(oracle):
    assert keypoint_sigmas((17, 3)).tolist() == pytest.approx(COCO_KEYPOINT_SIGMAS)
    assert keypoint_sigmas((17, 2)).tolist() == pytest.approx([1 / 17] * 17)  # the reference's: COCO's for 17x3 only
    assert keypoint_sigmas((4, 3)).tolist() == pytest.approx([0.25] * 4)
    config = AnchorFreePoseLossConfig()
    assert (config.box, config.cls, config.dfl, config.pose, config.kobj) == (7.5, 0.5, 1.5, 12.0, 1.0)
    head = adapter(oracle.model((4, 3)))
    # A detection config keeps its gains; the keypoint gains stay at their defaults.
    criterion = AnchorFreePoseLoss(head, hyp=AnchorFreeLossConfig(box=5.0))
    assert (criterion.hyp.box, criterion.hyp.pose) == (5.0, 12.0)
    assert AnchorFreePoseLoss(head, hyp={"pose": 6.0, "kobj": 2.0}).hyp.pose == 6.0
    with pytest.raises(ConfigError, match="kobj"):
        AnchorFreePoseLoss(head, hyp={"kobj": -1})
    with pytest.raises(ValueError, match="sigmas must be 4 positive values"):
        AnchorFreePoseLoss(head, sigmas=[0.1, 0.2, 0.0, 0.1])
    custom = AnchorFreePoseLoss(head, sigmas=[0.1, 0.2, 0.3, 0.4])
    assert custom.sigmas.tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4])
    with pytest.raises(ValueError, match="needs a head that predicts keypoints"):
        AnchorFreePoseLoss(AnchorFreeYolo("yolov8n", num_classes=NC))
