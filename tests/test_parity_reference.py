"""Parity with the reference implementation (PyPI ``yolov5`` 7.0.14): same weights, same outputs, same loss."""

from pathlib import Path

import pytest
import torch

from yolotrain import YoloLoss, Yolov5


def reference_model(reference, version: str, nc: int):
    models = Path(reference.__file__).parent / "models"
    config = (models / "hub" if version.endswith("6") else models) / f"yolov5{version}.yaml"
    return reference.models.yolo.Model(str(config), nc=nc)


def reference_hyp(nc: int, img_size: int, levels: int = 3) -> dict:
    # What the reference's train.py passes to ComputeLoss after scaling for the layers, nc and image size.
    gain = 3 / levels
    return {"box": 0.05 * gain, "cls": 0.5 * nc / 80 * gain, "obj": 1.0 * (img_size / 640) ** 2 * gain,
            "cls_pw": 1.0, "obj_pw": 1.0, "anchor_t": 4.0, "fl_gamma": 0.0}


def targets(n: int, batch: int, nc: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.cat([
        torch.randint(0, batch, (n, 1), generator=g).float(),
        torch.randint(0, nc, (n, 1), generator=g).float(),
        torch.rand(n, 2, generator=g),
        torch.rand(n, 2, generator=g) * 0.6 + 0.005,
    ], 1)


@pytest.mark.parametrize("version", ["n", "n6"])
@pytest.mark.parametrize("nc", [2, 80])
def test_same_seed_builds_identical_weights(reference, nc, version):
    """Same layer order and initialisation (including the bias priors) as the reference."""
    torch.manual_seed(123)
    ref = reference_model(reference, version, nc)
    torch.manual_seed(123)
    ours = Yolov5(version, num_classes=nc)
    assert list(ref.state_dict()) == list(ours.state_dict())
    # Parameters only: the reference's stride probe (a forward pass in train mode) moves BN running stats.
    our_params = dict(ours.named_parameters())
    for key, value in ref.named_parameters():
        torch.testing.assert_close(our_params[key], value, msg=key, rtol=0, atol=0)
    for ref_bn, our_bn in zip((m for m in ref.modules() if isinstance(m, torch.nn.BatchNorm2d)),
                              (m for m in ours.modules() if isinstance(m, torch.nn.BatchNorm2d))):
        assert (our_bn.eps, our_bn.momentum) == (ref_bn.eps, ref_bn.momentum)


CASES = [
    # (version, nc, batch, height, width, number of targets)
    ("n", 2, 2, 128, 128, 0),     # empty targets
    ("n", 2, 2, 128, 128, 7),
    ("n", 80, 2, 128, 128, 7),
    ("n", 80, 3, 96, 160, 120),   # crowded, non-square
    ("n", 2, 2, 160, 96, 60),     # crowded, non-square (portrait)
    ("n6", 2, 2, 128, 128, 0),    # P6: four levels, their own objectness balance
    ("n6", 2, 2, 128, 128, 9),
    ("n6", 80, 2, 128, 192, 90),  # crowded, non-square
]


@pytest.mark.parametrize(("version", "nc", "batch", "height", "width", "n_targets"), CASES)
def test_outputs_and_loss_match_reference(reference, version, nc, batch, height, width, n_targets):
    torch.manual_seed(nc + n_targets)
    ref = reference_model(reference, version, nc)
    ours = Yolov5(version, num_classes=nc)
    ours.load_state_dict(ref.state_dict())
    imgs = torch.rand(batch, 3, height, width)
    t = targets(n_targets, batch, nc, seed=n_targets)

    ref.train(), ours.train()
    ref_maps, our_maps = ref(imgs), ours(imgs)
    for a, b in zip(ref_maps, our_maps):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)

    img_size = max(height, width)
    ref.hyp = reference_hyp(nc, img_size, levels=len(ref_maps))
    ref_loss, ref_parts = reference.utils.loss.ComputeLoss(ref)(ref_maps, t)
    criterion = YoloLoss(ours, rect_training=height != width)
    our_loss = criterion(our_maps, t, pred_size=imgs.shape[2:4])
    torch.testing.assert_close(our_loss, ref_loss.squeeze(), rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(criterion.components, ref_parts, rtol=1e-4, atol=1e-7)

    ref_grads = torch.autograd.grad(ref_loss.sum(), ref_maps)
    our_grads = torch.autograd.grad(our_loss, our_maps)
    for a, b in zip(ref_grads, our_grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-7)

    ref.eval(), ours.eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(imgs), ref(imgs)[0], atol=1e-4, rtol=1e-5)


# Building the larger reference models takes seconds each: they run with the slow tests.
P6_SIZES = ["n6", *(pytest.param(v, marks=pytest.mark.slow) for v in ("s6", "m6", "l6", "x6"))]


@pytest.mark.parametrize("version", P6_SIZES)
def test_p6_parameter_counts_and_names_equal_the_reference(reference, version):
    for nc in (2, 80):
        ref, ours = reference_model(reference, version, nc), Yolov5(version, num_classes=nc)
        assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())
        assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
        assert ours.stride.tolist() == ref.stride.tolist() == [8, 16, 32, 64]
