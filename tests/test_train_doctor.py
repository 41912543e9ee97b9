"""The trainer and the in-place doctor: a broken custom loss gets the report, our own step is clean."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from yolotrain.data import generate_shapes_dataset
from yolotrain.engine import TrainConfig, Trainer, TrainingError, resolve_config


@pytest.fixture(scope="module")
def single_batch_data(tmp_path_factory) -> str:
    """Four training images: one batch of ``tiny_config`` (the shared ``tiny_data`` has two)."""
    root = generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=4, n_val=2, img_size=64)
    return str(root / "data.yaml")


def tiny_config(data: str, tmp_path: Path, **overrides) -> TrainConfig:
    return resolve_config(data=data, img_size=64, batch_size=4, epochs=1, workers=0, project=str(tmp_path),
                          val=False, plots=False, **overrides)


def sloppy_loss(model, rect_training):
    def criterion(outputs, targets, pred_size):
        pred = outputs[0]
        objectness = F.binary_cross_entropy_with_logits(pred[..., 4], torch.zeros_like(pred[..., 4]))
        pred[..., :2] = pred[..., :2].sigmoid()  # writes into the map the objectness loss saved
        return objectness + pred[..., :4].mean()

    return criterion


def test_inplace_failure_in_a_custom_loss_prints_the_doctor_report(single_batch_data, tmp_path, capsys):
    with pytest.raises(TrainingError, match="modified in place"):
        Trainer(tiny_config(single_batch_data, tmp_path), loss=sloppy_loss).fit()
    report = capsys.readouterr().err
    source = Path(__file__).read_text().splitlines()
    saved_line = next(i for i, line in enumerate(source, 1) if "objectness = F.binary" in line)
    modified_line = next(i for i, line in enumerate(source, 1) if "pred[..., :2] = pred" in line)
    assert f"test_train_doctor.py:{saved_line}" in report
    assert f"test_train_doctor.py:{modified_line}" in report
    assert "saved by" in report and "modified by" in report and "fix" in report


def test_first_step_under_the_doctor_is_clean(single_batch_data, tmp_path, capsys):
    result = Trainer(tiny_config(single_batch_data, tmp_path, doctor=True)).fit()
    assert (result.last.parent / "last.json").is_file()
    assert "modified by" not in capsys.readouterr().err



def leaf_writing_loss(model, rect_training):
    def criterion(outputs, targets, pred_size):
        model.model[0].conv.weight.mul_(0.5)  # a parameter written in place while grad mode is on
        return outputs[0][..., 4].sigmoid().mean()

    return criterion


def test_a_leaf_write_in_a_custom_loss_under_the_doctor_is_its_report_and_one_line(single_batch_data, tmp_path, capsys):
    with pytest.raises(TrainingError) as info:
        Trainer(tiny_config(single_batch_data, tmp_path, doctor=True), loss=leaf_writing_loss).fit()
    message = str(info.value)
    assert message.startswith("backward failed: a leaf Variable that requires grad is being used in an in-place "
                              "operation") and message.endswith("(the report above names the lines and the fix)")
    report = capsys.readouterr().err
    source = Path(__file__).read_text().splitlines()
    write_line = next(i for i, line in enumerate(source, 1) if "conv.weight.mul_(0.5)" in line)
    assert f"test_train_doctor.py:{write_line}" in report, report
    assert "fix:" in report
