"""The doctor on "backward through the graph a second time": the corpus in tests/doctor_cases/graph_freed/.

Each failing program marks the backward that freed the graph (``# doctor: freed``), the line that
first used a tensor of the freed graph (``# doctor: carried``) and the backward that failed
(``# doctor: failed``); ``# doctor-fix: detach|retain_graph`` says which fix is right. The doctor
runs as a process of its own (``doctor_corpus.run_forked``); its patches are then applied to a copy
of the program, which must run to the end with nothing reported. ``clean_*`` programs must report
nothing.
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
    run_doctor,
    runs_fixture,
)
from inplace_doctor.graph_freed import _detach_names, _retain_graph

MARK = re.compile(r"#\s*doctor:\s*((?:freed|carried|failed)(?:\s+(?:freed|carried|failed))*)\s*$")
FIX = re.compile(r"#\s*doctor-fix:\s*(detach|retain_graph)")
CORPUS = corpus("graph_freed")
FOLDER, CASES, FAILING, CLEAN = CORPUS
runs = runs_fixture(CORPUS)
# Per failing program, its fixed version: the changed lines as they should read, in line order. The doctor's
# patches must be these lines, and the copy they make must run clean.
FIXES = {
    "autocast_memory.py": ("memory = out.detach().float()",),
    "custom_function_state.py": ("state = ClipGrad.apply(torch.sigmoid(state.detach() @ w))",),
    "gan_fake_not_detached.py": ("loss_d.backward(retain_graph=True)",),
    "lstm_tbptt.py": ("out, (h, c) = lstm(embed(chunk), (h.detach(), c.detach()))",),
    "multitask_heads.py": ("cls_loss.backward(retain_graph=True)",),
    "rl_td_target.py": ("advantage = reward + gamma * next_value - value.detach()",),
    "rnn_gru_hidden.py": ("h = cell(x, h.detach())",),
    "running_center.py": ("center = 0.9 * center.detach() + 0.1 * out.mean(0)",),
}


def _marks(path: Path) -> dict[str, set[int]]:
    return lines_by_role(path, MARK, ("freed", "carried", "failed"))


def test_corpus_covers_both_fixes() -> None:
    fixes = [FIX.search((CASES / name).read_text()).group(1) for name in FAILING]
    assert len(FAILING) >= 8 and len(CLEAN) >= 2
    assert sorted(FIXES) == FAILING
    assert {"detach", "retain_graph"} == set(fixes)


@pytest.mark.parametrize("name", FAILING)
def test_report_names_the_freeing_backward_and_the_carrying_line(name: str, runs: dict) -> None:
    proc, report, _ = runs[name]
    assert_error_report(proc, report, "graph_freed", f"{FOLDER}/{name}")
    assert "backward through the graph a second time" in report["error"]
    marks = _marks(CASES / name)
    lines = {role: {s["line"] for s in report["sites"] if s["role"] == role} for role in ("freed by", "carried by")}
    assert lines["freed by"] == marks["freed"]
    assert lines["carried by"] == marks["carried"]
    assert {s["line"] for s in report["sites"] if s["role"] == "failed at"} == marks["failed"]


@pytest.mark.parametrize("name", FAILING)
def test_applied_fix_runs_clean(name: str, runs: dict) -> None:
    _, report, patched = runs[name]
    kind = FIX.search((CASES / name).read_text()).group(1)
    assert report["patches"], report["fix"]
    marks = _marks(CASES / name)
    expected_lines = marks["carried"] if kind == "detach" else marks["freed"]
    assert {p["line"] for p in report["patches"]} == expected_lines
    token = ".detach()" if kind == "detach" else "retain_graph=True"
    assert all(token in p["code"] for p in report["patches"]) and token in report["fix"]
    assert patched_lines(report) == FIXES[name]
    assert (patched.returncode, patched.stdout, patched.stderr) == (0, "", "")


@pytest.mark.parametrize("name", CLEAN)
def test_clean_programs_report_nothing(name: str) -> None:
    assert_reports_nothing(run_doctor(f"{FOLDER}/{name}"))


def test_check_mode_reports_the_freed_graph_too() -> None:
    proc = run_doctor("--check", "--json", f"{FOLDER}/custom_function_state.py")
    assert proc.returncode == 1, proc.stderr
    report = json_report(proc.stdout)
    assert report["kind"] == "graph_freed"
    assert [p["code"] for p in report["patches"]] == ["state = ClipGrad.apply(torch.sigmoid(state.detach() @ w))"]


def test_watch_raises_pytorch_error_with_the_report() -> None:
    w = torch.randn(3, 3, requires_grad=True)
    h = torch.zeros(2, 3)
    with pytest.raises(inplace_doctor.GraphFreedError) as info, inplace_doctor.watch():
        for _ in range(2):
            h = torch.tanh(h @ w)
            h.sum().backward()
    with pytest.raises(RuntimeError) as plain:
        h.sum().backward()
    assert str(info.value) == str(plain.value)
    (report,) = info.value.reports
    roles = [role for role, _ in report.sites]
    assert roles == ["freed by", "carried by", "failed at"]
    assert report.sites[1][1].code == "h = torch.tanh(h @ w)"
    assert [p.code for p in report.patches] == ["h = torch.tanh(h.detach() @ w)"]


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("loss.backward()", "loss.backward(retain_graph=True)"),
        ("(a + b).backward(gradient=g)", "(a + b).backward(gradient=g, retain_graph=True)"),
        ("gx, = torch.autograd.grad(y.sum(), [x])", "gx, = torch.autograd.grad(y.sum(), [x], retain_graph=True)"),
        ("opt.step()", None),
    ],
)
def test_retain_graph_patch(code: str, expected: str | None) -> None:
    assert _retain_graph(code) == expected


@pytest.mark.parametrize(
    ("code", "names", "expected"),
    [
        ("h = cell(x, h)", ["h"], "h = cell(x, h.detach())"),
        ("self.queue = torch.cat([k, self.queue])", ["self.queue"], "self.queue = torch.cat([k, self.queue.detach()])"),
        ("memory = out.float()", ["out"], "memory = out.detach().float()"),
        ("h = cell(x, state)", ["h"], None),
    ],
)
def test_detach_patch_rewrites_only_reads(code: str, names: list[str], expected: str | None) -> None:
    assert _detach_names(code, names) == expected
