"""Runs the doctor CLI on every program in tests/doctor_cases/, each in a process of its own
(forked from one that has imported torch: ``doctor_corpus.run_forked``).

Each failing case marks its true sites with ``# doctor: saved OP`` and
``# doctor: modified OP`` comments (also in files listed by ``# doctor-files:``);
``# doctor-mode: check`` cases do not raise and are run with ``--check``;
``# doctor-during: backward`` and ``# doctor-thread: PREFIX`` say that every modification
happens inside a backward pass, or on a thread whose name starts with PREFIX.
With a GPU the failing cases also run with CUDA as the default device.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import inplace_doctor
import pytest
import torch
from doctor_corpus import run_forked
from inplace_doctor.fixes import strip_comment
from inplace_doctor.report import Patch, apply_patches

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "tests" / "doctor_cases"
MARK = re.compile(r"#\s*doctor:\s*(saved|modified)\s+(\S+)")
MESSAGE = re.compile(r"\[(torch\.[\w.]+) \[([\d, ]*)\]\].*is at version (\d+); expected version (\d+) instead")
REPORT_KEYS = {
    "schema", "kind", "error", "tensor", "saved_by", "modified_by", "fix", "severity", "observed", "notes", "count",
    "patches",
}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]


@dataclass(frozen=True)
class Marks:
    saved: tuple[str, int, str]
    modified: frozenset[tuple[str, int]]
    modified_ops: frozenset[str]
    mode: str
    during_backward: bool
    thread_prefix: str | None


def _marks(case: Path) -> Marks:
    text = case.read_text()
    files = [case]
    extra = re.search(r"#\s*doctor-files:\s*(.+)", text)
    if extra:
        files += [CASES / name.strip() for name in extra.group(1).split(",")]
    saved: list[tuple[str, int, str]] = []
    modified: set[tuple[str, int]] = set()
    ops: set[str] = set()
    for path in files:
        rel = os.path.relpath(path, ROOT)
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            for kind, op in MARK.findall(line):
                if kind == "saved":
                    saved.append((rel, number, op))
                else:
                    modified.add((rel, number))
                    ops.add(op)
    assert len(saved) == 1, f"{case.name}: exactly one saved marker expected"
    mode = "check" if "# doctor-mode: check" in text else "error"
    thread = re.search(r"#\s*doctor-thread:\s*(\S+)", text)
    during_backward = "# doctor-during: backward" in text
    return Marks(saved[0], frozenset(modified), frozenset(ops), mode, during_backward, thread and thread.group(1))


FAILING = sorted(p.name for p in CASES.glob("[a-z]*.py") if not p.name.startswith("clean_"))
CLEAN = sorted(p.name for p in CASES.glob("clean_*.py"))
# Correct programs (hooks, checkpointing, threads, compile among them): no report, no output at all.
CLEAN_COMMANDS = [
    ("tests/doctor_cases/clean_training.py",),
    ("--check", "tests/doctor_cases/clean_gan.py"),
    ("--check", "tests/doctor_cases/clean_backward_features.py"),
    ("--check", "tests/doctor_cases/clean_compiled.py"),
]


def _run(*args: str, device: str = "cpu") -> subprocess.CompletedProcess[str]:
    # The doctor the tests import, whether installed or on the path, is the one the process runs; on the
    # CPU in a process forked from one that has imported torch (test_doctor.py runs `yolotrain doctor`
    # and `python -m yolotrain.doctor` themselves, and checks they print what `python -m inplace_doctor` does).
    if device == "cpu":
        return run_forked("-m", "inplace_doctor", *args, timeout=120)
    path = os.pathsep.join([str(ROOT / "src"), str(Path(inplace_doctor.__file__).parents[1])])
    env = dict(os.environ, PYTHONPATH=path, PYTHONWARNINGS="ignore")
    start = f"import sys, torch; torch.set_default_device({device!r}); from yolotrain.doctor.cli import main; "
    command = ["-c", start + "sys.exit(main(sys.argv[1:]))", *args]
    return subprocess.run(
        [sys.executable, *command],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )


def _case_args(name: str) -> tuple[str, ...]:
    mode = _marks(CASES / name).mode
    flags = ("--json", "--check") if mode == "check" else ("--json",)
    # The fixes no single rewritten line makes are candidates, proposed once a run verified one.
    verify = ("--verify-fix",) if name in NO_SINGLE_LINE else ()
    return (*flags, *verify, f"tests/doctor_cases/{name}")


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, ...], subprocess.CompletedProcess[str]]:
    """All subprocess runs, two at a time (each one mostly waits for ``import torch``)."""
    commands = [_case_args(name) for name in FAILING]
    commands += [
        *CLEAN_COMMANDS,
        ("tests/doctor_cases/clean_exit_code.py", "a", "--json"),
        ("tests/doctor_cases/sigmoid_iadd.py",),
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(commands, pool.map(lambda c: _run(*c), commands)))


def test_corpus_is_large_enough() -> None:
    assert len(FAILING) >= 12
    assert len({_marks(CASES / n).saved[2] for n in FAILING}) >= 6  # varied saving ops


@pytest.fixture(scope="module")
def cuda_results() -> dict[tuple[str, ...], subprocess.CompletedProcess[str]]:
    """The failing cases with CUDA as the default device."""
    commands = [_case_args(name) for name in FAILING]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(commands, pool.map(lambda c: _run(*c, device="cuda"), commands)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FAILING)
def test_case_report_names_exact_lines(name: str, device: str, request: pytest.FixtureRequest) -> None:
    marks = _marks(CASES / name)
    proc = request.getfixturevalue("results" if device == "cpu" else "cuda_results")[_case_args(name)]
    assert proc.returncode == 1, proc.stderr
    data = _trailing_json(proc.stdout)
    report = data if isinstance(data, dict) else _matching(data, marks)
    assert set(report) == (REPORT_KEYS | {"verification"} if name in NO_SINGLE_LINE else REPORT_KEYS)
    assert report["observed"] is True and report["severity"] == ("error" if marks.mode == "error" else "warning")
    assert set(report["tensor"]) == {"dtype", "shape", "device", "saved_version", "current_version"}
    saved = report["saved_by"]
    assert set(saved) == {"op", "file", "line", "code"}
    assert (saved["file"], saved["line"]) == marks.saved[:2]
    assert saved["op"] == marks.saved[2]
    assert "doctor: saved" in saved["code"]
    sites = {(m["file"], m["line"]) for m in report["modified_by"]}
    assert sites == marks.modified
    assert marks.modified_ops <= {m["op"] for m in report["modified_by"]}
    assert all("doctor: modified" in m["code"] for m in report["modified_by"])
    assert all(set(m) == {"op", "file", "line", "code", "thread", "in_backward"} for m in report["modified_by"])
    assert all(m["in_backward"] is marks.during_backward for m in report["modified_by"])
    prefix = marks.thread_prefix or "MainThread"
    assert all(m["thread"].startswith(prefix) for m in report["modified_by"])
    assert report["fix"]
    if marks.mode == "error":
        _assert_tensor_matches_message(report, device)


def _trailing_json(stdout: str) -> dict | list:
    """The report is the JSON document ending stdout, after whatever the script printed."""
    lines = stdout.splitlines()
    for start, line in enumerate(lines):
        if line in ("{", "["):
            try:
                return json.loads("\n".join(lines[start:]))
            except json.JSONDecodeError:
                continue
    raise AssertionError(f"no JSON report in: {stdout!r}")


def _matching(reports: list[dict], marks: Marks) -> dict:
    """In check mode several tensors may be reported; pick the one saved at the marked line."""
    for report in reports:
        if (report["saved_by"]["file"], report["saved_by"]["line"]) == marks.saved[:2]:
            return report
    raise AssertionError(f"no report for {marks.saved}")


def _assert_tensor_matches_message(report: dict, device: str) -> None:
    match = MESSAGE.search(report["error"])
    assert match, report["error"]
    type_name, shape, current, saved = match.groups()
    tensor = report["tensor"]
    assert tensor["shape"] == [int(s) for s in shape.split(",") if s.strip()]
    assert (tensor["current_version"], tensor["saved_version"]) == (int(current), int(saved))
    expected = "torch.FloatTensor" if device == "cpu" else "torch.cuda.FloatTensor"
    assert type_name == expected and tensor["dtype"] == "torch.float32"
    assert tensor["device"].split(":")[0] == device


def test_text_report_prints_path_line_for_each_site(results: dict) -> None:
    proc = results[("tests/doctor_cases/sigmoid_iadd.py",)]
    assert proc.returncode == 1
    assert "saved by:    aten::sigmoid at tests/doctor_cases/sigmoid_iadd.py:5" in proc.stderr
    assert "modified by: aten::add_ at tests/doctor_cases/sigmoid_iadd.py:6" in proc.stderr
    assert "`probs += 1e-6` updates `probs` in place; write `probs = probs + 1e-6`" in proc.stderr
    change = "change:      tests/doctor_cases/sigmoid_iadd.py:6 to\n                   probs = probs + 1e-6"
    assert change in proc.stderr


@pytest.mark.parametrize("command", CLEAN_COMMANDS)
def test_clean_programs_produce_no_report(command: tuple[str, ...], results: dict) -> None:
    proc = results[command]
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_script_sees_argv_main_and_keeps_its_exit_code(results: dict) -> None:
    proc = results[("tests/doctor_cases/clean_exit_code.py", "a", "--json")]
    assert proc.returncode == 3
    assert proc.stdout == "args: ['a', '--json'] main: __main__\n"
    assert proc.stderr == ""


# Failing cases that no rewrite of the writing line fixes; the report must say so and propose, once a run
# verified it, the edit each maps to here: (first line, last line or None for one changed line, code), the
# code without the programs' `# doctor:` comments.
NO_SINGLE_LINE = {
    # the copy of the buffer the checkpointed block writes again when it is recomputed
    "checkpoint_recompute.py": (23, None, "out = (h * block.scale.clone()).sum()"),
    # the .data clipping moves after backward
    "data_clamp_silent.py": (13, 15, "score.backward()\nfor p in critic.parameters():\n    p.data.clamp_(-0.01, 0.01)"),
    # the discriminator's step moves after the generator's backward, which still needs its weights and now
    # leaves the discriminator's gradients alone (inputs=), as the original order did
    "gan_two_optimizers.py": (
        19, 22, "loss_g = bce(d_fake, torch.ones(16, 1))\nopt_g.zero_grad()\n"
        "loss_g.backward(inputs=list(G.parameters()))\nopt_d.step()",
    ),
    # the hook's write to a parameter another node saved moves out of the hook, after backward
    "module_backward_hook.py": (
        16, 21, "    pass\n\n\nnorm.register_full_backward_hook(decay_tied_weight)\n"
        "norm(logits).logsumexp(-1).mean().backward()\nwith torch.no_grad():\n    embed.weight.mul_(0.999)",
    ),
    # one backward pass over both losses, so each per-parameter step runs once its gradient is whole
    "optimizer_in_backward.py": (23, 24, "torch.autograd.backward([loss_a, loss_b])"),
    # the assignment to the parametrized weight moves after backward
    "parametrize_assign.py": (22, 23, "loss.backward()\nlayer.weight = layer.weight.clamp(max=1.0)"),
    "step_before_backward.py": (12, 13, "loss.backward()\nopt.step()"),
    # a copy before the slice assignment into the tensor whose view was saved
    "yolo_pred_slice_assign.py": (13, 13, "pred = pred.clone()\npred[..., :2] = pred[..., :2].sigmoid() * 2 - 0.5"),
}
RECORDER = "tests/doctor_cases/_record_backward.py"


def _roots(proc: subprocess.CompletedProcess[str]) -> list[list[float]]:
    """The values the program called backward on, as ``_record_backward.py`` printed them."""
    line = next(line for line in proc.stdout.splitlines() if line.startswith("backward roots: "))
    return json.loads(line.removeprefix("backward roots: "))


@pytest.fixture(scope="module")
def fix_runs(results: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """Per failing case: its report, the doctor's run of the patched copy, and the unpatched forward values."""
    folder = tmp_path_factory.mktemp("patched")

    def run(name: str) -> tuple:
        data = _trailing_json(results[_case_args(name)].stdout)
        report = data if isinstance(data, dict) else _matching(data, _marks(CASES / name))
        if not report["patches"]:
            return report, None, None
        target = folder / Path(name).stem
        target.mkdir()
        for source in (CASES / name, CASES / "_helper_modules.py"):
            (target / source.name).write_text(source.read_text())
        for file in {patch["file"] for patch in report["patches"]}:
            path = target / Path(file).name
            patches = [Patch.from_dict(patch) for patch in report["patches"] if patch["file"] == file]
            path.write_text(apply_patches(path.read_text(), patches))
        check = ("--check",) if _marks(CASES / name).mode == "check" else ()
        patched = _run(*check, RECORDER, "run", str(target / name))
        intended = _run_python(RECORDER, "forward", f"tests/doctor_cases/{name}")
        return report, patched, intended

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(FAILING, pool.map(run, FAILING)))


def _run_python(*args: str) -> subprocess.CompletedProcess[str]:
    return run_forked(*args, timeout=120)


@pytest.mark.parametrize("name", FAILING)
def test_proposed_fix_runs_and_keeps_the_maths(name: str, fix_runs: dict) -> None:
    """The report's patch, applied to a copy, runs clean under the doctor and computes the same forward values
    (where no rewritten line fixes the program, the patch is the verified edit ``NO_SINGLE_LINE`` names)."""
    report, patched, intended = fix_runs[name]
    assert len(report["patches"]) == 1, report["fix"]
    if name in NO_SINGLE_LINE:
        assert "no rewrite of the writing line alone fixes this" in report["fix"]
        assert report["verification"]["verified"] is True, report["verification"]["detail"]
        (patch,) = report["patches"]
        code = "\n".join(strip_comment(line) for line in patch["code"].split("\n"))
        assert (patch["line"], patch.get("end"), code) == NO_SINGLE_LINE[name]
    else:
        assert "no rewrite of the writing line" not in report["fix"]
    assert (patched.returncode, patched.stderr) == (0, ""), patched.stderr
    assert intended.returncode == 0, intended.stderr
    assert _roots(intended) and _roots(patched) == [pytest.approx(values, rel=1e-6) for values in _roots(intended)]


def test_parametrized_assignment_fix_says_and_does_the_move_after_backward(fix_runs: dict) -> None:
    """The parametrization report names the right_inverse write and says to assign after backward; its verified
    patch (run and compared by ``test_proposed_fix_runs_and_keeps_the_maths``) is that move."""
    report, _, _ = fix_runs["parametrize_assign.py"]
    assert "`layer.parametrizations.weight.original` in place" in report["fix"]
    assert "make the assignment after the backward" in report["fix"]
    (patch,) = report["patches"]
    assert patch["line"] == report["modified_by"][0]["line"]
    assert patch["code"].split("\n")[0] == "loss.backward()"
