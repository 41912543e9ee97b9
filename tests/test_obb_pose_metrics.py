"""Rotated-box and keypoint metrics (eval/obb.py, eval/pose.py) against ultralytics 8's OBBValidator + OBBMetrics and
PoseValidator + PoseMetrics (the oracle): the same detections and labels, image by image, give the same P, R, mAP50
and mAP50-95."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import offline_ultralytics

from yolotrain.eval.metrics import YOLOV5_SCORING, Metrics
from yolotrain.eval.obb import RotatedDetectionStats
from yolotrain.eval.pose import COCO_KEYPOINT_SIGMAS, PoseStats, keypoint_oks, oks_sigmas

NC = 3
NAMES = ["a", "b", "c"]


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    with offline_ultralytics(tmp_path_factory):
        from ultralytics.models.yolo.obb import OBBValidator
        from ultralytics.models.yolo.pose import PoseValidator
        from ultralytics.utils.metrics import OKS_SIGMA, OBBMetrics, PoseMetrics, kpt_iou

        folder = tmp_path_factory.mktemp("validators")
        yield SimpleNamespace(obb=OBBValidator(save_dir=folder, args=dict(plots=False)),
                              pose=PoseValidator(save_dir=folder, args=dict(plots=False)),
                              obb_metrics=OBBMetrics, pose_metrics=PoseMetrics, kpt_iou=kpt_iou, coco_sigmas=OKS_SIGMA)


def scores_and_classes(generator: torch.Generator, gt_cls: torch.Tensor, n_true: int, n_false: int):
    """Scores (descending) of ``n_true`` detections of labels (mostly of their class) then ``n_false`` others, mixed."""
    cls = torch.cat((gt_cls[:n_true], torch.randint(0, NC, (n_false,), generator=generator).float()))
    wrong = torch.rand(len(cls), generator=generator) < 0.1
    cls = torch.where(wrong, (cls + 1) % NC, cls)
    scores = torch.rand(len(cls), generator=generator)
    return scores, cls


def rotated_images(seed: int, images: int = 8):
    """Per image: labels (xywhr, class) and detections [n, 7] sorted by score: jittered copies of most labels (some
    twice), random boxes; one image without labels, one without detections."""
    generator = torch.Generator().manual_seed(seed)
    for index in range(images):
        m = 0 if index == 1 else int(torch.randint(3, 12, (1,), generator=generator))
        gt = torch.cat((torch.rand(m, 2, generator=generator) * 400, 10 + torch.rand(m, 2, generator=generator) * 60,
                        (torch.rand(m, 1, generator=generator) - 0.25) * math.pi), 1)
        gt_cls = torch.randint(0, NC, (m,), generator=generator).float()
        copies = torch.cat((torch.arange(m), torch.arange(m // 3)))
        true = gt[copies] + torch.randn(len(copies), 5, generator=generator) * torch.tensor([3.0, 3, 4, 4, 0.15])
        false = torch.cat((torch.rand(5, 2, generator=generator) * 400, 10 + torch.rand(5, 2, generator=generator) * 60,
                           torch.rand(5, 1, generator=generator) * math.pi), 1)
        boxes = torch.cat((true, false))[: 0 if index == 2 else None]
        scores, cls = scores_and_classes(generator, gt_cls[copies], len(copies), 5)
        det = torch.cat((boxes[:, :4], scores[: len(boxes), None], cls[: len(boxes), None], boxes[:, 4:]), 1)
        yield det[det[:, 4].argsort(descending=True)], gt, gt_cls


def their_stats(tp: dict, det_cls: torch.Tensor, scores: torch.Tensor, gt_cls: torch.Tensor, index: int) -> dict:
    """What ultralytics' DetectionValidator.update_metrics gives its metrics for one image."""
    cls = gt_cls.numpy()
    return {**tp, "target_cls": cls, "target_img": np.unique(cls), "conf": scores.numpy(),
            "pred_cls": det_cls.numpy(), "im_name": f"{index}.jpg"}


def assert_same_results(ours: Metrics, theirs) -> None:
    np.testing.assert_allclose([ours.mp, ours.mr, ours.map50, ours.map], theirs.mean_results(), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(ours.classes, theirs.ap_class_index)


@pytest.mark.parametrize("seed", range(3))
def test_rotated_metrics_equal_the_oracles(oracle, seed):
    ours, theirs = RotatedDetectionStats(NC), oracle.obb_metrics(names=dict(enumerate(NAMES)))
    for index, (det, gt, gt_cls) in enumerate(rotated_images(seed)):
        ours.update(det, gt, gt_cls)
        predictions = {"cls": det[:, 5], "bboxes": torch.cat((det[:, :4], det[:, 6:]), 1), "conf": det[:, 4]}
        tp = oracle.obb._process_batch(predictions, {"cls": gt_cls, "bboxes": gt})
        theirs.update_stats(their_stats(tp, det[:, 5], det[:, 4], gt_cls, index))
    theirs.process()
    metrics = ours.compute(NAMES)
    assert 0.05 < metrics.map < metrics.map50 < 1
    assert_same_results(metrics, theirs.box)
    np.testing.assert_array_equal(metrics.instances, theirs.nt_per_class)


def test_rotated_matching_uses_the_angle():
    """A detection on its label's centre and sides but turned a quarter turn is a false positive; unturned, a hit."""
    gt = torch.tensor([[50.0, 50, 60, 10, 0.3]])
    turned = torch.tensor([[50.0, 50, 60, 10, 0.9, 0, 0.3 + math.pi / 2]])
    aligned = torch.tensor([[50.0, 50, 60, 10, 0.9, 0, 0.3 + math.pi]])  # the same rectangle
    for det, hit in ((turned, False), (aligned, True)):
        stats = RotatedDetectionStats(1, rules=YOLOV5_SCORING)
        stats.update(det, gt, torch.zeros(1))
        assert (stats.compute(["a"]).map50 > 0.99) is hit


def pose_images(seed: int, sigmas: torch.Tensor, images: int = 8):
    """Per image: labels (xyxy boxes, classes, keypoints [m, K, 3] with visibility 0/1/2) and detections [n, 6]
    sorted by score with keypoints [n, K, 3]: jittered copies of most labels (some twice), random others; one image
    without labels, one without detections. Keypoints move by about their OKS scale (from near hits to misses)."""
    generator = torch.Generator().manual_seed(seed)
    num_keypoints = len(sigmas)
    for index in range(images):
        m = 0 if index == 1 else int(torch.randint(3, 10, (1,), generator=generator))
        corner = torch.rand(m, 2, generator=generator) * 300
        size = 20 + torch.rand(m, 2, generator=generator) * 80
        gt = torch.cat((corner, corner + size), 1)
        gt_cls = torch.randint(0, NC, (m,), generator=generator).float()
        inside = torch.rand(m, num_keypoints, 2, generator=generator)
        visibility = torch.randint(0, 3, (m, num_keypoints, 1), generator=generator).float()
        gt_keypoints = torch.cat((corner[:, None] + inside * size[:, None], visibility), 2)
        copies = torch.cat((torch.arange(m), torch.arange(m // 3)))
        scale = size[copies].mean(1)[:, None]
        boxes = gt[copies] + torch.randn(len(copies), 4, generator=generator) * scale * 0.05
        keypoints = gt_keypoints[copies].clone()
        noise = torch.randn(len(copies), num_keypoints, 2, generator=generator) * sigmas[:, None].float()
        keypoints[..., :2] += noise * scale[..., None] * 0.7
        keypoints[..., 2] = torch.rand(len(copies), num_keypoints, generator=generator)
        false_corner = torch.rand(4, 2, generator=generator) * 300
        boxes = torch.cat((boxes, torch.cat((false_corner, false_corner + 50), 1)))[: 0 if index == 2 else None]
        keypoints = torch.cat((keypoints, torch.rand(4, num_keypoints, 3, generator=generator) * 300))
        keypoints = keypoints[: len(boxes)]
        scores, cls = scores_and_classes(generator, gt_cls[copies], len(copies), 4)
        det = torch.cat((boxes, scores[: len(boxes), None], cls[: len(boxes), None]), 1)
        order = det[:, 4].argsort(descending=True)
        yield det[order], keypoints[order], gt, gt_cls, gt_keypoints


@pytest.mark.parametrize(("num_keypoints", "seed"), [(17, 0), (17, 1), (5, 2)])
def test_pose_metrics_equal_the_oracles(oracle, num_keypoints, seed):
    sigmas = oks_sigmas(num_keypoints, 3)
    oracle.pose.sigma = oracle.coco_sigmas if num_keypoints == 17 else np.ones(num_keypoints) / num_keypoints
    ours, theirs = PoseStats(NC, sigmas), oracle.pose_metrics(names=dict(enumerate(NAMES)))
    for index, (det, keypoints, gt, gt_cls, gt_keypoints) in enumerate(pose_images(seed, sigmas)):
        ours.update_keypoints(det, gt, gt_cls, keypoints, gt_keypoints)
        predictions = {"cls": det[:, 5], "bboxes": det[:, :4], "conf": det[:, 4], "keypoints": keypoints}
        tp = oracle.pose._process_batch(predictions, {"cls": gt_cls, "bboxes": gt, "keypoints": gt_keypoints})
        theirs.update_stats(their_stats(tp, det[:, 5], det[:, 4], gt_cls, index))
    theirs.process()
    metrics = ours.compute(NAMES)
    assert 0.05 < metrics.keypoints.map < metrics.keypoints.map50 < 1
    assert_same_results(metrics, theirs.box)
    assert_same_results(metrics.keypoints, theirs.pose)


def test_keypoint_oks_equals_the_oracles_kpt_iou(oracle):
    generator = torch.Generator().manual_seed(3)
    gt = torch.cat((torch.rand(6, 17, 2, generator=generator) * 100,
                    torch.randint(0, 3, (6, 17, 1), generator=generator).float()), 2)
    gt[0, :, 2] = 0  # a label without labelled keypoints: OKS 0
    predictions = gt[torch.tensor([0, 1, 2, 3, 4, 5, 1, 2])] + torch.randn(8, 17, 3, generator=generator)
    areas = 1000 + torch.rand(6, generator=generator) * 2000
    oks = keypoint_oks(gt, predictions, areas, COCO_KEYPOINT_SIGMAS)
    torch.testing.assert_close(oks, oracle.kpt_iou(gt, predictions, areas, oracle.coco_sigmas), rtol=0, atol=0)
    assert oks.shape == (6, 8) and (oks[0] == 0).all() and (oks.diagonal()[1:] > 0.5).all()
    torch.testing.assert_close(keypoint_oks(gt, predictions[..., :2], areas, COCO_KEYPOINT_SIGMAS), oks)


def test_keypoints_without_visibility_all_count_and_default_scales():
    """Labels ``[m, K, 2]`` count every keypoint, as labels whose visibility is never 0; the scales are COCO's for
    17 keypoints with visibility only."""
    generator = torch.Generator().manual_seed(4)
    gt = torch.rand(3, 4, 2, generator=generator) * 50
    predictions = gt + torch.randn(3, 4, 2, generator=generator)
    areas, sigmas = torch.full((3,), 400.0), oks_sigmas(4, 2)
    visible = torch.cat((gt, torch.full((3, 4, 1), 2.0)), 2)
    torch.testing.assert_close(keypoint_oks(gt, predictions, areas, sigmas), keypoint_oks(visible, predictions, areas,
                                                                                          sigmas))
    torch.testing.assert_close(sigmas, torch.full((4,), 0.25, dtype=torch.float64))
    torch.testing.assert_close(oks_sigmas(17, 3), COCO_KEYPOINT_SIGMAS)
    assert oks_sigmas(17, 2)[0] == 1 / 17


def test_pose_results_table_and_summary_carry_the_keypoints():
    stats = PoseStats(1, oks_sigmas(2, 3))
    gt = torch.tensor([[10.0, 10, 50, 90]])
    keypoints = torch.tensor([[[20.0, 30, 2], [40, 70, 2]]])
    stats.update_keypoints(torch.tensor([[10.0, 10, 50, 90, 0.9, 0]]), gt, torch.zeros(1), keypoints, keypoints)
    stats.update_keypoints(torch.tensor([[10.0, 10, 50, 90, 0.8, 0]]), gt, torch.zeros(1),
                           keypoints + torch.tensor([60.0, 60, 0]), keypoints)
    metrics = stats.compute(["person"])
    assert metrics.map50 == pytest.approx(0.995) and metrics.keypoints.map50 == pytest.approx(0.5, abs=0.01)
    assert metrics.masks is None
    assert "Pose(P" in metrics.table().splitlines()[0] and "Mask(P" not in metrics.table()
    summary = metrics.as_dict()
    assert summary["pose_mAP50"] == metrics.keypoints.map50 and "mask_mAP50" not in summary
    assert metrics.fitness() == pytest.approx(0.1 * metrics.map50 + 0.9 * metrics.map + metrics.keypoints.fitness())
