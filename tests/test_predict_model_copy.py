"""``predict`` on a model in memory runs an inference copy of it (fused, eval, its own precision), made once and
given again while the model's weights are unchanged: what a program predicting frame by frame relies on, and what
must never run stale weights."""

from pathlib import Path

import cv2
import pytest
import torch
from conftest import untrained

from yolotrain.prediction import Predictor, predict


@pytest.fixture(scope="module")
def image(tiny_data: Path) -> Path:
    return sorted((tiny_data.parent / "images" / "val").glob("*.jpg"))[0]


def boxes(model: torch.nn.Module, image: Path, **settings) -> torch.Tensor:
    return predict(model, image, img_size=64, device="cpu", conf=0.001, half=False, **settings)[0].boxes


def fresh_copy_boxes(model: torch.nn.Module, image: Path) -> torch.Tensor:
    """What a copy made now (never reused) predicts."""
    predictor = Predictor(model, img_size=64, conf=0.001, device="cpu", half=False, reuse_copy=False)
    return predictor.predict_image(cv2.imread(str(image))).boxes


def reused(model: torch.nn.Module, half: bool = False) -> torch.nn.Module:
    return Predictor(model, img_size=64, device="cpu", half=half, reuse_copy=True).model


def test_repeated_predict_runs_one_copy_and_leaves_the_model_as_it_was(image):
    model = untrained("yolov8n").train()
    trainable = [p.requires_grad for p in model.parameters()]
    first = boxes(model, image)
    copy = reused(model)
    assert reused(model) is copy
    assert len(first) and torch.equal(boxes(model, image), first)
    # The caller's model: still training, unfused, its parameters as trainable as they were.
    assert model.training and [p.requires_grad for p in model.parameters()] == trainable
    def batch_norms(m: torch.nn.Module) -> int:
        return sum(isinstance(module, torch.nn.BatchNorm2d) for module in m.modules())
    assert batch_norms(model) > 0 and batch_norms(copy) == 0  # folded into the convolutions of the copy only
    assert copy is not model and not copy.training


def test_an_optimiser_step_makes_a_new_copy(image):
    model = untrained("yolov8n")
    before = boxes(model, image)
    copy = reused(model)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    sum(t.float().square().mean() for t in model(torch.rand(1, 3, 64, 64))).backward()
    optimiser.step()
    model.eval()
    after = boxes(model, image)
    assert reused(model) is not copy
    assert torch.equal(after, fresh_copy_boxes(model, image))
    assert not torch.equal(after, before)


@pytest.mark.parametrize("change", ["load_state_dict", "write_through_data", "names"])
def test_other_changes_make_a_new_copy(image, change):
    model = untrained("yolov8n")
    boxes(model, image)
    copy = reused(model)
    conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    if change == "load_state_dict":
        state = model.state_dict()
        state[next(k for k in state if k.endswith("conv.weight"))] = conv.weight * 0.5
        model.load_state_dict(state)
    elif change == "write_through_data":
        conv.weight.data.mul_(0.5)  # bumps no version counter: found by the weights' norms
    else:
        model.names = ["ring", "square"]
    assert reused(model) is not copy
    assert torch.equal(boxes(model, image), fresh_copy_boxes(model, image))
    if change == "names":
        assert predict(model, image, img_size=64, device="cpu", half=False)[0].names == ["ring", "square"]


def test_each_precision_keeps_its_own_copy(image):
    model = untrained("yolov8n")
    float32, bfloat16 = reused(model, half=False), reused(model, half=True)
    assert next(float32.parameters()).dtype == torch.float32
    assert next(bfloat16.parameters()).dtype == torch.bfloat16
    assert reused(model, half=False) is float32 and reused(model, half=True) is bfloat16


def test_visualize_gets_a_copy_of_its_own(image, tmp_path):
    """Its feature-map hooks stay on the model they are put on: never on the copy later calls reuse."""
    model = untrained("yolov8n")
    for run in range(2):
        predict(model, image, img_size=64, device="cpu", half=False, visualize=True, save_dir=tmp_path / str(run))
    assert not any(m._forward_hooks for m in reused(model).modules())
