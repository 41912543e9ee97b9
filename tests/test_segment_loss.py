"""SegmentLoss: the reference's segmentation ComputeLoss on the same weights and batch (values and gradients),
overlap and per-target masks, autograd safety, clear errors."""

from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from yolotrain import Yolov5
from yolotrain.loss import SegmentLoss
from yolotrain.loss.segment import _box_pixels


def sorted_targets(n: int, batch: int, nc: int, seed: int) -> torch.Tensor:
    """Targets grouped by image, as the collate function gives them."""
    g = torch.Generator().manual_seed(seed)
    table = torch.cat([
        torch.randint(0, batch, (n, 1), generator=g).float(),
        torch.randint(0, nc, (n, 1), generator=g).float(),
        torch.rand(n, 2, generator=g) * 0.8 + 0.1,
        torch.rand(n, 2, generator=g) * 0.5 + 0.02,
    ], 1)
    return table[torch.argsort(table[:, 0], stable=True)]


def target_masks(targets: torch.Tensor, batch: int, height: int, width: int, overlap: bool,
                 seed: int) -> torch.Tensor:
    """Random blobs: overlap maps (1-based target index within its image, later targets on top) or one
    binary mask per target."""
    g = torch.Generator().manual_seed(seed)
    blobs = (torch.rand(targets.shape[0], height, width, generator=g) > 0.6).float()
    if not overlap:
        return blobs
    maps = torch.zeros(batch, height, width)
    for image in range(batch):
        rows = (targets[:, 0] == image).nonzero().flatten().tolist()
        for number, row in enumerate(rows, 1):
            maps[image] = torch.where(blobs[row] > 0, float(number), maps[image])
    return maps


def reference_hyp(nc: int, img_size: int) -> dict:
    # What the reference's segment/train.py passes to ComputeLoss after scaling (three levels).
    return {"box": 0.05, "cls": 0.5 * nc / 80, "obj": 1.0 * (img_size / 640) ** 2, "cls_pw": 1.0, "obj_pw": 1.0,
            "anchor_t": 4.0, "fl_gamma": 0.0}


CASES = [
    # (nc, batch, height, width, number of targets, overlap, mask ratio)
    (2, 2, 64, 64, 0, True, 4),        # no targets: the mask term is zero
    (2, 2, 64, 64, 6, True, 4),
    (80, 3, 64, 96, 40, True, 4),      # crowded, non-square
    (3, 2, 96, 64, 12, False, 4),      # one mask per target
    (2, 2, 64, 64, 8, True, 1),        # masks at full resolution, resized to the prototypes
]


@pytest.mark.parametrize(("nc", "batch", "height", "width", "n_targets", "overlap", "ratio"), CASES)
def test_loss_and_gradients_match_reference(reference, nc, batch, height, width, n_targets, overlap, ratio):
    from yolov5.models.yolo import SegmentationModel
    from yolov5.utils.segment.loss import ComputeLoss

    torch.manual_seed(n_targets)
    config = Path(reference.__file__).parent / "models" / "segment" / "yolov5n-seg.yaml"
    ref = SegmentationModel(str(config), nc=nc)
    ours = Yolov5("n", num_classes=nc, task="segment")
    ours.load_state_dict(ref.state_dict())
    imgs = torch.rand(batch, 3, height, width)
    targets = sorted_targets(n_targets, batch, nc, seed=n_targets)
    masks = target_masks(targets, batch, height // ratio, width // ratio, overlap, seed=1)

    ref_maps, ref_proto = ref.train()(imgs)
    our_maps, our_proto = ours.train()(imgs)
    ref.hyp = reference_hyp(nc, max(height, width))
    ref_loss, ref_parts = ComputeLoss(ref, overlap=overlap)((ref_maps, ref_proto), targets, masks)
    criterion = SegmentLoss(ours, rect_training=height != width, overlap=overlap)
    our_loss = criterion((our_maps, our_proto), targets, masks, pred_size=imgs.shape[2:4])
    torch.testing.assert_close(our_loss, ref_loss.squeeze(), rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(criterion.components, ref_parts, rtol=1e-4, atol=1e-7)
    assert (criterion.components[1] > 0) == (n_targets > 0)

    # Without targets the reference leaves the prototypes out of the graph: a zero gradient here.
    ref_grads = torch.autograd.grad(ref_loss.sum(), [*ref_maps, ref_proto], allow_unused=True)
    our_grads = torch.autograd.grad(our_loss, [*our_maps, our_proto], allow_unused=True)
    for ref_input, a, b in zip([*ref_maps, ref_proto], ref_grads, our_grads):
        a = torch.zeros_like(ref_input) if a is None else a
        b = torch.zeros_like(ref_input) if b is None else b
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-8)


def test_loss_writes_nothing_in_place_and_reports_four_parts():
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2, task="segment").train()
    imgs = torch.rand(2, 3, 64, 64)
    targets = sorted_targets(5, 2, 2, seed=0)
    masks = target_masks(targets, 2, 16, 16, True, seed=0)
    maps, proto = model(imgs)
    versions = [t._version for t in (*maps, proto, targets, masks)]
    criterion = SegmentLoss(model)
    loss = criterion((maps, proto), targets, masks)
    assert [t._version for t in (*maps, proto, targets, masks)] == versions
    loss.backward()
    assert criterion.component_names == ("box", "seg", "obj", "cls")
    assert criterion.components.shape == (4,) and not criterion.components.requires_grad
    torch.testing.assert_close(loss.detach(), criterion.components.sum() * 2)


def test_detection_outputs_or_missing_masks_are_one_line_errors():
    model = Yolov5("n", num_classes=2, task="segment").train()
    maps, proto = model(torch.rand(1, 3, 64, 64))
    criterion = SegmentLoss(model)
    with pytest.raises(ValueError, match=r"^expected \(maps, proto\) from a segmentation model in train\(\) mode$"):
        criterion(maps, torch.zeros(0, 6), torch.zeros(1, 16, 16))
    with pytest.raises(ValueError, match="^the segmentation loss needs the target masks$"):
        criterion((maps, proto), torch.zeros(0, 6))


def test_the_doctor_finds_no_inplace_write_in_a_segmentation_step():
    from yolotrain.doctor import check_step

    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2, task="segment").train()
    targets = sorted_targets(6, 2, 2, seed=1)
    masks = target_masks(targets, 2, 16, 16, True, seed=1)
    criterion = SegmentLoss(model)

    def step():
        criterion(model(torch.rand(2, 3, 64, 64)), targets, masks).backward()

    assert check_step(step) == []


def test_autocast_outputs_are_scored_in_float32():
    """bfloat16 maps and prototypes (AMP) give the float32 loss of the same values, in float32."""
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2, task="segment").train()
    targets = sorted_targets(6, 2, 2, seed=2)
    masks = target_masks(targets, 2, 16, 16, True, seed=2)
    with torch.no_grad():
        maps, proto = model(torch.rand(2, 3, 64, 64))
    low = ([m.bfloat16() for m in maps], proto.bfloat16())
    exact = ([m.float() for m in low[0]], low[1].float())
    criterion = SegmentLoss(model)
    loss = criterion(low, targets, masks)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, criterion(exact, targets, masks))


box_edges = st.one_of(st.integers(-3, 20).map(float), st.floats(-3.0, 20.0, allow_nan=False, width=32))


@given(boxes=st.lists(st.tuples(box_edges, box_edges, box_edges, box_edges), max_size=6),
       h=st.integers(1, 12), w=st.integers(1, 12))
def test_the_mask_term_scores_exactly_the_pixels_the_reference_keeps(boxes, h, w):
    """The BCE is computed only inside the boxes: the (box, pixel) pairs are those the reference's
    crop_mask keeps (``x1 <= col < x2``, ``y1 <= row < y2``), on and off the pixel grid, partly outside
    the mask or empty, in box then row-major order."""
    xyxy = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)
    box, pixel = _box_pixels(xyxy, h, w)
    cols = torch.arange(w, dtype=torch.float32)[None, None, :]
    rows = torch.arange(h, dtype=torch.float32)[None, :, None]
    x1, y1, x2, y2 = xyxy[:, :, None].chunk(4, 1)
    kept = ((cols >= x1) & (cols < x2) & (rows >= y1) & (rows < y2)).reshape(len(boxes), h * w).nonzero()
    assert torch.equal(box, kept[:, 0]) and torch.equal(pixel, kept[:, 1])
