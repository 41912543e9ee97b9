"""Models, the command line and the YOLO object ask heads and tasks, not task names: heads declare the task
their outputs serve, each task answers which PyTorch models and model YAML names are its own, and a new task
registered by name is reached without editing the shared code. Detection results' boxes answer YOLO
tooling's attribute names while staying the tensor they were."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import sys
import types

import pytest
import torch

from yolotrain import task as task_registry
from yolotrain.model import Detect, Segment, Yolov5
from yolotrain.model.classify import Classifier
from yolotrain.model.spec import published_variant
from yolotrain.prediction.run import Result
from yolotrain.task import get_task, task_of
from yolotrain.tasks.detect import DetectTask
from yolotrain.yolo import _published_name


def test_a_model_is_of_its_heads_task():
    assert (Detect.task, Detect.nm, Segment.task) == ("detect", 0, "segment")
    detector, segmenter = Yolov5("n", num_classes=2), Yolov5("n", num_classes=2, task="segment")
    assert (detector.task, detector.num_masks, detector.num_protos) == ("detect", 0, 0)
    assert (segmenter.task, segmenter.num_masks) == ("segment", segmenter.head.nm) and segmenter.num_masks > 0
    assert (detector.arch_name, segmenter.arch_name) == ("yolov5n", "yolov5n-seg")


def test_the_published_variant_of_a_task_is_the_one_whose_head_serves_it():
    assert [published_variant(v, t) for v, t in (("n", "segment"), ("n", "detect"), ("s-seg", "segment"),
                                                 ("s6", "detect"))] == ["n-seg", "n", "s-seg", "s6"]
    with pytest.raises(ValueError, match="^no published segmentation model of the P6 layout yolov5n6$"):
        published_variant("n6", "segment")


@pytest.mark.parametrize("name, model, own", [
    ("detect", lambda: Yolov5("n", num_classes=2), True),
    ("segment", lambda: Yolov5("n", num_classes=2, task="segment"), True),
    ("classify", lambda: Classifier.from_name("yolov5n-cls", 3), True),
    ("classify", lambda: Yolov5("n", num_classes=2), False),
    ("detect", lambda: object(), False),
])
def test_each_task_knows_its_pytorch_models(name, model, own):
    assert get_task(name).is_pytorch_model(model()) is own


def test_each_task_names_its_published_model_yamls():
    answers = {name: [get_task(name).names_model_yaml(stem) for stem in
                      ("yolov5s", "yolov5s6", "yolov5s-seg", "yolov5n-cls", "resnet18", "mine")]
               for name in ("detect", "segment", "classify")}
    assert answers == {"detect": [True, True, False, False, False, False],
                       "segment": [False, False, True, False, False, False],
                       "classify": [False, False, False, True, False, False]}


def test_a_new_task_is_asked_without_editing_the_shared_code(monkeypatch, tmp_path):
    class PoseTask(DetectTask):
        name = "pose"

        def names_model_yaml(self, stem: str) -> bool:
            return stem == "yolov5n-pose"

    package = types.ModuleType("pose_task_package")
    package.TASK = PoseTask()
    monkeypatch.setitem(sys.modules, "pose_task_package", package)
    monkeypatch.setitem(task_registry.TASK_PACKAGES, "pose", "pose_task_package")
    task_registry.get_task.cache_clear()
    try:
        monkeypatch.chdir(tmp_path)
        assert _published_name("yolov5n-pose.yaml") == "yolov5n-pose"
        assert _published_name("other.yaml") == "other.yaml"
    finally:
        task_registry.get_task.cache_clear()


def _result() -> Result:
    return Result("a.jpg", torch.tensor([[0.0, 0.0, 10.0, 20.0], [1.0, 2.0, 3.0, 4.0]]), torch.tensor([0.9, 0.5]),
                  torch.tensor([1, 0]), ["a", "b"], (32, 32))


def test_result_boxes_answer_yolo_tooling_names():
    boxes = _result().boxes
    torch.testing.assert_close(boxes.xyxy, torch.tensor([[0.0, 0.0, 10.0, 20.0], [1.0, 2.0, 3.0, 4.0]]))
    torch.testing.assert_close(boxes.xywh, torch.tensor([[5.0, 10.0, 10.0, 20.0], [2.0, 3.0, 2.0, 2.0]]))
    torch.testing.assert_close(boxes.conf, torch.tensor([0.9, 0.5]))
    assert boxes.cls.tolist() == [1, 0] and boxes.cls.dtype == torch.long
    torch.testing.assert_close(boxes.data, torch.tensor([[0.0, 0.0, 10.0, 20.0, 0.9, 1.0],
                                                         [1.0, 2.0, 3.0, 4.0, 0.5, 0.0]]))


def test_result_boxes_stay_the_tensor_they_were():
    result = _result()
    boxes = result.boxes
    assert isinstance(boxes, torch.Tensor) and boxes.shape == (2, 4) and len(boxes) == 2
    assert boxes.tolist() == [[0.0, 0.0, 10.0, 20.0], [1.0, 2.0, 3.0, 4.0]] and boxes.numpy().shape == (2, 4)
    assert type(boxes[0]) is torch.Tensor and type(boxes.double()) is torch.Tensor  # operations: plain tensors
    assert result.to_dict()["detections"][0]["box"] == [0.0, 0.0, 10.0, 20.0]
    for copied in (copy.deepcopy(result), pickle.loads(pickle.dumps(result)), dataclasses.replace(result, image=None)):
        torch.testing.assert_close(copied.boxes.data, boxes.data)
    empty = Result("b.jpg", torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.long), ["a"], (8, 8))
    assert empty.boxes.data.shape == (0, 6) and empty.boxes.xywh.shape == (0, 4)


def test_task_of_a_model_answers_for_it():
    model = Classifier.from_name("yolov5n-cls", 3)
    assert task_of(model).is_pytorch_model(model) and model.arch_name == "yolov5n-cls"
