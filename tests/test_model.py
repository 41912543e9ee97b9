"""The YOLOv5 architecture: sizes, output contracts, input checks, fusion."""

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from yolotrain import Yolov5
from yolotrain.model import Conv, Detect

# Parameter counts of the reference implementation (unfused), per version and class count; P6 models
# built from the reference's models/hub/yolov5*6.yaml (tests/test_parity_reference.py measures them live).
REFERENCE_PARAMETERS = {
    ("n", 2): 1_766_623, ("n", 80): 1_872_157,
    ("s", 2): 7_025_023, ("s", 80): 7_235_389,
    ("m", 2): 20_875_359, ("m", 80): 21_190_557,
    ("l", 2): 46_143_679, ("l", 80): 46_563_709,
    ("x", 2): 86_224_543, ("x", 80): 86_749_405,
    ("n6", 2): 3_096_244, ("n6", 80): 3_246_940,
    ("s6", 2): 12_326_164, ("s6", 80): 12_626_620,
    ("m6", 2): 35_281_716, ("m6", 80): 35_731_932,
    ("l6", 2): 76_170_196, ("l6", 80): 76_770_172,
    ("x6", 2): 140_045_044, ("x6", 80): 140_794_780,
}


@pytest.mark.parametrize(("version", "nc"), sorted(REFERENCE_PARAMETERS))
def test_parameter_count_equals_reference(version, nc):
    model = Yolov5(version=version, num_classes=nc)
    assert sum(p.numel() for p in model.parameters()) == REFERENCE_PARAMETERS[(version, nc)]


@pytest.mark.parametrize("shape", [(64, 64), (96, 160), (160, 64)])
def test_train_mode_returns_three_raw_maps(shape):
    model = Yolov5("n", num_classes=3).train()
    h, w = shape
    maps = model(torch.rand(2, 3, h, w))
    assert [tuple(m.shape) for m in maps] == [(2, 3, h // s, w // s, 8) for s in (8, 16, 32)]


@pytest.mark.parametrize("shape", [(128, 128), (192, 64)])
def test_p6_train_mode_returns_four_raw_maps(shape):
    model = Yolov5("n6", num_classes=3).train()
    h, w = shape
    maps = model(torch.rand(2, 3, h, w))
    assert [tuple(m.shape) for m in maps] == [(2, 3, h // s, w // s, 8) for s in (8, 16, 32, 64)]
    assert model.stride.tolist() == [8, 16, 32, 64] and model.max_stride == 64
    # The reference's P6 anchors, in pixels.
    torch.testing.assert_close(model.head.anchors[3] * 64, torch.tensor([[436.0, 615], [739, 380], [925, 792]]))


def test_p6_layout_and_default_image_size():
    model = Yolov5("yolov5s6", num_classes=2)
    assert (model.version, len(model.model), type(model.model[11]).__name__) == ("s6", 34, "SPPF")
    assert model.default_img_size == 1280 and Yolov5("s", num_classes=2).default_img_size == 640
    with pytest.raises(ValueError, match="multiples of 64, got 96x128"):
        model(torch.rand(1, 3, 96, 128))
    model.eval()
    with torch.no_grad():
        out = model(torch.rand(1, 3, 128, 64))
    assert out.shape == (1, 3 * sum((128 // s) * (64 // s) for s in (8, 16, 32, 64)), 7)


def test_eval_mode_decodes_boxes_in_pixels():
    model = Yolov5("n", num_classes=2).eval()
    with torch.no_grad():
        out = model(torch.rand(1, 3, 96, 64))
    cells = sum((96 // s) * (64 // s) for s in (8, 16, 32))
    assert out.shape == (1, 3 * cells, 7)
    # Centres lie within the grid's reach, scores are probabilities.
    assert out[..., 0].min() >= -16 and out[..., 0].max() <= 64 + 16
    assert ((out[..., 4:] >= 0) & (out[..., 4:] <= 1)).all()


def test_decoding_matches_hand_computation():
    model = Yolov5("n", num_classes=1).eval()
    maps = [torch.zeros(1, 3, 2, 2, 6), torch.zeros(1, 3, 1, 1, 6), torch.zeros(1, 3, 1, 1, 6)]
    out = model.head.decode(maps)
    # Zero logits: sigmoid 0.5 → centre at the cell's centre, size equal to the anchor.
    first = out[0, 0]
    assert torch.allclose(first[:4], torch.tensor([4.0, 4.0, 10.0, 13.0]))
    assert torch.allclose(out[0, 5, :2], torch.tensor([12.0, 4.0]))  # anchor 0, cell (y=0, x=1)... of level 0
    assert torch.allclose(first[4:], torch.tensor([0.5, 0.5]))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**16), st.integers(1, 5), st.integers(1, 6), st.integers(1, 6), st.integers(1, 90),
       st.sampled_from([0, 32]), st.sampled_from([torch.float32, torch.bfloat16]), st.booleans())
@example(seed=0, batch=4, ny=28, nx=36, nc=80, extra=32, dtype=torch.float32, views=True)  # a validation batch
@example(seed=0, batch=4, ny=28, nx=36, nc=80, extra=0, dtype=torch.float32, views=True)
@example(seed=0, batch=4, ny=28, nx=36, nc=80, extra=0, dtype=torch.float32, views=False)
def test_decoding_into_one_output_is_decode_bit_for_bit(seed, batch, ny, nx, nc, extra, dtype, views):
    """What eval-mode forward returns (each level written into one output, read from views of channels-last
    convolution outputs) is the graph-friendly decode's output of the contiguous maps bit for bit: any
    batch and map sizes and class counts, with mask coefficients or not, bf16 maps."""
    g = torch.Generator().manual_seed(seed)
    anchors = torch.tensor([[10.0, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]])
    head = Detect(nc, anchors.view(3, 3, 2), (8, 16, 32), extra_outputs=extra)
    maps = []
    for k in range(3):
        shape = (batch, 3, max(ny >> k, 1), max(nx >> k, 1), head.no)
        logits = (torch.randn(shape, generator=g) * 4).to(dtype)
        if views:  # as map_views gives them: [B, 3 * no, ny, nx] channels-last, viewed and permuted
            conv = logits.permute(0, 1, 4, 2, 3).reshape(batch, 3 * head.no, *shape[2:4])
            conv = conv.contiguous(memory_format=torch.channels_last)
            logits = conv.view(batch, 3, head.no, *shape[2:4]).permute(0, 1, 3, 4, 2)
        maps.append(logits)
    expected = head.decode([m.contiguous() for m in maps])  # forward's maps
    assert torch.equal(head.decode_into_one(maps), expected) and expected.dtype == torch.float32


@pytest.mark.parametrize("task", ["detect", "segment"])
def test_eval_forward_is_the_decoded_maps_of_forward_maps(task):
    """Eval forward (the head's outputs decoded without a contiguous copy) gives decode's numbers of the
    raw maps bit for bit, on a channels-last model as validation runs it."""
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=3, task=task).eval().to(memory_format=torch.channels_last)
    imgs = torch.rand(3, 3, 96, 128).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        outputs = model(imgs)
        maps = model.forward_maps(imgs)
    differentiable = model(imgs)  # with autograd: out of place, the same numbers
    if task == "segment":
        (outputs, proto), (maps, expected_proto), (differentiable, _) = outputs, maps, differentiable
        assert torch.equal(proto, expected_proto)
    assert torch.equal(outputs, model.head.decode(maps)) and torch.equal(differentiable, outputs)
    assert differentiable.requires_grad


@pytest.mark.parametrize("bad", [(1, 3, 100, 64), (1, 3, 64, 70), (1, 1, 64, 64), (3, 64, 64)])
def test_bad_input_shapes_raise_clear_errors(bad):
    with pytest.raises(ValueError, match="multiples of 32|expected images"):
        Yolov5("n", num_classes=2)(torch.rand(*bad))


def test_unknown_version_is_a_value_error():
    with pytest.raises(ValueError, match="unknown YOLOv5 version 'q'"):
        Yolov5(version="q")
    assert Yolov5(version="yolov5n").version == "n"


def test_no_inplace_activations():
    model = Yolov5("n", num_classes=2)
    assert not [m for m in model.modules() if getattr(m, "inplace", False)]


def test_bias_priors():
    model = Yolov5("n", num_classes=2)
    for conv, stride in zip(model.head.m, (8, 16, 32)):
        bias = conv.bias.detach().view(3, 7)
        expected_obj = torch.log(torch.tensor(8 / (640 / stride) ** 2))
        # Default conv bias init is uniform within ±1/sqrt(fan_in); the prior is added on top.
        bound = 1 / conv.weight.shape[1] ** 0.5
        assert ((bias[:, 4] - expected_obj).abs() <= bound).all()
        assert ((bias[:, 5:] - torch.log(torch.tensor(0.6 / (2 - 0.99999)))).abs() <= bound).all()


def test_custom_anchors_are_used():
    anchors = [[4, 4, 8, 8, 12, 12], [16, 16, 24, 24, 32, 32], [48, 48, 64, 64, 96, 96]]
    model = Yolov5("n", num_classes=1, anchors=anchors)
    assert torch.allclose(model.head.anchors[0, 0], torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match="anchors"):
        Yolov5("n", anchors=[[1, 2, 3]])


def test_fuse_keeps_outputs():
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2)
    model.train()
    model(torch.rand(4, 3, 64, 64))  # move BatchNorm statistics away from their defaults
    model.eval()
    x = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        before = model(x)
        after = model.fuse()(x)
    assert not [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert all(isinstance(m.bn, torch.nn.Identity) for m in model.modules() if isinstance(m, Conv))
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)
