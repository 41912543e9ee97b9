"""The engine asks each task how to train it: each task answers as the engine's old branches did, and a task
added to the registry is reached without editing the engine."""

from __future__ import annotations

import sys
import types

import torch

from yolotrain import task as registry
from yolotrain.data.batch import Batch
from yolotrain.data.segment import SegmentBatch
from yolotrain.engine.config import TrainConfig, resolve_config
from yolotrain.engine.loggers import TAGS
from yolotrain.task import get_task
from yolotrain.tasks.detect import DetectTask


def test_each_task_declares_its_results_columns_and_tags():
    detect, segment, classify = (get_task(n) for n in ("detect", "segment", "classify"))
    assert detect.result_columns == ("precision", "recall", "mAP50", "mAP50-95")
    assert segment.result_columns == ("precision", "recall", "mAP50", "mAP50-95", "mask_precision", "mask_recall",
                                      "mask_mAP50", "mask_mAP50-95")
    assert classify.result_columns == ("top1", "top5")
    assert segment.logger_tags["mask_mAP50-95"] == "metrics/mAP_0.5:0.95(M)"
    assert classify.logger_tags["top1"] == "metrics/accuracy_top1"
    for task, parts in ((detect, ("box", "obj", "cls", "dfl")), (segment, ("box", "seg", "obj", "cls", "dfl")),
                        (classify, ("loss",))):  # every column a task validates, and its losses' parts, has its tag
        assert set(task.result_columns) | {f"{split}_{p}" for p in parts for split in ("train", "val")} \
            <= set(task.logger_tags)
        assert all(TAGS[c] == t for c, t in task.logger_tags.items())


def test_each_task_makes_the_summary_line_of_its_validation():
    boxes = types.SimpleNamespace(mp=0.5, mr=0.25, map50=0.125, map=0.0625, masks=None, loss=None)
    masks = types.SimpleNamespace(mp=0.1, mr=0.2, map50=0.3, map=0.4)
    assert get_task("detect").result_summary(boxes) == "P 0.500  R 0.250  mAP50 0.125  mAP50-95 0.062"
    with_masks = types.SimpleNamespace(**{**vars(boxes), "masks": masks, "loss": {"box": 1.0, "seg": 2.0}})
    assert get_task("segment").result_summary(with_masks).endswith("  mask mAP50 0.300  mAP50-95 0.400")
    assert get_task("segment").result_values(with_masks) == {
        "precision": 0.5, "recall": 0.25, "mAP50": 0.125, "mAP50-95": 0.0625, "mask_precision": 0.1,
        "mask_recall": 0.2, "mask_mAP50": 0.3, "mask_mAP50-95": 0.4, "val_box": 1.0, "val_seg": 2.0}
    accuracy = types.SimpleNamespace(top1=0.75, top5=1.0, loss=0.5)
    assert get_task("classify").result_summary(accuracy) == "top1 0.750  top5 1.000  loss 0.5000"


def test_a_segmentation_batch_gives_the_criterion_its_masks():
    imgs, rows, masks = torch.zeros(2, 3, 32, 32), torch.zeros(3, 6), torch.ones(2, 8, 8)
    device = torch.device("cpu")
    assert len(get_task("detect").training_targets(Batch(imgs, rows), device)) == 1
    targets = get_task("segment").training_targets(SegmentBatch(imgs, rows, [], [], masks), device)
    assert len(targets) == 2 and targets[1] is masks


def test_the_recipe_follows_the_task_that_claims_the_model_or_the_data(tmp_path):
    assert TrainConfig(model="yolov5n").task == "detect"
    assert TrainConfig(model="yolov5s-cls").task == "classify"
    for split in ("train", "val"):
        (tmp_path / split / "cat").mkdir(parents=True)
        (tmp_path / split / "cat" / "0.jpg").write_bytes(b"")
    assert TrainConfig(model="yolov5n").task == "detect"
    classify = resolve_config(None, model="yolov5n", data=str(tmp_path))
    assert classify.task == "classify" and classify.data.img_size == 224 and classify.optim.warmup_epochs == 0
    assert classify.optim.nominal_batch == classify.data.batch_size


class _PoseTraining:
    """A task that claims the names ending in -pose and trains at 96 px."""

    def claims_model_name(self, model: str) -> bool:
        return model.endswith("-pose")

    def training_defaults(self, data: str | None) -> dict:
        return {**super().training_defaults(data), "data.img_size": 96}


class PoseTask(_PoseTraining, DetectTask):
    name = "pose"


def test_a_registered_task_is_asked_without_editing_the_engine(monkeypatch):
    package = types.ModuleType("yolotrain_test_pose")
    package.TASK = PoseTask()
    monkeypatch.setitem(sys.modules, "yolotrain_test_pose", package)
    monkeypatch.setitem(registry.TASK_PACKAGES, "pose", "yolotrain_test_pose")
    registry.get_task.cache_clear()
    try:
        config = resolve_config(None, model="yolov5n-pose")
        assert config.task == "pose" and config.data.img_size == 96 and config.epochs == 30
    finally:
        registry.get_task.cache_clear()
