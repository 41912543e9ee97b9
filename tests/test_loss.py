"""YoloLoss: input forms, autograd safety, gradients against finite differences, clear errors."""

import math

import numpy as np
import pytest
import torch

from yolotrain import YOLO_LOSS, DivergenceError, YoloLoss, Yolov5


@pytest.fixture(scope="module")
def train_mode_model():
    """The untrained yolov5n of ``model`` in train mode, whose raw head maps the loss takes."""
    torch.manual_seed(0)
    return Yolov5("n", num_classes=2).train()


def crowded_targets(n: int, batch: int, nc: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.cat([
        torch.randint(0, batch, (n, 1), generator=g).float(),
        torch.randint(0, nc, (n, 1), generator=g).float(),
        torch.rand(n, 2, generator=g) * 0.9 + 0.05,
        torch.rand(n, 2, generator=g) * 0.4 + 0.02,
    ], 1)


def test_alias_and_scalar_result(train_mode_model):
    assert YOLO_LOSS is YoloLoss
    imgs = torch.rand(2, 3, 64, 64)
    criterion = YOLO_LOSS(train_mode_model)
    loss = criterion(train_mode_model(imgs), crowded_targets(5, 2, 2), pred_size=imgs.shape[2:4])
    assert loss.ndim == 0 and loss.item() > 0
    assert criterion.components.shape == (3,) and not criterion.components.requires_grad
    # Total is (box + obj + cls) × batch size.
    assert math.isclose(loss.item(), criterion.components.sum().item() * 2, rel_tol=1e-6)


def test_list_targets_equal_table_targets(train_mode_model):
    imgs = torch.rand(2, 3, 64, 64)
    outputs = train_mode_model(imgs)
    table = crowded_targets(6, 2, 2)
    per_image = [table[table[:, 0] == i, 1:].numpy() for i in range(2)]
    criterion = YoloLoss(train_mode_model)
    by_table = criterion(outputs, table, pred_size=imgs.shape[2:4])
    by_list = criterion(outputs, per_image, pred_size=imgs.shape[2:4])
    torch.testing.assert_close(by_list, by_table)
    # Per-image rows may also be tensors, and an image may have none.
    empty = criterion(outputs, [torch.zeros(0, 5), torch.zeros(0, 5)], pred_size=imgs.shape[2:4])
    assert criterion.components[0] == 0 and criterion.components[2] == 0 and empty > 0


def test_loss_never_modifies_its_inputs_and_backward_passes_under_anomaly(train_mode_model):
    imgs = torch.rand(2, 3, 64, 96)
    outputs = train_mode_model(imgs)
    targets = crowded_targets(30, 2, 2)
    versions = [o._version for o in outputs]
    targets_before = targets.clone()
    with torch.autograd.set_detect_anomaly(True):
        loss = YoloLoss(train_mode_model, rect_training=True)(outputs, targets, pred_size=imgs.shape[2:4])
        assert [o._version for o in outputs] == versions
        loss.backward()
    assert torch.equal(targets, targets_before)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in train_mode_model.parameters())


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def test_gradient_matches_finite_differences():
    """Analytic gradient w.r.t. the head maps equals finite differences (float64).

    The reference loss stops gradients through two terms on purpose: CIoU's α and the IoU used as
    the objectness target. We evaluate at a point where both have zero first-order effect (predicted
    aspect ratio equal to the target's, objectness logits at 0), so every gradient entry is exact.
    """
    nc = 2
    model = Yolov5("n", num_classes=nc)
    anchors = model.head.anchors.double()
    g = torch.Generator().manual_seed(1)
    target_w, target_h = 0.30, 0.36  # of a 32x32 image
    maps = []
    for level, size in enumerate((4, 2, 1)):
        m = torch.randn(1, 3, size, size, 5 + nc, generator=g, dtype=torch.float64)
        m[..., 4] = 0.0
        # Height logit 0 → predicted h = anchor h; width logit chosen so that w/h equals the target's.
        ratio = (target_w / target_h) * anchors[level, :, 1] / anchors[level, :, 0]
        m[..., 3] = 0.0
        m[..., 2] = torch.tensor([_logit(math.sqrt(r) / 2) if r < 4 else 0.0 for r in ratio.tolist()],
                                 dtype=torch.float64).view(1, 3, 1, 1)
        maps.append(m.requires_grad_())
    targets = torch.tensor([[0, 1, 0.41, 0.57, target_w, target_h], [0, 0, 0.66, 0.3, target_w, target_h]])
    criterion = YoloLoss(model)
    # Only anchors whose aspect we could match may be assigned; the others must be filtered by anchor_t.
    assert torch.autograd.gradcheck(lambda *ms: criterion(list(ms), targets, pred_size=(32, 32)), tuple(maps))


def test_eval_output_is_refused_with_a_clear_message(train_mode_model):
    imgs = torch.rand(1, 3, 64, 64)
    train_mode_model.eval()
    try:
        with torch.no_grad():
            decoded = train_mode_model(imgs)
    finally:
        train_mode_model.train()
    with pytest.raises(ValueError, match="train\\(\\) mode"):
        YoloLoss(train_mode_model)(decoded, torch.zeros(0, 6), pred_size=(64, 64))


def test_pred_size_and_rect_checks(train_mode_model):
    outputs = train_mode_model(torch.rand(1, 3, 64, 96))
    with pytest.raises(ValueError, match="rect_training=True"):
        YoloLoss(train_mode_model)(outputs, torch.zeros(0, 6), pred_size=(64, 96))
    with pytest.raises(ValueError, match="does not match the head maps"):
        YoloLoss(train_mode_model, rect_training=True)(outputs, torch.zeros(0, 6), pred_size=(64, 64))
    with pytest.raises(ValueError, match=r"\[N, 6\]"):
        YoloLoss(train_mode_model, rect_training=True)(outputs, torch.zeros(3, 5), pred_size=(64, 96))


def test_divergence_names_step_and_cause(train_mode_model):
    imgs = torch.rand(1, 3, 64, 64)
    criterion = YoloLoss(train_mode_model)
    criterion(train_mode_model(imgs), torch.zeros(0, 6), pred_size=(64, 64))
    poisoned = [m * float("nan") for m in train_mode_model(imgs)]
    with pytest.raises(DivergenceError, match="step 2.*learning rate"):
        criterion(poisoned, crowded_targets(2, 1, 2), pred_size=(64, 64))
    saturated = [m.detach() * 0 + 1500.0 for m in train_mode_model(imgs)]
    with pytest.raises(DivergenceError, match="step 3: head logits reach 1.5e\\+03.*learning rate"):
        criterion(saturated, crowded_targets(2, 1, 2), pred_size=(64, 64))
    with torch.no_grad():  # validation reports the loss of a diverged model instead of stopping
        assert torch.isfinite(criterion(saturated, crowded_targets(2, 1, 2), pred_size=(64, 64)))
    with pytest.raises(ValueError, match="NaN"):
        criterion(train_mode_model(imgs), np.array([[0, 0, np.nan, 0.5, 0.1, 0.1]]), pred_size=(64, 64))


def test_objectness_gain_scales_with_image_size(train_mode_model):
    """The reference scales the objectness gain by (image size / 640)²: pinning img_size fixes it."""
    imgs = torch.rand(1, 3, 64, 64)
    outputs = train_mode_model(imgs)
    by_batch = YoloLoss(train_mode_model)
    by_batch(outputs, torch.zeros(0, 6), pred_size=(64, 64))
    pinned = YoloLoss(train_mode_model, img_size=640)
    pinned(outputs, torch.zeros(0, 6), pred_size=(64, 64))
    torch.testing.assert_close(pinned.components[1] * (64 / 640) ** 2, by_batch.components[1])
