"""Prediction decodes a large still JPEG at 1/2, 1/4 or 1/8 when nothing keeps or writes its pixels: the results
stay in the file's pixels and close to a full decode's; saving, crops, streams and the setting turned off decode
the whole file, bit for bit as before, and other formats are read as before."""

import argparse

import cv2
import numpy as np
import pytest
import torch
from conftest import YOLOV5N_WEIGHTS, untrained
from PIL import Image
from torchvision.ops import box_iou

from yolotrain.data.dataset import decoded_size
from yolotrain.interop import load_model
from yolotrain.prediction import add_predict_arguments, predict
from yolotrain.prediction.run import predict_config, read_still

BUS_LIKE = "000000000009.jpg"  # a coco128 image (640 x 480) with several clear objects
UPSCALE = 4


@pytest.fixture(scope="module")
def pretrained_model():
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"weights not found at {YOLOV5N_WEIGHTS}")
    return load_model(YOLOV5N_WEIGHTS)


def upscaled(coco128, folder, suffix: str = ".jpg"):
    """The coco128 image 4x larger, written as ``big{suffix}``; returns its path and its full decode."""
    image = cv2.imread(str(coco128 / "images" / "train2017" / BUS_LIKE))
    big = cv2.resize(image, None, fx=UPSCALE, fy=UPSCALE, interpolation=cv2.INTER_CUBIC)
    path = folder / f"big{suffix}"
    assert cv2.imwrite(str(path), big, [cv2.IMWRITE_JPEG_QUALITY, 95])
    return path, cv2.imread(str(path))


def matched(a, b):
    """For each box of ``a``, its IoU with the box of ``b`` it overlaps most."""
    return box_iou(a.boxes, b.boxes).max(1).values


def test_boxes_of_a_reduced_decode_are_close_and_in_original_pixels(pretrained_model, coco128, tmp_path):
    path, full_image = upscaled(coco128, tmp_path)
    h, w = full_image.shape[:2]
    (reduced,) = predict(pretrained_model, path, img_size=320, half=False)
    (full,) = predict(pretrained_model, path, img_size=320, half=False, reduced_decode=False)
    assert reduced.orig_shape == full.orig_shape == (h, w) == (480 * UPSCALE, 640 * UPSCALE)
    assert len(full.scores) >= 3 and abs(len(reduced.scores) - len(full.scores)) <= 1
    assert (matched(full, reduced) > 0.9).sum() >= len(full.scores) - 1
    assert not torch.equal(reduced.boxes, full.boxes)  # the reduced decode was taken
    assert (reduced.boxes[:, [0, 2]] <= w).all() and (reduced.boxes[:, [1, 3]] <= h).all()
    # The same picture at its own 640 x 480 size: boxes 4x smaller (the file's pixels, not the decode's).
    (small,) = predict(pretrained_model, coco128 / "images" / "train2017" / BUS_LIKE, img_size=320, half=False)
    scaled_down = torch.cat((reduced.boxes / UPSCALE, reduced.scores[:, None]), 1)
    assert (box_iou(scaled_down[:, :4], small.boxes).max(1).values > 0.85).sum() >= len(small.scores) - 1


def test_turned_off_it_is_the_full_decode_bit_for_bit(pretrained_model, coco128, tmp_path):
    path, full_image = upscaled(coco128, tmp_path)
    (off,) = predict(pretrained_model, path, img_size=320, half=False, reduced_decode=False)
    (array,) = predict(pretrained_model, full_image, img_size=320, half=False)
    assert torch.equal(off.boxes, array.boxes) and torch.equal(off.scores, array.scores)


def test_saving_decodes_the_whole_file(pretrained_model, coco128, tmp_path):
    """Annotated images and crops are of the file's full pixels, and the detections those of a full decode."""
    path, full_image = upscaled(coco128, tmp_path)
    (saved,) = predict(pretrained_model, path, img_size=320, half=False, save_dir=tmp_path / "out", save_crop=True)
    (full,) = predict(pretrained_model, path, img_size=320, half=False, reduced_decode=False)
    assert torch.equal(saved.boxes, full.boxes)
    drawn = cv2.imread(str(tmp_path / "out" / path.name))
    assert drawn.shape == full_image.shape
    crops = sorted((tmp_path / "out" / "crops").rglob("*.jpg"))
    x1, y1, x2, y2 = saved.boxes[0].tolist()
    assert crops and max(cv2.imread(str(c)).shape[1] for c in crops) >= (x2 - x1) - 1


def test_streamed_results_keep_the_full_image(pretrained_model, coco128, tmp_path):
    path, full_image = upscaled(coco128, tmp_path)
    (streamed,) = list(predict(pretrained_model, path, img_size=320, half=False, stream=True))
    assert np.array_equal(streamed.image, full_image)
    (full,) = predict(pretrained_model, path, img_size=320, half=False, reduced_decode=False)
    assert torch.equal(streamed.boxes, full.boxes)


def test_a_listed_result_plots_on_the_full_file(pretrained_model, coco128, tmp_path):
    path, full_image = upscaled(coco128, tmp_path)
    (reduced,) = predict(pretrained_model, path, img_size=320, half=False)
    assert reduced.image is None and reduced.plot().shape == full_image.shape


@pytest.mark.parametrize("suffix", [".png", ".bmp"])
def test_other_formats_are_read_whole(pretrained_model, coco128, tmp_path, suffix):
    path, full_image = upscaled(coco128, tmp_path, suffix)
    image, orig_shape = read_still(path, lambda shape: 320 / max(shape))
    assert orig_shape is None and np.array_equal(image, full_image)
    (on,) = predict(pretrained_model, path, img_size=320, half=False)
    (off,) = predict(pretrained_model, path, img_size=320, half=False, reduced_decode=False)
    assert torch.equal(on.boxes, off.boxes) and torch.equal(on.scores, off.scores)


@pytest.mark.parametrize(("img_size", "factor"), [(1280, 2), (640, 4), (320, 8), (2560, 1)])
def test_the_largest_reduction_that_covers_the_input_is_read(coco128, tmp_path, img_size, factor):
    path, full_image = upscaled(coco128, tmp_path)
    image, orig_shape = read_still(path, lambda shape: img_size / max(shape))
    if factor == 1:
        assert orig_shape is None and np.array_equal(image, full_image)
    else:
        assert orig_shape == full_image.shape[:2]
        assert image.shape == (full_image.shape[0] // factor, full_image.shape[1] // factor, 3)
    assert max(image.shape[:2]) >= img_size
    image, orig_shape = read_still(path, lambda shape: img_size / max(shape), reduced=False)
    assert orig_shape is None and np.array_equal(image, full_image)


def test_exif_orientation_gives_the_size_opencv_decodes(tmp_path):
    """A JPEG stored sideways with EXIF orientation 6: OpenCV turns it upright, and so does the size read."""
    stored = np.zeros((400, 1000, 3), np.uint8)
    stored[:, :500] = 200
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "turned.jpg"
    Image.fromarray(stored).save(path, exif=exif)
    assert decoded_size(path) == cv2.imread(str(path)).shape[:2] == (1000, 400)
    image, orig_shape = read_still(path, lambda shape: 200 / max(shape))
    assert orig_shape == (1000, 400) and image.shape == (250, 100, 3)


def test_the_cli_flag_turns_it_off():
    parser = add_predict_arguments(argparse.ArgumentParser())
    base = ["--weights", "w.pt", "--source", "a.jpg"]
    assert predict_config(parser.parse_args(base)).reduced_decode is True
    assert predict_config(parser.parse_args([*base, "--no-reduced-decode"])).reduced_decode is False


def test_yolo_predict_keeps_the_full_image_and_takes_the_setting(coco128, tmp_path):
    """``YOLO().predict`` results keep their image (as ultralytics' ``orig_img``): the file is decoded whole."""
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"weights not found at {YOLOV5N_WEIGHTS}")
    from yolotrain import YOLO

    path, full_image = upscaled(coco128, tmp_path)
    model = YOLO(str(YOLOV5N_WEIGHTS))
    (default,) = model.predict(path, img_size=320, half=False, device="cpu")
    (off,) = model.predict(path, img_size=320, half=False, device="cpu", reduced_decode=False)
    assert np.array_equal(default.image, full_image) and default.orig_shape == full_image.shape[:2]
    assert torch.equal(default.boxes, off.boxes)


def test_labels_without_pictures_take_the_reduced_decode(pretrained_model, coco128, tmp_path):
    """``--nosave --save-txt``: no pixels are written, so the file is decoded reduced; rows normalised by its size."""
    path, full_image = upscaled(coco128, tmp_path)
    (labelled,) = predict(pretrained_model, path, img_size=320, half=False, save_dir=tmp_path / "out", save=False,
                          save_txt=True)
    (full,) = predict(pretrained_model, path, img_size=320, half=False, reduced_decode=False)
    assert not torch.equal(labelled.boxes, full.boxes) and labelled.orig_shape == full_image.shape[:2]
    rows = (tmp_path / "out" / "labels" / "big.txt").read_text().splitlines()
    assert rows == labelled.yolo_lines() and not list((tmp_path / "out").glob("*.jpg"))


@pytest.mark.parametrize(("arch", "head"), [("yolo11n-seg", {}), ("yolov8n-pose", {"kpt_shape": (4, 3)}),
                                            ("yolov8n-obb", {})])
def test_masks_keypoints_and_rotated_boxes_are_in_the_files_pixels(coco128, tmp_path, arch, head):
    """Each task's outputs beside the boxes are made for the file's size, as from a full decode."""
    path, full_image = upscaled(coco128, tmp_path)
    model = untrained(arch, **head)
    options = {"img_size": 320, "half": False, "conf": 0.3, "max_det": 20, "device": "cpu"}
    (reduced,) = predict(model, path, **options)
    (full,) = predict(model, path, reduced_decode=False, **options)
    h, w = full_image.shape[:2]
    assert reduced.orig_shape == full.orig_shape == (h, w) and len(full.scores) > 0
    assert abs(len(reduced.scores) - len(full.scores)) <= max(2, len(full.scores) // 5)
    if reduced.masks is not None:
        assert reduced.masks.shape[1:] == full.masks.shape[1:] == (h, w)
    if reduced.keypoints is not None:
        assert (reduced.keypoints[..., 0] <= w).all() and reduced.keypoints[..., 0].max() > w / 4
    if reduced.rotated is not None:
        assert reduced.rotated[:, :2].max() > w / 4 and (reduced.rotated[:, 0] <= w).all()


def test_a_classifier_reads_the_reduced_decode_and_names_the_files_size(coco128, tmp_path):
    from yolotrain.model.classify import Classifier
    from yolotrain.prediction.classify import ClassifyPredictor

    path, full_image = upscaled(coco128, tmp_path)
    torch.manual_seed(0)
    model = Classifier.from_name("yolov5n-cls", 2, ["circle", "rectangle"]).eval()
    (reduced,) = predict(model, path, img_size=224, half=False, device="cpu")
    (full,) = predict(model, path, img_size=224, half=False, device="cpu", reduced_decode=False)
    assert reduced.orig_shape == full.orig_shape == full_image.shape[:2] and reduced.image is None
    torch.testing.assert_close(reduced.probs, full.probs, atol=0.05, rtol=0)
    # Its short side is what is resized to the input: 1920 / 8 = 240 still covers 224.
    image, orig_shape = read_still(path, ClassifyPredictor(model, torch.device("cpu"), 224).decode_scale)
    assert orig_shape == full_image.shape[:2] and image.shape[:2] == (240, 320)
