"""The reference's hyper-parameter files load, and the loss options they hold match the reference's loss."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import yaml
from test_parity_reference import reference_hyp, reference_model, targets

from yolotrain import YoloLoss, Yolov5
from yolotrain.engine.config import IgnoredSettingWarning, resolve_config
from yolotrain.settings import ConfigError


def reference_hyp_file(reference, name: str) -> Path:
    return Path(reference.__file__).parent / "data" / "hyps" / f"hyp.{name}.yaml"


@pytest.mark.parametrize("name", ["scratch-low", "scratch-med", "scratch-high"])
def test_reference_hyp_files_load_every_key(reference, name):
    path = reference_hyp_file(reference, name)
    values = yaml.safe_load(path.read_text())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = resolve_config(hyp=path, data="d.yaml")
    ignored = sorted(str(w.message).split("'")[1] for w in caught if issubclass(w.category, IgnoredSettingWarning))
    assert ignored == ["iou_t"]  # one warning, naming the key (copy_paste is a segmentation augmentation)
    sections = {**vars(config.augment), **vars(config.loss), **vars(config.optim)}
    for key, value in values.items():
        if key != "iou_t":
            assert sections[key] == pytest.approx(value), key


def test_typos_in_a_reference_style_file_still_fail(tmp_path):
    typo = tmp_path / "hyp.yaml"
    typo.write_text("cls_pw: 1.0\nfl_gama: 1.5\n")
    with pytest.raises(ConfigError, match="unknown setting 'fl_gama'; did you mean 'fl_gamma'"):
        resolve_config(hyp=typo)


LOSS_OPTIONS = [
    {"cls_pw": 2.0, "obj_pw": 0.5},
    {"fl_gamma": 1.5},
    {"label_smoothing": 0.1},
    {"cls_pw": 1.5, "obj_pw": 1.2, "fl_gamma": 2.0, "label_smoothing": 0.2},
]


@pytest.mark.parametrize("options", LOSS_OPTIONS)
@pytest.mark.parametrize("nc", [3, 80])
def test_loss_options_match_reference(reference, options, nc):
    torch.manual_seed(nc)
    ref = reference_model(reference, "n", nc)
    ours = Yolov5("n", num_classes=nc)
    ours.load_state_dict(ref.state_dict())
    ref.train(), ours.train()
    imgs = torch.rand(2, 3, 128, 128)
    t = targets(40, 2, nc, seed=nc)
    maps = ours(imgs)
    ref.hyp = {**reference_hyp(nc, 128), **options}
    ref_loss, ref_parts = reference.utils.loss.ComputeLoss(ref)(maps, t)
    criterion = YoloLoss(ours, hyp=options)
    loss = criterion(maps, t, pred_size=imgs.shape[2:4])
    torch.testing.assert_close(loss, ref_loss.squeeze(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(criterion.components, ref_parts, rtol=1e-5, atol=1e-7)
    plain = YoloLoss(ours)(maps, t, pred_size=imgs.shape[2:4])
    assert not torch.allclose(plain, loss)  # the option changes the loss
