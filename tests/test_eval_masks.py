"""Instance-mask operations: prototype masks, crops, IoU, polygons, RLE and label rasterisation, each
against the reference's own function on the same inputs."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from yolotrain.eval.masks import (
    mask_iou,
    masks_in_original,
    masks_to_polygons,
    masks_to_rle,
    process_masks,
    scale_masks_to_original,
    split_overlap_mask,
    upsampled_masks,
)


def random_case(seed: int, n: int = 7, nm: int = 32, size: tuple[int, int] = (96, 128)):
    g = torch.Generator().manual_seed(seed)
    h, w = size
    proto = torch.randn(nm, h // 4, w // 4, generator=g)
    coefficients = torch.randn(n, nm, generator=g)
    xy = torch.rand(n, 2, generator=g) * torch.tensor([w, h]) * 0.7
    wh = torch.rand(n, 2, generator=g) * torch.tensor([w, h]) * 0.5 + 3
    return proto, coefficients, torch.cat((xy, (xy + wh).minimum(torch.tensor([w, h]))), 1), size


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prototype_masks_are_the_references(reference, seed):
    from yolov5.utils.segment.general import process_mask, process_mask_native

    proto, coefficients, boxes, size = random_case(seed)
    ours = process_masks(proto, coefficients, boxes, size)
    assert ours.dtype == torch.bool and ours.shape == (7, size[0] // 4, size[1] // 4)
    assert torch.equal(ours, process_mask(proto, coefficients, boxes.clone(), size).bool())
    assert ours.any() and not ours.all()
    native = torch.cat(list(upsampled_masks(proto, coefficients, boxes, size, chunk=3)))
    assert torch.equal(native, process_mask_native(proto, coefficients, boxes.clone(), size).bool())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(*[st.floats(-20, 140, allow_nan=False)] * 4), min_size=1, max_size=5))
def test_crop_keeps_pixel_indices_inside_each_box(reference, boxes):
    """Any boxes, inverted, partly or wholly outside included: the reference's crop, pixel for pixel."""
    from yolov5.utils.segment.general import process_mask

    proto, coefficients, _, size = random_case(5, n=len(boxes))
    b = torch.tensor(boxes)
    assert torch.equal(process_masks(proto, coefficients, b, size), process_mask(proto, coefficients, b.clone(),
                                                                                 size).bool())


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from([1.0, 1e-7]), st.lists(st.booleans(), min_size=9, max_size=9))
def test_kept_masks_are_the_references_rows_even_with_logits_at_the_sigmoid_tie(reference, seed, scale, keep):
    """Masks without a sigmoid, of some detections only: the reference's masks of those detections, pixel for
    pixel, also when logits lie where float32 sigmoid rounds to exactly 0.5 (coefficients scaled by 1e-7)."""
    from yolov5.utils.segment.general import process_mask

    proto, coefficients, boxes, size = random_case(seed, n=9)
    coefficients = coefficients * scale
    kept = torch.tensor(keep)
    expected = process_mask(proto, coefficients, boxes.clone(), size).bool()
    assert torch.equal(process_masks(proto, coefficients, boxes, size, kept), expected[kept])
    assert torch.equal(process_masks(proto, coefficients, boxes, size), expected)


def test_logits_at_the_sigmoid_tie_are_not_read_as_their_sign():
    """A logit of 1e-8 is positive but its float32 sigmoid is exactly 0.5 (not a mask pixel), one of 1e-6
    is a pixel: masks that took ``logits > 0`` or ``> SIGMOID_TIE`` everywhere would get one of them wrong."""
    proto = torch.ones(1, 2, 2)
    coefficients = torch.tensor([[1e-8], [1e-6 * 1.5], [-1e-8]])
    boxes = torch.tensor([[0.0, 0.0, 8.0, 8.0]] * 3)
    masks = process_masks(proto, coefficients, boxes, (8, 8))
    assert masks.flatten(1).all(1).tolist() == [False, True, False]
    assert not masks[0].any() and not masks[2].any()


def test_mask_iou_is_the_references_and_symmetric(reference):
    from yolov5.utils.segment.general import mask_iou as reference_mask_iou

    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(5, 20, 30, generator=g) > 0.6, torch.rand(4, 20, 30, generator=g) > 0.3
    ours = mask_iou(a, b)
    torch.testing.assert_close(ours, reference_mask_iou(a.flatten(1).float(), b.flatten(1).float()))
    torch.testing.assert_close(mask_iou(b, a), ours.T)
    assert torch.allclose(mask_iou(a, a).diagonal(), torch.ones(5))


def test_retina_masks_cut_the_letterbox_border_and_match_upsampled_then_scaled():
    """Masks made at the original resolution agree with input-size masks scaled back, up to the edge
    pixels that two different resamplings place differently."""
    proto, coefficients, boxes, size = random_case(4, size=(128, 128))
    # Smooth prototypes (as trained ones are): random ones flip at every pixel whatever the resampling.
    proto = torch.nn.functional.interpolate(proto[None, :, ::8, ::8], (32, 32), mode="bilinear")[0]
    pad, resized, original = (0, 16), (128, 96), (300, 400)  # 400 x 300 letterboxed into 128 x 128
    gain = 128 / 400
    boxes = torch.tensor([[10.0, 20.0, 100.0, 90.0], [0.0, 16.0, 128.0, 112.0]])
    coefficients = coefficients[:2]
    original_boxes = (boxes - torch.tensor([0, 16, 0, 16])) / gain
    native = torch.cat(list(masks_in_original(proto, coefficients, original_boxes, size, pad, resized, original)))
    scaled = scale_masks_to_original(torch.cat(list(upsampled_masks(proto, coefficients, boxes, size))), pad,
                                     resized, original)
    assert native.shape == scaled.shape == (2, *original)
    assert (native != scaled).float().mean() < 0.01
    # A border cut off by a pixel row of the prototypes (4 input pixels, 9 original) would be far off.
    shifted = torch.cat(list(masks_in_original(proto[:, 1:], coefficients, original_boxes, (124, 128), pad, resized,
                                               original)))
    assert (shifted != scaled).float().mean() > 2 * (native != scaled).float().mean()


def test_overlap_masks_split_back_into_each_instance():
    from yolotrain.data.segment import polygon_masks

    squares = [np.array([[x, y], [x + s, y], [x + s, y + s], [x, y + s]], np.float64)
               for x, y, s in ((10, 10, 60), (30, 30, 20), (70, 5, 40))]
    overlap, order = polygon_masks((96, 128), squares, 4, overlap=True)
    assert order.tolist() == [0, 2, 1]  # largest first
    split = split_overlap_mask(torch.from_numpy(overlap[0].astype(np.int64)), 3)
    assert split.shape == (3, 24, 32) and not (split.sum(0) > 1).any()
    singles, _ = polygon_masks((96, 128), squares, 4, overlap=False)
    # The small square sits on the large one: the large one's overlap mask has a hole where it is.
    assert singles[0].sum() > split[0].sum() and torch.equal(split[2], torch.from_numpy(singles[1] > 0))
    assert torch.equal(split.any(0), torch.from_numpy(singles.any(0)))


def test_polygons_trace_each_mask_and_empty_masks_give_none():
    masks = np.zeros((3, 40, 50), bool)
    masks[0, 5:20, 10:30] = True
    masks[1, 2:6, 2:6], masks[1, 20:35, 20:45] = True, True  # two parts: the larger is kept
    polygons = masks_to_polygons(torch.from_numpy(masks))
    assert polygons[0].dtype == np.float32 and polygons[0].min(0).tolist() == [10, 5]
    assert polygons[0].max(0).tolist() == [29, 19]
    assert polygons[1].min(0).tolist() == [20, 20] and polygons[2].shape == (0, 2)
    assert len(masks_to_polygons(masks, strategy="concat")[1]) == 8
    with pytest.raises(ValueError, match="strategy"):
        masks_to_polygons(masks, strategy="all")


def test_rle_decodes_to_the_same_masks():
    from pycocotools import mask as coco_mask

    g = torch.Generator().manual_seed(1)
    masks = torch.rand(4, 33, 47, generator=g) > 0.5
    rles = masks_to_rle(masks)
    assert [r["size"] for r in rles] == [[33, 47]] * 4 and all(isinstance(r["counts"], str) for r in rles)
    decoded = coco_mask.decode([{"size": r["size"], "counts": r["counts"].encode()} for r in rles])
    assert np.array_equal(decoded.transpose(2, 0, 1), masks.numpy())
    assert masks_to_rle(np.zeros((0, 5, 5), bool)) == []
