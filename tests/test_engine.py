"""Training recipe pieces: parameter groups, warm-up, schedules, EMA, configuration, sharding."""

import math

import pytest
import torch
from torch import nn

from yolotrain import Yolov5
from yolotrain.data.loaders import EpochBatchSampler
from yolotrain.devices import select_device
from yolotrain.engine.ema import ModelEMA
from yolotrain.engine.optim import OptimConfig, apply_warmup, build_optimizer, lr_lambda, warmup_iterations
from yolotrain.runs import next_run_dir


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_three_parameter_groups(name):
    model = Yolov5("n", num_classes=2)
    optimizer = build_optimizer(model, name, lr=0.01, momentum=0.9, weight_decay=5e-4)
    biases, weights, norms = (g["params"] for g in optimizer.param_groups)
    n_bn = sum(1 for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    n_conv = sum(1 for m in model.modules() if isinstance(m, nn.Conv2d))
    assert len(norms) == n_bn and len(weights) == n_conv
    assert len(biases) == n_bn + 3  # BatchNorm shifts and the three Detect convolution biases
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.0, 5e-4, 0.0]
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
    with pytest.raises(ValueError, match="unknown optimizer"):
        build_optimizer(model, "Lion", 0.01, 0.9, 0.0)


def test_schedules_end_at_final_fraction():
    for cosine in (False, True):
        f = lr_lambda(10, 0.01, cosine)
        assert f(0) == pytest.approx(1.0) and f(10) == pytest.approx(0.01)
        assert f(5) == pytest.approx(0.505)


def test_warmup_ramps_learning_rate_and_momentum():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    optimizer = build_optimizer(model, "SGD", lr=0.01, momentum=0.937, weight_decay=0.0)
    for g in optimizer.param_groups:
        g["initial_lr"] = 0.01
    hyp = OptimConfig()
    assert warmup_iterations(3, 10) == 100 and warmup_iterations(3, 1000) == 3000 and warmup_iterations(0, 5) == 0
    apply_warmup(optimizer, 0, 100, 1.0, hyp)
    assert [g["lr"] for g in optimizer.param_groups] == [pytest.approx(0.1), 0.0, 0.0]
    assert optimizer.param_groups[0]["momentum"] == pytest.approx(0.8)
    apply_warmup(optimizer, 100, 100, 1.0, hyp)
    assert [g["lr"] for g in optimizer.param_groups] == [pytest.approx(0.01)] * 3
    assert optimizer.param_groups[1]["momentum"] == pytest.approx(0.937)


def test_ema_follows_the_reference_formula():
    model = nn.Linear(2, 2)
    ema = ModelEMA(model, decay=0.9, tau=1)
    before = ema.module.weight.clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model)
    d = 0.9 * (1 - math.exp(-1))
    torch.testing.assert_close(ema.module.weight, d * before + (1 - d) * model.weight)
    assert not ema.module.weight.requires_grad


def test_run_dirs_increment(tmp_path):
    assert next_run_dir(tmp_path, "exp", False) == tmp_path / "exp"
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp2").mkdir()
    assert next_run_dir(tmp_path, "exp", False) == tmp_path / "exp3"
    assert next_run_dir(tmp_path, "exp", True) == tmp_path / "exp"


def test_device_strings():
    assert select_device("cpu") == torch.device("cpu")
    for bad in ("tpu", "gpu0", "cuda:x"):
        with pytest.raises(ValueError, match="device"):
            select_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            select_device("cuda:0")
        assert select_device(None) == torch.device("cpu")


class TenImages:
    """The attributes a batch sampler reads from a dataset."""

    epoch, mosaic, rect = 0, True, False

    def __len__(self) -> int:
        return 10


@pytest.mark.parametrize("shuffle", [False, True])
def test_each_process_takes_its_share_of_every_global_batch(shuffle):
    def indices(sampler):
        return [[key[0] for key in batch] for batch in sampler]

    whole = indices(EpochBatchSampler(TenImages(), 4, shuffle, seed=3))
    ranks = [indices(EpochBatchSampler(TenImages(), 4, shuffle, seed=3, rank=r, world_size=2)) for r in (0, 1)]
    assert [a + b for a, b in zip(*ranks)] == whole
    assert [len(b) for b in ranks[0]] == [2, 2, 1] and [len(b) for b in ranks[1]] == [2, 2, 1]
    three = [indices(EpochBatchSampler(TenImages(), 4, shuffle, seed=3, rank=r, world_size=3)) for r in range(3)]
    assert three[2][-1] == whole[-1][:1]  # a process left without images repeats the batch's first
