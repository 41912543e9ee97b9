"""The fixes of in-place reports that no rewritten line makes: the hunk form of a patch and the edits read
from a program's source (``inplace_doctor.edits``), on small programs written into tmp_path.

The corpus runs (``tests/test_doctor_cases.py``) verify these edits on whole programs; here each edit is
checked against the exact text it must produce, including the cases where it must not be made.
"""

from __future__ import annotations

import linecache
from pathlib import Path

import pytest
from inplace_doctor.edits import clone_before_write, clone_saved_operand, merge_backward_calls, move_after_backward
from inplace_doctor.report import Patch, Site, apply_patches


def _program(tmp_path: Path, text: str) -> str:
    (tmp_path / "prog.py").write_text(text)
    linecache.checkcache(str(tmp_path / "prog.py"))
    return str(tmp_path)


def _site(line: int, in_backward: bool = False) -> Site:
    return Site("aten::add_", "prog.py", line, "", "MainThread", in_backward)


def _edited(tmp_path: Path, patch: Patch | None) -> str:
    assert patch is not None
    return apply_patches((tmp_path / "prog.py").read_text(), [patch])


def test_single_line_patch_keeps_its_form_and_indentation() -> None:
    patch = Patch("a.py", 2, "y = y + 1")
    assert patch.to_dict() == {"file": "a.py", "line": 2, "code": "y = y + 1"}
    assert Patch.from_dict(patch.to_dict()) == patch
    assert patch.apply("if x:\n    y += 1\n") == "if x:\n    y = y + 1\n"
    assert patch.describe() == "  change:      a.py:2 to\n                   y = y + 1"


def test_hunk_replaces_its_lines_as_written_and_patches_use_the_original_numbers() -> None:
    hunk = Patch("a.py", 2, "c\n    b", 3)
    assert hunk.to_dict() == {"file": "a.py", "line": 2, "code": "c\n    b", "end": 3}
    assert Patch.from_dict(hunk.to_dict()) == hunk
    assert hunk.summary() == "`c / b` at a.py:2-3"
    assert hunk.describe() == "  change:      a.py:2-3 to\n                   c\n                       b"
    # The hunk adds a line before line 5; line 5 is still the source's line 5.
    source = "a\nb\nc\nd\ne\n"
    assert apply_patches(source, [hunk, Patch("a.py", 5, "E")]) == "a\nc\n    b\nd\nE\n"
    assert apply_patches(source, [Patch("a.py", 1, "a0\na", 1)]) == "a0\na\nb\nc\nd\ne\n"


def test_optimiser_step_moves_after_the_backward_that_follows_it(tmp_path: Path) -> None:
    root = _program(tmp_path, "for batch in data:\n    loss = f(batch)\n    opt.step()\n    log(loss)\n"
                              "    loss.backward()\n    opt.zero_grad()\n")
    assert _edited(tmp_path, move_after_backward(_site(3), root, out_of_hook=False)) == (
        "for batch in data:\n    loss = f(batch)\n    log(loss)\n    loss.backward()\n    opt.step()\n"
        "    opt.zero_grad()\n")


def test_a_step_moved_past_another_optimisers_backward_keeps_that_backward_to_its_parameters(tmp_path: Path) -> None:
    """The GAN order: D steps before G's backward; moved after it, G's backward must not add into D's gradients."""
    root = _program(tmp_path, "opt_g = torch.optim.Adam(G.parameters())\nloss_d.backward(retain_graph=True)\n"
                              "opt_d.step()\nloss_g.backward()\nopt_g.step()\n")
    assert _edited(tmp_path, move_after_backward(_site(3), root, out_of_hook=False)) == (
        "opt_g = torch.optim.Adam(G.parameters())\nloss_d.backward(retain_graph=True)\n"
        "loss_g.backward(inputs=list(G.parameters()))\nopt_d.step()\nopt_g.step()\n")


def test_the_whole_loop_around_a_data_write_moves(tmp_path: Path) -> None:
    root = _program(tmp_path, "score = critic(x)\nfor p in critic.parameters():\n    p.data.clamp_(-1, 1)\n"
                              "torch.autograd.grad(score, w)\n")
    assert _edited(tmp_path, move_after_backward(_site(3), root, out_of_hook=False)) == (
        "score = critic(x)\ntorch.autograd.grad(score, w)\nfor p in critic.parameters():\n    p.data.clamp_(-1, 1)\n")


def test_a_hook_write_leaves_the_hook_only_when_it_uses_none_of_its_names(tmp_path: Path) -> None:
    text = ("def hook(module, grad_in, grad_out):\n    with torch.no_grad():\n        w.mul_(0.9)\n\n\n"
            "m.register_full_backward_hook(hook)\nm(x).sum().backward()\n")
    root = _program(tmp_path, text)
    assert _edited(tmp_path, move_after_backward(_site(3, True), root, out_of_hook=True)) == (
        "def hook(module, grad_in, grad_out):\n    pass\n\n\nm.register_full_backward_hook(hook)\n"
        "m(x).sum().backward()\nwith torch.no_grad():\n    w.mul_(0.9)\n")
    assert move_after_backward(_site(3, True), root, out_of_hook=False) is None  # not a hook: stays in place
    root = _program(tmp_path, text.replace("w.mul_(0.9)", "module.weight.mul_(0.9)"))
    assert move_after_backward(_site(3, True), root, out_of_hook=True) is None


@pytest.mark.parametrize("text", [
    "class Block:\n    def forward(self):\n        self.s.mul_(2)\n\n\nout.backward()\n",  # a method, not a statement
    "opt.step()\nprint(loss)\n",  # no backward after the write
])
def test_no_move_without_a_backward_in_the_same_block(text: str, tmp_path: Path) -> None:
    line = next(n for n, code in enumerate(text.splitlines(), 1) if "_(" in code or ".step()" in code)
    assert move_after_backward(_site(line), _program(tmp_path, text), out_of_hook=False) is None


def test_two_backward_calls_on_one_graph_become_one(tmp_path: Path) -> None:
    root = _program(tmp_path, "import torch\n\nif True:\n    a.backward(retain_graph=True)\n    b.backward()\n")
    assert _edited(tmp_path, merge_backward_calls("prog.py", root)) == (
        "import torch\n\nif True:\n    torch.autograd.backward([a, b])\n")
    assert merge_backward_calls("prog.py", _program(tmp_path, "import torch\na.backward()\nb.backward()\n")) is None


def test_slice_assignment_writes_a_copy(tmp_path: Path) -> None:
    root = _program(tmp_path, "def f(p):\n    p[..., :2] = p[..., :2].sigmoid()  # decode\n    return p\n")
    assert _edited(tmp_path, clone_before_write(_site(2), root)) == (
        "def f(p):\n    p = p.clone()\n    p[..., :2] = p[..., :2].sigmoid()\n    return p\n")
    assert clone_before_write(_site(2), _program(tmp_path, "x = 1\nself.p[0] = 0\n")) is None


def test_saving_line_copies_the_operand_that_was_written(tmp_path: Path) -> None:
    root = _program(tmp_path, "self.scale.mul_(0.9)\nout = (h * block.scale).sum()  # saved\n")
    patch = clone_saved_operand(_site(2), _site(1), root)
    assert patch == Patch("prog.py", 2, "out = (h * block.scale.clone()).sum()")
    twice = _program(tmp_path, "scale.mul_(0.9)\nout = scale * scale\n")
    assert clone_saved_operand(_site(2), _site(1), twice) is None  # which use autograd saved is not known
