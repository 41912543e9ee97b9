"""The doctor on "element 0 of tensors does not require grad": the corpus in tests/doctor_cases/graph_cut/.

Each failing program marks the lines that cut the loss's ancestry off the graph (``# doctor: cut``)
and the backward that failed (``# doctor: failed``). The doctor runs as a process of its own
(``doctor_corpus.run_forked``); its patches are then applied to a copy of the program, which must
run to the end with nothing reported. ``clean_*`` programs must report nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import inplace_doctor
import pytest
import torch
from doctor_corpus import (
    assert_error_report,
    assert_reports_nothing,
    corpus,
    json_report,
    lines_by_role,
    patched_lines,
    run_cell_magic,
    run_doctor,
    run_pytest_plugin,
    runs_fixture,
)
from torch import nn

MARK = re.compile(r"#\s*doctor:\s*(cut|failed)\s*$")
CORPUS = corpus("graph_cut")
FOLDER, CASES, FAILING, CLEAN = CORPUS
PYTORCH_ERROR = "element 0 of tensors does not require grad and does not have a grad_fn"
runs = runs_fixture(CORPUS)
# Per failing program, its fixed version: the changed lines as they should read, in line order. The doctor's
# patches must be these lines, and the copy they make must run clean.
FIXES = {
    "contrastive_tensor_wrap.py": ("similarity = z1 @ z2.T / 0.1",),
    "custom_function_detached_input.py": ("code = StraightThroughRound.apply(encoder(x) * 4)",),
    "distill_student_in_no_grad.py": ("with torch.enable_grad(): student_logits = student(x).float()",),
    "epoch_loss_item.py": ("total += batch_loss", "loss = total / len(batches)"),
    "grad_disabled_globally.py": ("torch.set_grad_enabled(True)",),
    "helper_inference_mode_decorator.py": ("@torch.enable_grad()",),
    "helper_no_grad_decorator.py": ("@torch.enable_grad()",),
    "inference_mode_block.py": ("with torch.inference_mode(False): logits = model(x)",),
    "keypoint_argmax.py": (
        "predicted = (heatmaps.softmax(-1) * torch.arange(heatmaps.shape[-1], device=heatmaps.device)).sum(-1).float()",
    ),
    "logits_through_data.py": ("logits = model(x)",),
    "numpy_dice_loss.py": ("probs = net(image).sigmoid()",),
    "per_sample_losses_list.py": (
        "losses = [nn.functional.smooth_l1_loss(box, target) for box, target in zip(boxes, targets)]",
        "loss = torch.stack(losses).mean()",
    ),
    "policy_gradient_detach.py": ("log_probs = dist.log_prob(actions)",),
    "set_grad_enabled_phase.py": ("with torch.enable_grad(): prediction = model(x)",),
    "validation_copy_no_grad.py": ("with torch.enable_grad(): logits = model(x)",),
    "weight_frozen_in_place.py": ("weight.requires_grad_(True)",),
}


def _marks(path: Path) -> dict[str, set[int]]:
    return lines_by_role(path, MARK, ("cut", "failed"))


def test_corpus_size() -> None:
    assert len(FAILING) >= 8 and len(CLEAN) >= 2
    assert sorted(FIXES) == FAILING


@pytest.mark.parametrize("name", FAILING)
def test_report_names_the_cutting_lines(name: str, runs: dict) -> None:
    proc, report, _ = runs[name]
    assert_error_report(proc, report, "graph_cut", f"{FOLDER}/{name}")
    assert PYTORCH_ERROR in report["error"]
    marks = _marks(CASES / name)
    assert {s["line"] for s in report["sites"] if s["role"] == "cut at"} == marks["cut"]
    assert [s["line"] for s in report["sites"] if s["role"] == "failed at"] == sorted(marks["failed"])


@pytest.mark.parametrize("name", FAILING)
def test_applied_fix_runs_clean(name: str, runs: dict) -> None:
    _, report, patched = runs[name]
    assert {p["line"] for p in report["patches"]} == _marks(CASES / name)["cut"], report["fix"]
    assert all(f"`{p['code']}`" in report["fix"] for p in report["patches"])
    assert patched_lines(report) == FIXES[name]
    assert (patched.returncode, patched.stdout, patched.stderr) == (0, "", "")


@pytest.mark.parametrize("name", CLEAN)
def test_clean_programs_report_nothing(name: str) -> None:
    assert_reports_nothing(run_doctor(f"{FOLDER}/{name}"))


def test_watch_raises_pytorch_error_with_the_report() -> None:
    model = nn.Linear(3, 1)
    x = torch.randn(4, 3)
    with pytest.raises(inplace_doctor.GraphCutError) as info, inplace_doctor.watch():
        out = model(x).detach()
        (out**2).mean().backward()
    assert str(info.value) == PYTORCH_ERROR
    (report,) = info.value.reports
    assert [(role, site.op, site.code) for role, site in report.sites] == [
        ("cut at", ".detach()", "out = model(x).detach()"),
        ("failed at", "backward()", "(out**2).mean().backward()"),
    ]
    assert [p.code for p in report.patches] == ["out = model(x)"]


def test_frozen_parameters_and_integer_results_are_named_without_a_patch() -> None:
    model, classifier = nn.Linear(3, 1), nn.Linear(3, 4)
    opt = torch.optim.SGD([*model.parameters(), *classifier.parameters()], lr=0.1)
    model.requires_grad_(False)
    x, y = torch.randn(4, 3), torch.randn(4)
    with pytest.raises(inplace_doctor.GraphCutError) as info, inplace_doctor.watch():
        prediction = model(x).squeeze(1)
        labels = classifier(x).argmax(1).float()
        loss = (prediction - y).pow(2).mean() + (labels - y).abs().mean()
        loss.backward()
    (report,) = info.value.reports
    cuts = [(site.op, site.code) for role, site in report.sites if role == "cut at"]
    assert cuts == [
        ("frozen module", "prediction = model(x).squeeze(1)"),
        ("integer result", "labels = classifier(x).argmax(1).float()"),
    ]
    assert report.patches == [] and "requires_grad=False" in report.fix and "integer" in report.fix
    assert opt.param_groups


def test_argmax_is_fixed_by_its_soft_argmax_once_a_run_verified_it(runs: dict) -> None:
    """``keypoint_argmax.py`` runs with ``--verify-fix`` (its ``# doctor-options``): its soft-argmax candidate is
    the patch once the run verified it, and without a run there is no patch."""
    name = "keypoint_argmax.py"
    _, report, _ = runs[name]
    assert report["verification"]["verified"] is True and report["verification"]["steps"] == 2
    unverified = json_report(run_doctor("--json", "--no-verify-fix", f"{FOLDER}/{name}").stdout)
    assert unverified["patches"] == [] and "verification" not in unverified


def test_nothing_requiring_grad_anywhere_is_left_to_pytorch() -> None:
    with pytest.raises(RuntimeError) as info, inplace_doctor.watch():
        data = torch.randn(3)
        data.sum().backward()
    assert type(info.value) is RuntimeError


def test_ipython_cell_magic_reports_a_graph_cut() -> None:
    cell = "w = torch.ones(3, requires_grad=True)\nwith torch.no_grad():\n    y = w * 2\ny.sum().backward()\n"
    error, stderr = run_cell_magic(cell, inplace_doctor.GraphCutError)
    (report,) = error.reports
    assert [(role, site.line) for role, site in report.sites] == [("cut at", 3), ("failed at", 4)]
    assert [p.code for p in report.patches] == ["with torch.enable_grad(): y = w * 2"]
    assert "cut at:      torch.no_grad() at <doctor-cell-" in stderr


def test_pytest_plugin_attaches_the_graph_cut_report(tmp_path: Path) -> None:
    proc = run_pytest_plugin(
        tmp_path,
        "import torch\n\n\ndef test_loss():\n    w = torch.ones(2, requires_grad=True)\n"
        "    loss = (w * 3).sum().item()\n    torch.tensor(loss).backward()\n",
    )
    assert proc.returncode == 1, proc.stdout
    assert "cut at:      round trip at test_model.py:6" in proc.stdout
    assert "loss = (w * 3).sum()" in proc.stdout


def test_boolean_results_and_tolist_are_named() -> None:
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 3)
    with pytest.raises(inplace_doctor.GraphCutError) as info, inplace_doctor.watch():
        hits = (model(x) > 0).float()
        values = model(x).squeeze(1).tolist()
        loss = hits.mean() + torch.tensor(values).mean()
        loss.backward()
    (report,) = info.value.reports
    cuts = {(site.op, site.code) for role, site in report.sites if role == "cut at"}
    assert cuts == {
        ("integer result", "hits = (model(x) > 0).float()"),
        ("round trip", "values = model(x).squeeze(1).tolist()"),
        ("round trip", "loss = hits.mean() + torch.tensor(values).mean()"),
    }
    assert "values = model(x).squeeze(1)" in [p.code for p in report.patches]
    assert opt.param_groups


def test_the_line_that_froze_a_module_is_named() -> None:
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    with pytest.raises(inplace_doctor.GraphCutError) as info, inplace_doctor.watch():
        model.requires_grad_(False)
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
    (report,) = info.value.reports
    roles = [(role, site.op, site.code) for role, site in report.sites]
    assert ("cut at", "frozen module", "loss = (model(x) - y).pow(2).mean()") in roles
    assert ("frozen by", "requires_grad_(False)", "model.requires_grad_(False)") in roles
    assert opt.param_groups
