"""Test-time augmentation (``--augment``) and ensembles (several ``--weights``): equal to the reference's
``Model._forward_augment`` and ``Ensemble`` on real weights and images, through ``val``, ``predict``, the
commands and :class:`yolotrain.YOLO`; what they do not run is refused in one line."""

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import YOLOV5N_WEIGHTS, coco128_subset
from test_eval_val import TOLERANCE, by_image

from yolotrain import YOLO, Yolov5
from yolotrain.checkpoint import save_checkpoint
from yolotrain.cli import main
from yolotrain.eval import val
from yolotrain.eval.tta import AugmentedDetector, EnsembleDetector, scale_images
from yolotrain.model.classify import Classifier
from yolotrain.prediction import predict

IMAGES, IMG_SIZE = 16, 320
# The reference's val labels sit half a pixel off its pixels where the letterbox padding is odd (see
# test_eval_val.MAP50_95_TOLERANCE_SMALL): with equal detections that moves mAP50-95 on these 16 images by
# 0.0033 without augmentation and 0.0049 with it (three times the detections). The detections themselves are
# compared one by one (_assert_same_detections).
MAP50_95_TOLERANCE_16 = 0.006


def _load_official(reference, path: Path) -> dict:
    """An official checkpoint as the reference pickles it (whole modules under ``models.yolo``)."""
    sys.path.insert(0, str(Path(reference.__file__).parent))
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    finally:
        sys.path.remove(str(Path(reference.__file__).parent))


@pytest.fixture(scope="module")
def official(reference):
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"weights not found at {YOLOV5N_WEIGHTS}")
    return _load_official(reference, YOLOV5N_WEIGHTS)


@pytest.fixture(scope="module")
def perturbed_weights(reference, official, tmp_path_factory) -> Path:
    """yolov5n with every weight scaled by 1 + 5% noise, saved in the official ``.pt`` format: a second,
    different model of the same classes that both implementations read."""
    ckpt = dict(official)
    model = _load_official(reference, YOLOV5N_WEIGHTS)["model"].float()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + 0.05 * torch.randn(p.shape, generator=generator))
    ckpt["model"] = model.half()
    path = tmp_path_factory.mktemp("perturbed") / "yolov5n-perturbed.pt"
    torch.save(ckpt, path)
    return path


def _ours(official) -> Yolov5:
    model = Yolov5("n", num_classes=80)
    model.load_state_dict(official["model"].float().state_dict())
    names = official["model"].names
    model.names = list(names.values()) if isinstance(names, dict) else list(names)
    return model.eval()


def test_augmented_predictions_equal_the_references(official):
    reference_model = official["model"].float().eval()
    ours = AugmentedDetector(_ours(official))
    imgs = torch.rand(2, 3, 256, 320, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = reference_model(imgs, augment=True)[0]
        got = ours(imgs)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-3)


def test_scaled_images_are_padded_to_the_stride_with_grey():
    imgs = torch.zeros(1, 3, 64, 96)
    scaled = scale_images(imgs, 0.67, 32)
    # 64 x 96 at 0.67: 42 x 64 pixels of image (truncated), padded to ceil(42.88 / 32) x ceil(64.32 / 32) strides
    assert scaled.shape == (1, 3, 64, 96)
    assert torch.all(scaled[:, :, 42:] == 0.447) and torch.all(scaled[..., 64:] == 0.447)
    assert torch.all(scaled[:, :, :42, :64] == 0)
    assert scale_images(imgs, 1.0, 32) is imgs


def _reference_val(reference, monkeypatch, data: Path, out: Path, weights, augment: bool):
    """The reference ``val.run`` (offline, unlimited NMS time) on ``data``: P, R, mAP50, mAP50-95, and its
    COCO json detections."""
    import yolov5.utils.general as general
    import yolov5.val as reference_val_module

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    monkeypatch.setattr(np, "trapz", np.trapezoid, raising=False)
    monkeypatch.setattr(general, "check_font", lambda *a, **k: None)
    monkeypatch.setattr(general, "time", types.SimpleNamespace(time=lambda: 0.0))
    (mp, mr, map50, map_, *_), _, _, _ = reference_val_module.run(
        data=str(data), weights=weights, imgsz=IMG_SIZE, batch_size=32, device="cpu", workers=0, plots=False,
        half=False, augment=augment, save_json=True, project=str(out), name="ref")
    return (mp, mr, map50, map_), json.loads(next((out / "ref").glob("*_predictions.json")).read_text())


def _assert_equal_to_the_references(ours, our_dir: Path, reference_result) -> None:
    """Our metrics within the parity tolerances of the reference's, and each of its detections (COCO json,
    original pixels) one of ours: same class and score, the box within test_eval_val's pixel slack."""
    reference_metrics, reference_detections = reference_result
    tolerances = (TOLERANCE, TOLERANCE, TOLERANCE, MAP50_95_TOLERANCE_16)
    for name, a, b, tol in zip(("P", "R", "mAP50", "mAP50-95"), (ours.mp, ours.mr, ours.map50, ours.map),
                               reference_metrics, tolerances):
        assert abs(a - b) <= tol, f"{name}: ours {a:.4f}, reference {b:.4f}"
    our_by_image = by_image(json.loads((our_dir / "predictions.json").read_text()))
    reference_by_image = by_image(reference_detections)
    assert our_by_image.keys() == reference_by_image.keys()
    xyxy = lambda b: np.concatenate((b[:, :2], b[:, :2] + b[:, 2:4]), 1)  # noqa: E731
    for image_id, r in reference_by_image.items():
        o = our_by_image[image_id]
        assert abs(len(o) - len(r)) <= 1  # a score on the conf threshold may tip either way
        o, r = o[o[:, 4] > 0.002], r[r[:, 4] > 0.002]
        close = ((np.abs(xyxy(o)[None] - xyxy(r)[:, None]) <= 1.0 + 0.004 * np.abs(xyxy(r)[:, None])).all(2)
                 & (np.abs(o[None, :, 4] - r[:, None, 4]) <= 1e-4) & (o[None, :, 5] == r[:, None, 5]))
        assert close.any(1).all(), f"image {image_id}: {int((~close.any(1)).sum())} reference detections unmatched"


def _our_val(weights, data: Path, save_dir: Path | None = None, **options):
    return val(weights, data, img_size=IMG_SIZE, device="cpu", workers=0, half=False, plots=False, verbose=False,
               save_dir=save_dir, save_json=save_dir is not None, reduced_decode=False, **options)


def test_val_augment_equals_the_references(reference, official, coco128, monkeypatch, tmp_path):
    data = coco128_subset(tmp_path / "data", IMAGES, coco128)
    expected = _reference_val(reference, monkeypatch, data, tmp_path, str(YOLOV5N_WEIGHTS), augment=True)
    ours = _our_val(str(YOLOV5N_WEIGHTS), data, tmp_path / "ours", augment=True)
    _assert_equal_to_the_references(ours, tmp_path / "ours", expected)
    plain = _our_val(str(YOLOV5N_WEIGHTS), data)
    assert (ours.mp, ours.mr, ours.map) != (plain.mp, plain.mr, plain.map)  # the augmentation did something


@pytest.mark.parametrize("augment", [False, True], ids=["ensemble", "ensemble+augment"])
def test_val_ensemble_equals_the_references(reference, perturbed_weights, coco128, monkeypatch, tmp_path, augment):
    data = coco128_subset(tmp_path / "data", IMAGES, coco128)
    weights = [str(YOLOV5N_WEIGHTS), str(perturbed_weights)]
    expected = _reference_val(reference, monkeypatch, data, tmp_path, weights, augment=augment)
    ours = _our_val(weights, data, tmp_path / "ours", augment=augment)
    _assert_equal_to_the_references(ours, tmp_path / "ours", expected)
    single = _our_val(str(YOLOV5N_WEIGHTS), data, augment=augment)
    assert (ours.mp, ours.mr, ours.map) != (single.mp, single.mr, single.map)  # both models count


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path, Path]:
    """Two random-init two-class checkpoints of the shapes classes and a two-image shapes dataset's YAML."""
    from yolotrain.data import generate_shapes_dataset

    root = tmp_path_factory.mktemp("tiny")
    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = Yolov5("n", num_classes=2).eval()
        model.names = ["circle", "rectangle"]
        paths.append(save_checkpoint(root / "weights" / f"tiny{seed}", model))
    data = generate_shapes_dataset(root=root / "shapes", n_train=2, n_val=2, img_size=64) / "data.yaml"
    return paths[0], paths[1], data


def test_predict_ensemble_merges_the_models_predictions(tiny):
    """An ensemble's detections are the NMS of its members' predictions concatenated (the reference's)."""
    first, second, data = tiny
    image = (np.random.default_rng(0).random((64, 96, 3)) * 255).astype(np.uint8)
    options = {"conf": 0.0, "iou": 0.5, "img_size": 64, "device": "cpu", "half": False}
    results = predict([str(first), str(second)], image, **options)
    assert len(results) == 1 and len(results[0].scores) > 0

    from yolotrain.eval.inference import load_inference_model
    from yolotrain.nms import non_max_suppression
    from yolotrain.prediction.run import prepare_image

    ensemble, _ = load_inference_model([str(first), str(second)], "cpu", half=False)
    assert isinstance(ensemble, EnsembleDetector)
    members = [load_inference_model(str(w), "cpu", half=False)[0] for w in (first, second)]
    rgb, _, _ = prepare_image(image, 64, 32, False)
    x = torch.from_numpy(rgb).permute(2, 0, 1)[None].float() / 255
    with torch.inference_mode():
        merged = torch.cat([m(x) for m in members], 1)
        expected = non_max_suppression(merged, 0.0, 0.5, max_det=1000)[0]
    assert torch.allclose(results[0].scores, expected[:, 4].cpu())


def test_commands_run_augment_and_ensembles(tiny, tmp_path, monkeypatch, capsys):
    first, second, data = tiny
    monkeypatch.chdir(tmp_path)
    assert main(["val", "--weights", str(first), str(second), "--data", str(data), "--augment", "--imgsz", "64",
                 "--device", "cpu", "--workers", "0", "--no-plots"]) in (0, 1)
    assert (tmp_path / "runs" / "val" / "exp" / "metrics.json").is_file()
    image = tmp_path / "x.png"
    import cv2

    cv2.imwrite(str(image), np.full((64, 64, 3), 128, np.uint8))
    assert main(["predict", "--weights", str(first), str(second), "--source", str(image), "--augment",
                 "--imgsz", "64", "--device", "cpu", "--conf-thres", "0"]) == 0
    predictions = json.loads((tmp_path / "runs" / "predict" / "exp" / "predictions.json").read_text())
    assert len(predictions) == 1


def test_yolo_val_and_predict_take_augment(tiny, tmp_path, monkeypatch):
    first, _, data = tiny
    monkeypatch.chdir(tmp_path)
    options = {"img_size": 64, "device": "cpu", "workers": 0, "half": False, "plots": False, "conf": 0.0}

    def detections(run, **more) -> list[torch.Tensor]:
        found: list[torch.Tensor] = []
        run(callbacks={"on_val_image_end": lambda path, det: found.append(det.clone())}, **options, **more)
        return found

    through_yolo = detections(YOLO(str(first)).val, data=str(data), augment=True)
    direct = detections(lambda **kw: val(str(first), data, verbose=False, **kw), augment=True)
    plain = detections(lambda **kw: val(str(first), data, verbose=False, **kw))
    assert all(torch.equal(a, b) for a, b in zip(through_yolo, direct, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(direct, plain, strict=True))
    image = np.full((64, 64, 3), 128, np.uint8)
    plain = YOLO(str(first)).predict(image, img_size=64, device="cpu", conf=0.0)[0]
    augmented = YOLO(str(first)).predict(image, img_size=64, device="cpu", conf=0.0, augment=True)[0]
    assert not torch.equal(plain.scores, augmented.scores)


@pytest.mark.parametrize(("options", "message"), [
    (["--weights", "a.pt", "b.onnx"], "an ensemble (several --weights) runs PyTorch models (checkpoints, official "
                                      ".pt) side by side: b.onnx is an export; give its checkpoint or .pt"),
])
def test_an_export_in_an_ensemble_is_one_line(options, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for command, rest in (("val", ["--data", "data.yaml"]), ("predict", ["--source", "x.jpg"])):
        assert main([command, *options, *rest]) == 1
        err = capsys.readouterr().err.strip()
        assert err == f"yolotrain {command}: error: {message}"
    assert not any(tmp_path.iterdir())


def test_ensembles_of_other_classes_are_one_line(tiny, tmp_path):
    first, _, data = tiny
    other = Yolov5("n", num_classes=3).eval()
    other.names = ["circle", "rectangle", "triangle"]
    with pytest.raises(ValueError, match=r"^an ensemble's models must predict the same classes: "
                                         r".*tiny0\.json predicts 2 \(circle, rectangle\), "
                                         r"the Yolov5 given 3 \(circle, rectangle, triangle\)$"):
        val([str(first), other], data, device="cpu", workers=0, verbose=False)


@pytest.mark.parametrize(("model", "message"), [
    (lambda: Yolov5("n", 2, task="segment"), "--augment is not supported for segmentation models"),
    (lambda: Classifier.from_name("yolov5n-cls", 2, ["circle", "rectangle"]),
     "--augment: the reference's classification has no test-time augmentation"),
])
def test_augment_of_segmentation_and_classification_models_is_one_line(model, message, tiny):
    with pytest.raises(ValueError, match=f"^{message}"):
        predict(model(), np.zeros((64, 64, 3), np.uint8), augment=True, device="cpu")


@pytest.mark.parametrize(("member", "message"), [
    (lambda: Yolov5("n", 2, task="segment"), "is a segmentation model"),
    (lambda: Classifier.from_name("yolov5n-cls", 2, ["circle", "rectangle"]), "is a classifier"),
])
def test_ensembles_of_segmentation_and_classification_models_are_one_line(member, message):
    with pytest.raises(ValueError, match=f"^an ensemble \\(several --weights\\) merges detection models' boxes: "
                                         f"the .* given {message}$"):
        predict([member(), member()], np.zeros((64, 64, 3), np.uint8), device="cpu")
