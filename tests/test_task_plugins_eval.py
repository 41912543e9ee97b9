"""Evaluation and prediction ask the task (tasks/<task>/evaluate.py) what the old task branches decided."""

from __future__ import annotations

import sys
import types

import pytest

from yolotrain import task as task_registry
from yolotrain.eval.inference import _check_ensemble_member, _check_wrappable
from yolotrain.task import get_task
from yolotrain.tasks.detect import DetectTask


class Carrier:
    """A model in name only: what the refusals read of it."""

    end_to_end = False

    def __init__(self, task: str) -> None:
        self.task = task


def test_each_task_refuses_the_options_it_has_no_meaning_for():
    detect, segment, classify = (get_task(name) for name in ("detect", "segment", "classify"))
    assert detect.augment_refusal("a.pt") is None and detect.ensemble_refusal("a.pt") is None
    assert segment.augment_refusal("a.pt") == ("--augment is not supported for segmentation models (the "
                                               "reference's loses the prototype masks); a.pt is one")
    assert classify.augment_refusal("a.pt") == ("--augment: the reference's classification has no test-time "
                                                "augmentation; a.pt is a classifier")
    assert segment.ensemble_refusal("a.pt").endswith("a.pt is a segmentation model")
    assert classify.ensemble_refusal("a.pt").endswith("a.pt is a classifier")
    assert detect.track_refusal("a.pt") is None and segment.track_refusal("a.pt") is None
    assert classify.track_refusal("a.pt").startswith("track follows detected boxes from frame to frame: a.pt is")


def test_a_segmentation_export_with_nms_inside_is_refused_by_its_task():
    model = Carrier("segment")
    model.end_to_end = True
    with pytest.raises(ValueError, match="^a segmentation export with NMS inside has no mask coefficients"):
        get_task("segment").check_inference(model)
    get_task("detect").check_inference(Carrier("detect"))  # boxes from an export with NMS inside run


def test_only_a_tasks_own_pytorch_model_is_readied_for_inference():
    assert not any(get_task(name).is_pytorch_model(Carrier(name)) for name in ("detect", "segment", "classify"))


def test_a_new_task_is_asked_without_editing_the_shared_code(monkeypatch):
    class PoseTask(DetectTask):
        name = "pose"

        def augment_refusal(self, name: str) -> str | None:
            return f"--augment: no keypoint augmentation for {name}"

        def ensemble_refusal(self, name: str) -> str | None:
            return f"{name}: keypoints are not merged"

    package = types.ModuleType("pose_task_package")
    package.TASK = PoseTask()
    monkeypatch.setitem(sys.modules, "pose_task_package", package)
    monkeypatch.setitem(task_registry.TASK_PACKAGES, "pose", "pose_task_package")
    get_task.cache_clear()
    try:
        with pytest.raises(ValueError, match="^--augment: no keypoint augmentation for p.pt$"):
            _check_wrappable(Carrier("pose"), "p.pt", "--augment")
        with pytest.raises(ValueError, match="^p.pt: keypoints are not merged$"):
            _check_ensemble_member(Carrier("pose"), "p.pt")
    finally:
        get_task.cache_clear()
