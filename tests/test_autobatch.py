"""AutoBatch: the batch search on a memory curve, the reference's spellings, the one-line fallback off CUDA, and the
probe's training pass on every family and task's model."""

from __future__ import annotations

import pytest
import torch
from conftest import untrained
from hypothesis import given
from hypothesis import strategies as st

from yolotrain.cli import build_parser, train_settings
from yolotrain.data import generate_shapes_dataset
from yolotrain.engine.autobatch import PROBE_BATCHES, autobatch, fit_batch_size, output_tensors, train_pass
from yolotrain.engine.config import resolve_config
from yolotrain.engine.trainer import Trainer


def curve(base: float, per_image: float) -> list[float | None]:
    return [base + per_image * b for b in PROBE_BATCHES]


def test_the_batch_fills_the_fraction_of_free_memory():
    # 0.5 GiB + 0.25 GiB per image, 16 GiB free, 80%: (12.8 - 0.5) / 0.25 = 49.2 -> 49, truncated as the reference does.
    assert fit_batch_size(PROBE_BATCHES, curve(0.5, 0.25), 16.0, 0.8, fallback=16) == 49
    assert fit_batch_size(PROBE_BATCHES, curve(0.5, 0.25), 16.0, 0.7, fallback=16) == 42


@given(base=st.floats(0.05, 4), per_image=st.floats(0.001, 2), free=st.floats(1, 140), fraction=st.floats(0.1, 0.95))
def test_the_fit_solves_a_straight_memory_line(base, per_image, free, fraction):
    batch = fit_batch_size(PROBE_BATCHES, curve(base, per_image), free, fraction, fallback=16)
    exact = (free * fraction - base) / per_image
    if 2 <= exact <= 1024:  # well inside the safe range (at its edges float rounding may go either way)
        assert abs(batch - exact) <= 1 + 1e-6 * exact and base + per_image * batch <= free * fraction * (1 + 1e-6)
    elif exact < 0.99 or exact > 1026:
        assert batch == 16


def test_a_size_that_ran_out_of_memory_caps_the_batch():
    memory = curve(0.5, 0.25)[:4] + [None]  # 16 did not fit, although the line promises 49
    assert fit_batch_size(PROBE_BATCHES, memory, 16.0, 0.8, fallback=16) == 8
    assert fit_batch_size(PROBE_BATCHES, [0.5, None, None, None, None], 16.0, 0.8, fallback=16) == 16
    assert fit_batch_size(PROBE_BATCHES, curve(20.0, 0.25), 16.0, 0.8, fallback=16) == 16  # nothing fits: below 1
    assert fit_batch_size(PROBE_BATCHES, curve(0.5, 1e-4), 16.0, 0.8, fallback=16) == 16  # above 1024


@pytest.mark.parametrize(("given_batch", "expected"), [
    ("-1", {"autobatch": 0.8}), ("0.7", {"autobatch": 0.7}), ("16", {"batch_size": 16})])
def test_the_reference_spellings_of_autobatch(given_batch, expected):
    settings = train_settings(build_parser().parse_args(["train", "--batch", given_batch]))
    assert {k: settings[k] for k in ("autobatch", "batch_size") if k in settings} == expected


def test_off_cuda_autobatch_says_its_fallback_in_one_line(tmp_path, capsys):
    data = generate_shapes_dataset(root=tmp_path / "shapes", n_train=4, n_val=2, img_size=64)
    trainer = Trainer(resolve_config(None, data=str(data / "data.yaml"), device="cpu", img_size=64, autobatch=0.7,
                                     workers=0, autoanchor=False, project=str(tmp_path / "runs")))
    trainer.setup()
    assert "AutoBatch needs CUDA (this run is on cpu): using batch 16\n" in capsys.readouterr().out
    assert trainer.config.data.batch_size == 16 and trainer.config.data.autobatch == 0  # what checkpoints hold
    assert trainer.train_loader.batch_sampler.batch_size == 16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["yolov5n", "yolov8n"])
def test_autobatch_measures_the_gpu(arch):
    from yolotrain import Yolov5

    model = Yolov5("n", num_classes=80) if arch == "yolov5n" else untrained(arch)
    batch = autobatch(model, 640, torch.device("cuda", 0), 0.8, 16, torch.float16, print)
    assert 1 <= batch <= 1024


@pytest.mark.parametrize(("arch", "head"), [("yolov5n", {}), ("yolov5n-seg", {}), ("yolov8n", {}), ("yolo11n-seg", {}),
                                            ("yolov8n-pose", {"kpt_shape": (4, 3)}), ("yolov8n-obb", {})])
def test_the_probe_pass_reaches_every_trainable_parameter_of_each_family_and_task(arch, head):
    """AutoBatch measures the memory of a forward and backward through all of a model's outputs (a segmentation
    model's prototypes, a pose head's keypoints, an oriented-box head's angles): every trainable tensor gets a
    gradient, so the probe holds what a training step holds. The same pass runs here on the CPU."""
    from yolotrain import Yolov5

    model = Yolov5("n", num_classes=2, task="segment" if arch.endswith("-seg") else "detect") \
        if arch.startswith("yolov5n") else untrained(arch, **head)
    model.train()
    sum(o.float().sum() for o in output_tensors(model(torch.rand(2, 3, 64, 64)))).backward()
    missing = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert missing == []
    train_pass(model, 2, 64, torch.device("cpu"), torch.bfloat16)
    assert all(p.grad is None for p in model.parameters())
