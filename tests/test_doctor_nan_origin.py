"""The doctor's ``--nan`` mode: the corpus in tests/doctor_cases/nan_origin/.

Each failing program marks the line of the first non-finite forward value (``# doctor: first OP``),
of the op that made the NaN (``# doctor: forward OP``) or of the forward call that recorded the
backward node whose gradient went non-finite (``# doctor: backward NODE``). The doctor runs as a
process of its own (``doctor_corpus.run_forked``); its patch is applied to a copy of the program,
which must then run to the end under ``--nan`` with nothing reported. ``clean_*`` programs must
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
    run_doctor,
    runs_fixture,
)

MARK = re.compile(r"#\s*doctor:\s*(.+?)\s*$")
ROLES = {"first": "non-finite", "forward": "forward op", "backward": "backward node"}
CORPUS = corpus("nan_origin")
FOLDER, CASES, FAILING, CLEAN = CORPUS
# Programs whose repair is a guess only a run can check (their `# doctor-options: --verify-fix`), and what
# the fix must say besides the verified change.
VERIFIED = {"autocast_fp16_attention.py": "overflowed float16", "lr_blowup.py": "lower the learning rate"}
runs = runs_fixture(CORPUS, "--nan")
# Per failing program, its fixed version: the changed lines as they should read, in line order. The doctor's
# patches must be these lines, and the copy they make must run clean.
FIXES = {
    "acos_angle_loss.py": ("angle = torch.acos(cosine.clamp(-0.999999, 0.999999))",),
    "acos_cosine_rounding.py": ("angle = torch.acos(cosine.clamp(-0.999999, 0.999999))",),
    # the scores computed in float32 out of autocast, which would cast float32 inputs back to float16
    "autocast_fp16_attention.py": (
        "with torch.autocast(\"cpu\", enabled=False): scores = q.float() @ k.transpose(-1, -2).float()",
    ),
    "cosine_zero_norm.py": ("embeddings = features / features.norm(dim=1, keepdim=True).clamp_min(1e-12)",),
    "custom_function_backward_div.py": ("return grad / (1 + norm) * x / norm.clamp_min(1e-12)",),
    "exp_loss_overflow.py": ("loss = torch.exp((-y * scores * 10).clamp(max=79.0)).mean()",),
    "logdet_negative_det.py": ("loss = -torch.linalg.slogdet(matrices).logabsdet.mean()",),
    # the learning rate 10, 100, 1000 times lower are run in turn; 5.0 / 1000 is the first that trains finite
    "lr_blowup.py": ("opt = torch.optim.SGD(model.parameters(), lr=0.005)",),
    "masked_entropy_log.py": (
        "entropy = -torch.where(p > 0, p * torch.log(torch.where(p > 0, p, 1.0)), torch.zeros_like(p)).sum(1).mean()",
    ),
    "pairwise_sqrt_backward.py": ("dist = diff.pow(2).sum(-1).clamp_min(1e-12).sqrt()",),
    "rms_zero_pow.py": ("magnitude = (features ** 2).sum(-1).clamp_min(1e-12) ** 0.5",),
    "signed_sqrt_where.py": (
        "signed_root = torch.where(z >= 0, torch.sqrt(z.clamp_min(1e-12)), -torch.sqrt((-z).clamp_min(1e-12)))",
    ),
    "softmax_log_underflow.py": ("log_probs = torch.log_softmax(model(x) / temperature, dim=1)",),
}


def _marks(path: Path) -> set[tuple[str, str, int]]:
    """(role, op, line) for every ``# doctor: ROLE OP [ROLE OP]`` mark."""
    found = set()
    for number, mark in marked_lines(path, MARK):
        words = mark.split()
        found |= {(ROLES[role], op, number) for role, op in zip(words[::2], words[1::2])}
    return found


def test_corpus_size() -> None:
    assert len(FAILING) >= 8 and len(CLEAN) >= 2
    assert sorted(FIXES) == FAILING


@pytest.mark.parametrize("name", FAILING)
def test_report_names_the_origin(name: str, runs: dict) -> None:
    proc, report, _ = runs[name]
    assert_error_report(proc, report, "nan_origin", f"{FOLDER}/{name}")
    assert {(s["role"], s["op"], s["line"]) for s in report["sites"]} == _marks(CASES / name)
    assert any(re.search(r"min \S+ max \S+, nan (yes|no), inf (yes|no)", note) for note in report["notes"])


@pytest.mark.parametrize("name", FAILING)
def test_applied_fix_runs_clean(name: str, runs: dict) -> None:
    _, report, patched = runs[name]
    first = min(line for _, _, line in _marks(CASES / name))
    if name == "lr_blowup.py":  # the learning rate is set where the optimiser is made
        first = next(n for n, line in enumerate((CASES / name).read_text().splitlines(), 1) if "lr=" in line)
    assert [p["line"] for p in report["patches"]] == [first], report["fix"]
    assert f"`{report['patches'][0]['code']}`" in report["fix"]
    assert patched_lines(report) == FIXES[name]
    assert (patched.returncode, patched.stdout, patched.stderr) == (0, "", "")


@pytest.mark.parametrize("name", sorted(VERIFIED))
def test_guessed_fix_is_proposed_once_a_run_verified_it(name: str, runs: dict) -> None:
    _, report, _ = runs[name]
    assert VERIFIED[name] in report["fix"] and "a run verified the change" in report["fix"]
    assert report["verification"]["verified"] is True, report["verification"]["detail"]
    assert [patch["code"] for patch in report["verification"]["tried"]] == list(FIXES[name])


@pytest.mark.parametrize("name", CLEAN)
def test_clean_programs_report_nothing(name: str) -> None:
    assert_reports_nothing(run_doctor("--nan", f"{FOLDER}/{name}"))


def test_yolotrain_doctor_text_report_names_the_backward_node() -> None:
    proc = run_doctor("doctor", "--nan", f"{FOLDER}/pairwise_sqrt_backward.py", module="yolotrain")
    assert proc.returncode == 1
    assert "doctor error: Function 'SqrtBackward0' returned inf values in its gradient" in proc.stderr
    assert f"backward node: SqrtBackward0 at {FOLDER}/pairwise_sqrt_backward.py:11" in proc.stderr
    assert "dist = diff.pow(2).sum(-1).clamp_min(1e-12).sqrt()" in proc.stderr


def test_watch_nan_stops_at_the_forward_op_with_its_input_ranges() -> None:
    scores = torch.tensor([[0.0, 3.0], [0.0, 0.0]], requires_grad=True)
    with pytest.raises(inplace_doctor.NanOriginError) as info, inplace_doctor.watch(nan=True):
        total = scores.sum(1, keepdim=True)
        share = scores / total
        share.mean().backward()
    (report,) = info.value.reports
    assert str(info.value) == "`div` returned nan values (they reached `mean`)"
    assert [(role, site.op, site.code) for role, site in report.sites] == [
        ("forward op", "div", "share = scores / total")
    ]
    assert "div: input 1: float32 [2, 1] min 0 max 3, nan no, inf no" in report.notes
    assert [p.code for p in report.patches] == ["share = scores / total.clamp_min(1e-12)"]


def test_watch_without_nan_and_masked_values_without_backward_stop_nothing() -> None:
    x = torch.tensor([0.0, 4.0], requires_grad=True)
    with inplace_doctor.watch():
        torch.sqrt(x).sum().backward()
    assert torch.isinf(x.grad).any()
    with inplace_doctor.watch(nan=True), torch.no_grad():
        safe = torch.where(x > 0, x * torch.log(x), 0.0)
    assert safe.tolist() == [0.0, 4.0 * float(torch.log(torch.tensor(4.0)))]
