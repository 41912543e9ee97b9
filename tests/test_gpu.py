"""CUDA-only checks (run by ``benchmarks/gpu_check.sh`` on a GPU machine) and that check's answer without one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from yolotrain.data import generate_shapes_dataset
from yolotrain.engine.config import resolve_config
from yolotrain.engine.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@CUDA
def test_fp16_training_on_cuda_scales_the_loss(tmp_path):
    data = generate_shapes_dataset(root=tmp_path / "shapes", n_train=8, n_val=4, img_size=64)
    trainer = Trainer(resolve_config(None, data=str(data / "data.yaml"), device="cuda", amp="fp16", epochs=1,
                                     img_size=64, batch_size=4, workers=0, project=str(tmp_path / "runs")))
    trainer.fit()
    assert trainer.scaler.is_enabled() and trainer.scaler.get_scale() > 1
    assert all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the answer of a machine without CUDA")
def test_the_gpu_check_answers_in_one_line_without_a_gpu(tmp_path):
    result = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "gpu-check: no CUDA GPU on this machine; nothing was run (docs/performance.md keeps 'GPU: not measured')"]
