"""Silent cuts: the corpus in tests/doctor_cases/silent_cut/.

Each failing program trains normally (no exception) but leaves a parameter the optimizer updates
without gradient; it marks the line that cut it (``# doctor: cut``). The doctor must report it as a
warning naming that line and exit 1; its patch must be the line of the program's fixed version
(``FIXES``), and applied to a copy it must run with nothing reported. ``clean_*`` programs (a frozen
unused branch, a trainable module never called, a branch run every other step, a second optimizer,
an evaluation under ``no_grad`` after the step) must report nothing.
"""

from __future__ import annotations

import re
import subprocess
import sys
import warnings

import inplace_doctor
import pytest
import torch
from doctor_corpus import (
    ROOT,
    assert_reports_nothing,
    corpus,
    doctor_env,
    json_report,
    lines_by_role,
    run_doctor,
    runs_fixture,
)
from torch import nn

MARK = re.compile(r"#\s*doctor:\s*(cut)\s*$")
CORPUS = corpus("silent_cut")
FOLDER, CASES, FAILING, CLEAN = CORPUS
runs = runs_fixture(CORPUS)
# Per failing program, its fixed version: the cut line as it should read.
FIXES = {
    "backbone_no_grad_helper.py": "@torch.enable_grad()",
    "clip_logit_scale_item.py": "scale = self.logit_scale.exp()",
    "detection_objectness_no_grad.py": "with torch.enable_grad(): objectness = objectness_head(features)",
    "distill_adaptor_in_no_grad.py": "with torch.enable_grad(): projected = adaptor(features)",
    "encoder_output_detached.py": "latent = encoder(x)",
    "flow_scale_net_item.py": "log_scale = scale_net(x_a).tanh()",
    "seq2seq_encoder_state_detached.py": "hidden = hidden",
    "triplet_anchor_data.py": "anchors = anchor_tower(queries)",
}


def test_corpus_size() -> None:
    assert len(FAILING) >= 8 and len(CLEAN) >= 1
    assert sorted(FIXES) == FAILING


@pytest.mark.parametrize("name", FAILING)
def test_report_names_the_cutting_line(name: str, runs: dict) -> None:
    proc, report, _ = runs[name]
    assert proc.returncode == 1, proc.stderr
    assert report is not None and (report["kind"], report["severity"]) == ("silent_cut", "warning")
    assert "got no gradient" in report["error"]
    cut = lines_by_role(CASES / name, MARK, ("cut",))["cut"]
    assert {s["line"] for s in report["sites"] if s["role"] == "cut at"} == cut
    assert [s["role"] for s in report["sites"]][-1] == "stepped at"


@pytest.mark.parametrize("name", FAILING)
def test_applied_fix_runs_clean(name: str, runs: dict) -> None:
    _, report, patched = runs[name]
    assert {p["line"] for p in report["patches"]} == lines_by_role(CASES / name, MARK, ("cut",))["cut"]
    assert [p["code"] for p in report["patches"]] == [FIXES[name]]
    assert (patched.returncode, patched.stdout, patched.stderr) == (0, "", "")


@pytest.mark.parametrize("name", CLEAN)
def test_clean_programs_report_nothing(name: str) -> None:
    assert_reports_nothing(run_doctor(f"{FOLDER}/{name}"))


def test_ignored_names_are_not_reported() -> None:
    program = f"{FOLDER}/clip_logit_scale_item.py"
    assert_reports_nothing(run_doctor("--ignore-unused", "logit_*", program))
    command = [sys.executable, "-m", "inplace_doctor", program]
    env = dict(doctor_env(), INPLACE_DOCTOR_IGNORE_UNUSED="other,logit_scale")
    assert_reports_nothing(subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300))
    report = json_report(run_doctor("--json", program).stdout)
    assert "--ignore-unused logit_scale" in report["fix"]


def _train(model: nn.Module, head: nn.Module, ignore: tuple[str, ...] = ()) -> list[warnings.WarningMessage]:
    opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)
    with warnings.catch_warnings(record=True) as caught, inplace_doctor.watch(ignore_unused=ignore):
        warnings.simplefilter("always")
        for _ in range(3):
            features = model(torch.randn(4, 3)).detach()
            loss = head(features).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [w for w in caught if issubclass(w.category, inplace_doctor.SilentCutWarning)]


def test_watch_warns_once_per_parameter_with_the_cutting_line() -> None:
    (warning,) = _train(nn.Linear(3, 2), nn.Linear(2, 1))
    text = str(warning.message)
    assert "`weight` [2, 3], `bias` [2] of Linear got no gradient" in text
    assert "cut at:      .detach() at" in text and "features = model(torch.randn(4, 3))" in text


def test_frozen_and_ignored_parameters_are_not_reported() -> None:
    frozen = nn.Linear(3, 2).requires_grad_(False)
    assert _train(frozen, nn.Linear(2, 1)) == []
    assert _train(nn.Linear(3, 2), nn.Linear(2, 1), ignore=("weight", "bias")) == []


def test_corpus_reports_the_clip_temperature_in_the_module_source(runs: dict) -> None:
    _, report, _ = runs["clip_logit_scale_item.py"]
    assert [p["code"] for p in report["patches"]] == ["scale = self.logit_scale.exp()"]
