"""Prediction on an image, a folder, a glob, a list and a video; saved outputs; unreadable files."""

import argparse
import json
import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import YOLOV5N_WEIGHTS

from yolotrain.interop import load_model
from yolotrain.prediction import SourceWarning, add_predict_arguments, predict, run_predict

BUS_LIKE = "000000000009.jpg"  # a coco128 image with several clear objects


@pytest.fixture(scope="module")
def pretrained_model():
    """The official yolov5n weights (skips without the shared folder): detections worth comparing."""
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"weights not found at {YOLOV5N_WEIGHTS}")
    return load_model(YOLOV5N_WEIGHTS)


@pytest.fixture
def images(coco128, tmp_path) -> Path:
    folder = tmp_path / "imgs"
    folder.mkdir()
    for name in (BUS_LIKE, "000000000025.jpg", "000000000030.jpg"):
        shutil.copy(coco128 / "images" / "train2017" / name, folder / name)
    return folder


def test_single_image_results_are_tensors_in_original_pixels(pretrained_model, images, tmp_path):
    path = images / BUS_LIKE
    h, w = cv2.imread(str(path)).shape[:2]
    (result,) = predict(pretrained_model, path, img_size=320, save_dir=tmp_path / "out", save_txt=True)
    n = len(result.scores)
    assert n > 0 and result.boxes.shape == (n, 4) and result.classes.dtype == torch.long
    assert result.orig_shape == (h, w)
    assert (result.boxes[:, [0, 2]] <= w).all() and (result.boxes[:, [1, 3]] <= h).all()
    assert (result.scores >= 0.25).all() and (result.scores[:-1] >= result.scores[1:]).all()
    assert result.names[0] == "person"
    drawn = cv2.imread(str(tmp_path / "out" / BUS_LIKE))
    assert drawn.shape == (h, w, 3) and not np.array_equal(drawn, cv2.imread(str(path)))
    rows = (tmp_path / "out" / "labels" / f"{Path(BUS_LIKE).stem}.txt").read_text().splitlines()
    assert len(rows) == n and all(0 <= float(v) <= 1 for v in rows[0].split()[1:5])
    run = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert len(run) == 1 and len(run[0]["detections"]) == n


def test_folder_glob_list_and_filters(pretrained_model, images):
    folder = predict(pretrained_model, images, img_size=256)
    globbed = predict(pretrained_model, str(images / "*.jpg"), img_size=256)
    listed = predict(pretrained_model, sorted(images.glob("*.jpg")), img_size=256)
    assert [r.path for r in folder] == [r.path for r in globbed] == [r.path for r in listed]
    assert len(folder) == 3
    for a, b in zip(folder, listed):
        torch.testing.assert_close(a.boxes, b.boxes)
    only_people = predict(pretrained_model, images, img_size=256, classes=[0], max_det=2)
    assert all((r.classes == 0).all() and len(r.scores) <= 2 for r in only_people)


def test_unreadable_files_are_skipped_with_one_counted_warning(pretrained_model, images):
    (images / "broken.jpg").write_bytes(b"not an image")
    (images / "empty.png").write_bytes(b"")
    with pytest.warns(SourceWarning, match=r"skipped 2 unreadable source file\(s\):.*broken.jpg"):
        results = predict(pretrained_model, images, img_size=256)
    assert len(results) == 3


def test_missing_source_raises(pretrained_model, tmp_path):
    with pytest.raises(FileNotFoundError, match="source not found"):
        predict(pretrained_model, tmp_path / "nope.jpg")


def test_video_frames_and_annotated_output(pretrained_model, coco128, tmp_path):
    frame = cv2.resize(cv2.imread(str(coco128 / "images" / "train2017" / BUS_LIKE)), (320, 240))
    video = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10, (320, 240))
    for shift in range(4):
        writer.write(np.roll(frame, shift * 4, axis=1))
    writer.release()
    results = predict(pretrained_model, video, img_size=320, save_dir=tmp_path / "out", save_txt=True)
    assert [r.frame for r in results] == [0, 1, 2, 3]
    assert all(r.orig_shape == (240, 320) for r in results)
    assert sum(len(r.scores) for r in results) > 0
    cap = cv2.VideoCapture(str(tmp_path / "out" / "clip.mp4"))
    frames = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
    cap.release()
    assert frames == 4
    assert len(list((tmp_path / "out" / "labels").glob("clip_*.txt"))) == 4


def test_cli_predict(images, tmp_path, capsys):
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"weights not found at {YOLOV5N_WEIGHTS}")
    args = add_predict_arguments(argparse.ArgumentParser()).parse_args(
        ["--weights", str(YOLOV5N_WEIGHTS), "--source", str(images), "--img", "256", "--device", "cpu",
         "--project", str(tmp_path / "runs")])
    assert run_predict(args) == 0
    assert sorted(p.name for p in (tmp_path / "runs" / "exp").glob("*.jpg")) == sorted(p.name for p in images.iterdir())
    assert "3 images/frames" in capsys.readouterr().out


def test_matches_reference_detect_path(reference, pretrained_model, images):
    """Same letterbox, NMS and mapping to the original image as the reference's detect.py."""
    from yolov5.utils.augmentations import letterbox
    from yolov5.utils.general import non_max_suppression, scale_boxes

    sys.path.insert(0, str(Path(reference.__file__).parent))  # the pickle names 'models.yolo'
    try:
        ref_model = torch.load(YOLOV5N_WEIGHTS, map_location="cpu", weights_only=False)["model"].float().fuse().eval()
    finally:
        sys.path.remove(str(Path(reference.__file__).parent))
    for path in sorted(images.glob("*.jpg")):
        im0 = cv2.imread(str(path))
        im = letterbox(im0, 320, stride=32, auto=True)[0].transpose((2, 0, 1))[::-1]
        x = torch.from_numpy(np.ascontiguousarray(im)).float()[None] / 255
        with torch.no_grad():
            det = non_max_suppression(ref_model(x)[0], 0.25, 0.45, max_det=1000)[0]
        det[:, :4] = scale_boxes(x.shape[2:], det[:, :4], im0.shape)
        # The reference decodes every file whole (these 640 px JPEGs would be decoded at 1/2 for 320).
        (ours,) = predict(pretrained_model, path, img_size=320, half=False, reduced_decode=False)
        assert len(ours.scores) == len(det)
        torch.testing.assert_close(ours.scores, det[:, 4], atol=1e-4, rtol=0)
        # The reference un-pads by the unrounded half padding (x.5) while the pixels sit at the rounded
        # pad: half an input pixel, i.e. up to 1 original pixel at this 0.5 resize (plus float noise).
        scale = max(im0.shape[:2]) / 320
        torch.testing.assert_close(ours.boxes, det[:, :4], atol=0.5 * scale + 0.01, rtol=0)


@pytest.fixture(scope="module")
def segmenter(reference):
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"weights not found at {YOLOV5N_WEIGHTS}")
    from segment_reference import ReferenceSegmenter, reference_segmenter

    return ReferenceSegmenter(reference_segmenter(reference, YOLOV5N_WEIGHTS))


def test_segmentation_results_carry_masks_polygons_and_files(segmenter, images, tmp_path):
    """A segmentation model's results carry a bool mask of the original image and an outline per
    detection; ``--retina-masks`` makes them as the reference's native masks; pictures show them and
    ``labels/*.txt`` hold polygon rows."""
    from yolov5.utils.segment.general import process_mask_native

    from yolotrain.nms import non_max_suppression, scale_boxes_to_original
    from yolotrain.prediction.run import prepare_image

    path = images / BUS_LIKE
    image = cv2.imread(str(path))
    h, w = image.shape[:2]
    (retina,) = predict(segmenter, path, img_size=320, retina_masks=True, save_dir=tmp_path / "out", save_txt=True)
    n = len(retina.scores)
    assert n > 2 and retina.masks.shape == (n, h, w) and retina.masks.dtype == bool and len(retina.polygons) == n
    rgb, gain, pad = prepare_image(image, 320)
    with torch.inference_mode():
        decoded, proto = segmenter(torch.from_numpy(rgb).permute(2, 0, 1)[None].float() / 255)
    det = non_max_suppression(decoded, 0.25, 0.45, max_det=1000, num_extra=32)[0]
    boxes = scale_boxes_to_original(det[:, :4], gain, pad, (h, w))
    expected = process_mask_native(proto[0], det[:, 6:], boxes, (h, w)).bool().numpy()
    assert np.array_equal(retina.masks, expected)
    # Each outline traces its mask: filled again, it covers the mask's pixels.
    largest = int(retina.masks.reshape(n, -1).sum(1).argmax())
    filled = cv2.fillPoly(np.zeros((h, w), np.uint8), [retina.polygons[largest].astype(np.int32)], 1).astype(bool)
    assert (filled & retina.masks[largest]).sum() > 0.9 * retina.masks[largest].sum()

    (plain,) = predict(segmenter, path, img_size=320)
    union = (plain.masks | retina.masks).sum()
    assert (plain.masks != retina.masks).sum() < 0.1 * union  # the same masks, resampled differently

    drawn = cv2.imread(str(tmp_path / "out" / BUS_LIKE))
    tinted = np.abs(drawn.astype(int) - image.astype(int)).sum(2) > 30
    assert tinted[retina.masks[largest]].mean() > 0.5
    rows = [line.split() for line in (tmp_path / "out" / "labels" / f"{path.stem}.txt").read_text().splitlines()]
    assert len(rows) == sum(len(p) > 0 for p in retina.polygons) and all(len(r) % 2 == 0 and len(r) >= 8 for r in rows)
    saved = json.loads((tmp_path / "out" / "predictions.json").read_text())[0]["detections"]
    assert len(saved[largest]["polygon"]) == 2 * len(retina.polygons[largest])


def test_segmentation_video_frames_carry_masks_and_are_drawn(segmenter, coco128, tmp_path):
    frame = cv2.resize(cv2.imread(str(coco128 / "images" / "train2017" / BUS_LIKE)), (320, 240))
    video = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10, (320, 240))
    for shift in range(2):
        writer.write(np.roll(frame, shift * 4, axis=1))
    writer.release()
    results = predict(segmenter, video, img_size=160, save_dir=tmp_path / "out", save_txt=True)
    assert [r.frame for r in results] == [0, 1]
    assert all(r.masks.shape == (len(r.scores), 240, 320) and len(r.polygons) == len(r.scores) for r in results)
    assert any(r.masks.any() for r in results)
    cap = cv2.VideoCapture(str(tmp_path / "out" / "clip.mp4"))
    assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == 2
    cap.release()
    labels = sorted((tmp_path / "out" / "labels").glob("clip_*.txt"))
    rows = [line.split() for f in labels for line in f.read_text().splitlines()]
    assert rows and all(len(r) >= 8 and len(r) % 2 == 0 for r in rows)
