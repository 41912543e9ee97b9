"""The doctor on in-place writes into leaves and views PyTorch refuses: the corpus in tests/doctor_cases/view_write/.

Each failing program marks the line that made the leaf or view (``# doctor: made``) and the write
(``# doctor: written``); ``# doctor-fix: no_grad|out_of_place|clone`` says which fix is right: the
write under ``torch.no_grad()``, the write out of place, or the view cloned where it is made. The
doctor runs as a process of its own (``doctor_corpus.run_forked``); its patches are then applied to
a copy of the program, which must run to the end with nothing reported. ``clean_*`` programs must
report nothing.
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
    marked_lines,
    patched_lines,
    run_cell_magic,
    run_doctor,
    run_pytest_plugin,
    runs_fixture,
)

MARK = re.compile(r"#\s*doctor:\s*(made|written)\s*$")
FIX = re.compile(r"#\s*doctor-fix:\s*(no_grad|clone|out_of_place)")
CORPUS = corpus("view_write")
FOLDER, CASES, FAILING, CLEAN = CORPUS
KIND = {"no_grad": "leaf_write", "out_of_place": "view_write", "clone": "view_write"}
TOKEN = {"no_grad": "torch.no_grad()", "out_of_place": " = ", "clone": ".clone()"}
runs = runs_fixture(CORPUS)
# Per failing program, its fixed version: the changed lines as they should read, in line order. The doctor's
# patches must be these lines, and the copy they make must run clean.
FIXES = {
    "attention_qkv_unbind.py": ("q = q * ((dim // heads) ** -0.5)",),
    "autocast_split_logits.py": ("cls_logits, reg = (part.clone() for part in model(x).split([4, 6], dim=1))",),
    "contrastive_chunk_normalise.py": ("z1 = z1.div(z1.norm(dim=1, keepdim=True))",),
    "dqn_target_view.py": ("bootstrap = q_next[:, 0].clone()",),
    "embedding_padding_row.py": ("with torch.no_grad(): emb.weight[PAD] = 0",),
    "layer_scale_reset.py": ("with torch.no_grad(): self.gamma.fill_(self.init)",),
    "lstm_gates_chunk.py": ("i = i.sigmoid()",),
    "manual_sgd_update.py": ("with torch.no_grad(): w -= lr * w.grad",),
    "wgan_weight_clip.py": ("with torch.no_grad(): p.clamp_(-0.01, 0.01)",),
    "yolo_split_decode.py": ("xy = xy.sigmoid()",),
}


def _marks(path: Path) -> dict[str, int]:
    return {role: number for number, role in marked_lines(path, MARK)}


def _fix(name: str) -> str:
    return FIX.search((CASES / name).read_text()).group(1)


def test_corpus_covers_both_fixes() -> None:
    assert len(FAILING) >= 8 and len(CLEAN) >= 2
    assert sorted(FIXES) == FAILING
    assert {_fix(name) for name in FAILING} == {"no_grad", "out_of_place", "clone"}


@pytest.mark.parametrize("name", FAILING)
def test_report_names_the_making_line_and_the_write(name: str, runs: dict) -> None:
    proc, report, _ = runs[name]
    assert_error_report(proc, report, KIND[_fix(name)], f"{FOLDER}/{name}")
    marks = _marks(CASES / name)
    expected = [("made by", marks["made"]), ("written by", marks["written"])]
    assert [(s["role"], s["line"]) for s in report["sites"]] == expected


@pytest.mark.parametrize("name", FAILING)
def test_applied_fix_runs_clean(name: str, runs: dict) -> None:
    _, report, patched = runs[name]
    fix = _fix(name)
    marks = _marks(CASES / name)
    expected_line = marks["made"] if fix == "clone" else marks["written"]
    assert [p["line"] for p in report["patches"]] == [expected_line], report["fix"]
    code = report["patches"][0]["code"]
    assert TOKEN[fix] in code
    assert patched_lines(report) == FIXES[name]
    assert TOKEN[fix] in report["fix"] if fix == "no_grad" else f"`{code}`" in report["fix"]
    assert (patched.returncode, patched.stdout, patched.stderr) == (0, "", "")


@pytest.mark.parametrize("name", CLEAN)
def test_clean_programs_report_nothing(name: str) -> None:
    assert_reports_nothing(run_doctor(f"{FOLDER}/{name}"))


def test_watch_raises_pytorch_error_with_the_report() -> None:
    with pytest.raises(RuntimeError) as plain:
        torch.zeros(2, requires_grad=True).add_(1)
    with pytest.raises(inplace_doctor.InplaceWriteError) as info, inplace_doctor.watch():
        bias = torch.zeros(2, requires_grad=True)
        bias.add_(1)
    assert str(info.value) == str(plain.value)
    (report,) = info.value.reports
    assert [(role, site.code) for role, site in report.sites] == [
        ("made by", "bias = torch.zeros(2, requires_grad=True)"),
        ("written by", "bias.add_(1)"),
    ]
    assert [p.code for p in report.patches] == ["with torch.no_grad(): bias.add_(1)"]


def test_view_made_in_a_loop_header_is_cloned_there() -> None:
    with pytest.raises(inplace_doctor.InplaceWriteError) as info, inplace_doctor.watch():
        h = torch.randn(4, 3, requires_grad=True) * 2
        for part in h.split(2):
            part[0] = 0
    (report,) = info.value.reports
    assert [p.code for p in report.patches] == ["for part in [part.clone() for part in h.split(2)]:"]


def test_ipython_cell_magic_reports_a_view_write() -> None:
    cell = "h = torch.randn(4, 2, requires_grad=True) * 2\na, b = h.unbind(1)\na.mul_(2)\n"
    error, stderr = run_cell_magic(cell, inplace_doctor.InplaceWriteError)
    (report,) = error.reports
    assert [(role, site.line) for role, site in report.sites] == [("made by", 2), ("written by", 3)]
    assert [p.code for p in report.patches] == ["a = a.mul(2)"]
    assert "made by:     unbind at <doctor-cell-" in stderr


def test_pytest_plugin_attaches_the_view_write_report(tmp_path: Path) -> None:
    proc = run_pytest_plugin(
        tmp_path, "import torch\n\n\ndef test_init():\n    w = torch.empty(3, requires_grad=True)\n    w.normal_()\n"
    )
    assert proc.returncode == 1, proc.stdout
    assert "made by:     torch.empty at test_model.py:5" in proc.stdout
    assert "with torch.no_grad(): w.normal_()" in proc.stdout
