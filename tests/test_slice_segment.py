"""Sliced inference of segmentation models: the tiles start on the model's stride grid, their predictions are
moved to the image and their prototypes stitched into one map per image (each pixel from the tile whose centre
is nearest), so one tile covering the image changes nothing, an object cut by a tile's border keeps a whole
mask, and val's mask metrics, predict's masks and the YOLO object work on sliced runs; exports are refused as
detection's are."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import COCO128, YOLOV5N_WEIGHTS, coco128_subset
from test_eval_val import COCO128_SEG

from yolotrain import YOLO, Yolov5
from yolotrain.checkpoint import save_checkpoint
from yolotrain.eval import val
from yolotrain.eval.inference import load_inference_model
from yolotrain.eval.masks import process_masks
from yolotrain.eval.slicing import SlicedDetector, TiledBatch, tile_boxes, tile_origins
from yolotrain.nms import non_max_suppression
from yolotrain.prediction import predict
from yolotrain.task import get_task


@pytest.mark.parametrize(("length", "tile", "overlap", "grid"), [
    (2560, 640, 0.2, 32), (1632, 640, 0.2, 32), (1280, 640, 0.0, 64), (704, 96, 0.25, 32), (1920, 640, 0.9, 32),
    (352, 128, 0.25, 32), (96, 64, 0.5, 32),
])
def test_tiles_on_a_grid_cover_the_side_overlapping_by_at_least_the_overlap(length, tile, overlap, grid):
    origins = tile_origins(length, tile, overlap, grid)
    assert origins[0] == 0 and origins[-1] == length - tile
    assert origins == sorted(set(origins)) and all(origin % grid == 0 for origin in origins)
    for before, after in zip(origins, origins[1:]):
        assert before + tile - after >= overlap * tile


def test_off_the_grid_spacing_is_moved_onto_it():
    assert tile_origins(1632, 640, 0.2) == [0, 496, 992]  # no grid: evenly spread
    assert tile_origins(1632, 640, 0.2, 32) == [0, 512, 992]


@pytest.fixture(scope="module")
def segmenter() -> Yolov5:
    """A random two-class segmentation model whose prototypes are of order 1 (a random Proto's are ~1e-7)."""
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2, names=["circle", "rectangle"], task="segment").eval()
    with torch.no_grad():
        model.head.proto.cv3.bn.bias.copy_(torch.randn(32))
    return model


def test_the_refusal_is_gone_and_the_sliced_model_is_a_segmentation_model(segmenter):
    sliced, _ = load_inference_model(segmenter, "cpu", half=False, slice=64)
    assert isinstance(sliced, SlicedDetector)
    assert (sliced.task, sliced.num_masks, sliced.grid, sliced.tile) == ("segment", 32, 32, 64)
    assert get_task("segment").slicing_refusal("x") is None


def test_predictions_are_each_tiles_moved_and_prototypes_the_nearest_tiles(segmenter):
    """Two images of 192 x 256 px in tiles of 128 px: the predictions are, image by image, each tile's alone moved
    by its origin (coefficients untouched), and each pixel of the prototype map is that of the tile whose centre is
    nearest along each axis (the seams halve the overlaps)."""
    imgs = torch.rand(2, 3, 192, 256, generator=torch.Generator().manual_seed(0))
    sliced = SlicedDetector(segmenter, 128, 0.25)
    tiles = tile_boxes(192, 256, 128, 0.25, 32)
    assert sorted({top for top, _, _, _ in tiles}) == [0, 64]
    assert sorted({left for _, left, _, _ in tiles}) == [0, 64, 128]
    with torch.inference_mode():
        decoded, proto = sliced(imgs)
        alone = [segmenter(imgs[:, :, top:top + th, left:left + tw]) for top, left, th, tw in tiles]
    moved = torch.cat([torch.cat((d[..., :1] + left, d[..., 1:2] + top, d[..., 2:]), -1)
                       for (d, _), (top, left, _, _) in zip(alone, tiles)], 1)
    torch.testing.assert_close(decoded, moved, rtol=1e-4, atol=1e-3)
    assert proto.shape == (2, 32, 48, 64)
    # Proto pixels (stride 4, tiles 32 wide): rows start at 0 and 16, the seam at (0 + 16 + 32) // 2 = 24;
    # columns at 0, 16, 32, seams at 24 and 40.
    rows, cols = [(0, 24, 0), (24, 48, 16)], [(0, 24, 0), (24, 40, 16), (40, 64, 32)]
    for r, (y0, y1, top) in enumerate(rows):
        for c, (x0, x1, left) in enumerate(cols):
            own = alone[r * len(cols) + c][1]
            torch.testing.assert_close(proto[..., y0:y1, x0:x1], own[..., y0 - top:y1 - top, x0 - left:x1 - left],
                                       rtol=1e-4, atol=1e-4)


def _object_outputs(left: int, box: tuple[float, float], score: float,
                    tile_w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A tile's outputs (one image, one class, 2 coefficients): one prediction of ``box`` (x1, x2 in the image's
    px, rows 16 to 48) scoring ``score`` with coefficients (4, 0), and prototypes whose first channel is 1 on the
    object (image columns 40 to 80, rows 16 to 48) where the tile holds it, -1 elsewhere."""
    x1, x2 = box
    pred = torch.zeros(1, 4, 5 + 1 + 2)
    pred[0, 0] = torch.tensor([(x1 + x2) / 2 - left, 32, x2 - x1, 32, score, 1.0, 4.0, 0.0])
    proto = -torch.ones(1, 2, 16, tile_w // 4)
    proto[0, 1] = 0.0
    columns = torch.arange(tile_w // 4) * 4 + left
    proto[0, 0, 4:12, (columns >= 40) & (columns < 80)] = 1.0
    return pred, proto


@pytest.mark.parametrize("kept", ["left", "right"])
def test_an_object_across_a_tile_border_gets_one_detection_with_a_mask_over_both_parts(kept):
    """Tiles of 64 px at 0 and 32 of a 96 px wide image; an object at columns 40 to 80 crosses the left tile's
    border (64). Both tiles predict its box; NMS keeps one, and its mask covers the object on both sides of that
    border, whichever tile it came from: the right tile's prototypes fill what the left tile did not see."""
    tiles = tile_boxes(64, 96, 64, 0.5, 32)
    assert tiles == [(0, 0, 64, 64), (0, 32, 64, 64)]
    scores = {"left": (0.9, 0.8), "right": (0.8, 0.9)}[kept]
    outputs = [_object_outputs(0, (40, 80), scores[0], 64), _object_outputs(32, (40, 80), scores[1], 64)]
    chunk = tuple(torch.cat(parts) for parts in zip(*outputs))  # the two tiles in one chunk, tile-major
    decoded, proto = get_task("segment").join_tile_outputs([chunk], TiledBatch(tiles, 1, (64, 96)))
    det = non_max_suppression(decoded, 0.25, 0.45, num_extra=2)[0]
    assert len(det) == 1 and det[0, 4].item() == pytest.approx(0.9)
    torch.testing.assert_close(det[0, :4], torch.tensor([40.0, 16, 80, 48]))
    mask = process_masks(proto[0], det[:, 6:], det[:, :4], (64, 96))[0]
    expected = torch.zeros(16, 24, dtype=torch.bool)
    expected[4:12, 10:20] = True  # columns 40 to 80 px: 10 to 20 at stride 4, both sides of 64 px (16)
    assert torch.equal(mask, expected)


def test_maps_of_tiles_off_their_grid_are_refused():
    tiles = TiledBatch([(0, 0, 64, 64), (0, 30, 64, 64)], 1, (64, 94))
    with pytest.raises(ValueError, match=r"^tiles of 64x64 px at \[\(0, 0\), \(0, 30\)\] do not lie on the grid "
                                         r"of their 16x16 maps$"):
        tiles.maps([torch.zeros(2, 1, 16, 16)])


@pytest.fixture(scope="module")
def real_segmenter(reference) -> Yolov5:
    """yolov5n-seg holding the official yolov5n's detection weights (real boxes), random masks of order 1."""
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"weights not found at {YOLOV5N_WEIGHTS}")
    from segment_reference import our_segmenter, reference_segmenter

    model = our_segmenter(reference_segmenter(reference, YOLOV5N_WEIGHTS))
    with torch.no_grad():
        model.head.proto.cv3.bn.bias.copy_(torch.randn(32, generator=torch.Generator().manual_seed(1)))
    return model


@pytest.fixture(scope="module")
def coco_image():
    import cv2

    image = cv2.imread(str(COCO128 / "images" / "train2017" / "000000000009.jpg"))
    if image is None:
        pytest.skip(f"shared dataset not found at {COCO128}")
    return image


@pytest.mark.parametrize("retina_masks", [False, True])
def test_one_tile_covering_the_image_gives_the_unsliced_boxes_and_masks(real_segmenter, coco_image, retina_masks):
    options = {"img_size": 320, "device": "cpu", "half": False, "conf": 0.1, "retina_masks": retina_masks}
    (plain,) = predict(real_segmenter, coco_image, **options)
    (sliced,) = predict(real_segmenter, coco_image, slice=320, **options)
    assert len(plain.scores) > 3 and plain.masks.any()
    torch.testing.assert_close(sliced.boxes.xyxy, plain.boxes.xyxy, rtol=0, atol=1e-3)
    torch.testing.assert_close(sliced.scores, plain.scores, rtol=0, atol=1e-5)
    assert torch.equal(sliced.classes, plain.classes)
    assert sliced.masks.shape == plain.masks.shape == (len(plain.scores), *coco_image.shape[:2])
    assert (sliced.masks != plain.masks).mean() < 1e-4  # float rounding may flip a pixel on a mask's edge


def test_sliced_val_scores_masks_and_one_tile_scores_as_unsliced(real_segmenter, tmp_path):
    """val on two coco128-seg images: sliced into 160 px tiles it returns box and mask metrics and writes its
    drawings and polygon label rows; one tile covering each batch scores as the whole image does."""
    if not (COCO128_SEG / "images").is_dir():
        pytest.skip(f"shared dataset not found at {COCO128_SEG}")
    data = coco128_subset(tmp_path / "data", 2, COCO128_SEG)
    options = {"img_size": 320, "device": "cpu", "workers": 0, "half": False, "verbose": False, "conf": 0.01}
    plain = val(real_segmenter, data, plots=False, **options)
    whole = val(real_segmenter, data, plots=False, slice=384, **options)  # rect batches are up to 352 px
    tiled = val(real_segmenter, data, slice=160, save_dir=tmp_path / "run", save_txt=True, plots=True, **options)
    assert plain.masks is not None and whole.masks is not None and tiled.masks is not None
    assert plain.map50 > 0 and plain.masks.map50 > 0
    for a, b in ((whole, plain), (whole.masks, plain.masks)):
        assert (a.map50, a.map) == pytest.approx((b.map50, b.map), abs=1e-6)
    assert 0 <= tiled.masks.map <= 1 and tiled.masks.map50 != plain.masks.map50
    assert (tmp_path / "run" / "val_batch0_pred.jpg").is_file()
    rows = [line.split() for path in (tmp_path / "run" / "labels").glob("*.txt")
            for line in path.read_text().splitlines()]
    assert rows and all(len(row) >= 7 and len(row) % 2 == 1 for row in rows)  # class, then 3+ x y points


def test_the_yolo_object_predicts_sliced_masks(segmenter, tmp_path):
    weights = save_checkpoint(tmp_path / "weights" / "seg", segmenter)
    image = (np.random.default_rng(0).random((128, 192, 3)) * 255).astype(np.uint8)
    options = {"img_size": 192, "device": "cpu", "conf": 0.0, "max_det": 100}
    plain = YOLO(str(weights)).predict(image, **options)[0]
    sliced = YOLO(str(weights)).predict(image, slice=64, **options)[0]
    assert sliced.masks is not None and sliced.masks.shape == (len(sliced.scores), 128, 192)
    assert len(sliced.polygons) == len(sliced.scores) > 0
    assert not torch.equal(plain.boxes.xyxy, sliced.boxes.xyxy)


def test_slicing_a_segmentation_export_is_one_line_as_a_detection_export(segmenter, tmp_path):
    """As detection's: slicing runs PyTorch models only, an export is refused even when it takes any size."""
    pytest.importorskip("onnxruntime")
    from yolotrain.interop import export

    path = export(segmenter, "onnx", out=tmp_path / "seg.onnx", img_size=96, dynamic_size=True)
    with pytest.raises(ValueError) as raised:
        predict(str(path), np.zeros((96, 96, 3), np.uint8), slice=64, device="cpu")
    assert str(raised.value) == (f"--slice runs PyTorch models on batches of tiles: {path} is an export; give its "
                                 "checkpoint or .pt")
