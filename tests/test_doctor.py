"""yolotrain's doctor is the stand-alone inplace_doctor: same objects, `yolotrain doctor` and the project's own code."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import inplace_doctor
import torch

import yolotrain
from yolotrain import doctor
from yolotrain.doctor import InplaceWarning, check_step, lint_paths

ROOT = Path(__file__).resolve().parents[1]


def test_yolotrain_doctor_reexports_inplace_doctor() -> None:
    for name in doctor.__all__:
        assert getattr(doctor, name) is getattr(inplace_doctor, name)


def test_yolotrain_doctor_command_is_the_doctor_under_yolotrain_name() -> None:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(Path(inplace_doctor.__file__).parents[1])])
    case = "tests/doctor_cases/sigmoid_iadd.py"
    runs = [
        subprocess.run([sys.executable, *entry, case], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        for entry in (["-m", "yolotrain", "doctor"], ["-m", "yolotrain.doctor"], ["-m", "inplace_doctor"])
    ]
    assert [r.returncode for r in runs] == [1, 1, 1]
    assert runs[0].stderr == runs[1].stderr == runs[2].stderr
    assert "modified by: aten::add_ at tests/doctor_cases/sigmoid_iadd.py:" in runs[0].stderr
    usage = subprocess.run(
        [sys.executable, "-m", "yolotrain.doctor", "--help"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert usage.stdout.startswith("usage: yolotrain doctor")


def test_yolotrain_training_step_is_clean() -> None:
    torch.manual_seed(0)
    model = yolotrain.Yolov5(version="n", num_classes=80)
    model.train()
    criterion = yolotrain.YOLO_LOSS(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    imgs = torch.rand(2, 3, 64, 64)
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.4], [1, 5, 0.3, 0.6, 0.2, 0.2]])

    def step() -> None:
        loss = criterion(model(imgs), targets, pred_size=imgs.shape[2:4])
        opt.zero_grad()
        loss.backward()
        opt.step()

    with warnings.catch_warnings():
        warnings.simplefilter("error", InplaceWarning)
        assert check_step(step) == []


def test_corpus_static_patterns_are_linted() -> None:
    findings = lint_paths([str(ROOT / "tests" / "doctor_cases" / "softmax_log_inplace.py")], cwd=str(ROOT))
    assert [(f.path, f.line, f.kind) for f in findings] == [
        ("tests/doctor_cases/softmax_log_inplace.py", 7, "inplace_method")
    ]


def test_yolotrain_sources_have_no_inplace_hazards() -> None:
    findings = lint_paths([str(ROOT / "src" / "yolotrain")], cwd=str(ROOT))
    assert findings == [], "\n".join(f.format() for f in findings)
