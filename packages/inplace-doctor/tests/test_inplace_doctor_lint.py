"""Static lint of in-place hazards (inplace-doctor --lint)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from inplace_doctor.cli import main
from inplace_doctor.fixes import out_of_place
from inplace_doctor.lint import lint_source

HAZARDS = textwrap.dedent(
    """
    import torch
    from torch import nn
    import torch.nn.functional as F


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU(inplace=True)          # 10 inplace_flag
            self.count = 0

        def forward(self, x, scale: float = 1.0):
            y = x.sigmoid()
            y += 1                                     # 15 augmented
            y[..., :2] = y[..., :2] * 2                # 16 slice_assign
            y[y > 3] = 0                               # 17 slice_assign
            y.clamp_(max=4)                            # 18 inplace_method
            self.conv.weight.data = y                  # 19 data_write
            self.conv.weight.data.mul_(2)              # 20 data_write
            z = F.relu(y, inplace=True)                # 21 inplace_flag
            self.count += 1
            n = 0
            n += 1
            names = []
            names += ["a"]
            for i in range(3):
                i += 1
            parts = {}
            parts["k"] = y
            scale *= 2
            y.requires_grad_()
            z.add_(1)  # doctor: ok
            return z


    def yolo_loss(pred, targets):
        total = torch.zeros(1)
        total += pred.sum()                            # 39 augmented
        return total


    def helper(x):
        x += 1
        return x
    """
)


def test_each_hazard_kind_is_found_at_its_line() -> None:
    found = {(f.line, f.kind) for f in lint_source(HAZARDS, "m.py")}
    assert found == {
        (10, "inplace_flag"),
        (15, "augmented"),
        (16, "slice_assign"),
        (17, "slice_assign"),
        (18, "inplace_method"),
        (19, "data_write"),
        (20, "data_write"),
        (21, "inplace_flag"),
        (39, "augmented"),
    }


def test_findings_carry_path_line_code_and_fix() -> None:
    finding = next(f for f in lint_source(HAZARDS, "pkg/m.py") if f.line == 15)
    assert finding.format().startswith("pkg/m.py:15: augmented: ")
    assert finding.code.startswith("y += 1")
    assert "x = x + y" in finding.hint


def test_cli_lint_exit_codes(tmp_path: Path, capsys) -> None:  # noqa: ANN001 - pytest fixture
    bad = tmp_path / "bad.py"
    bad.write_text(HAZARDS)
    good = tmp_path / "good.py"
    good.write_text("def forward(x):\n    return x + 1\n")
    assert main(["--lint", str(good)]) == 0
    assert main(["--lint", str(tmp_path)]) == 1
    assert f"{bad}:15: augmented" in capsys.readouterr().out


RIGHT_HAND_SIDES = ["g.norm() + 1e-12", "a - b", "a * b + 1", "a / b", "a", "2.0", "-a", "a ** 2", "b[0]"]


@pytest.mark.parametrize("operator", ["+", "-", "*", "/"])
@pytest.mark.parametrize("value", RIGHT_HAND_SIDES)
def test_proposed_out_of_place_assignment_computes_the_same(operator: str, value: str) -> None:
    g, a, b = torch.tensor([3.0, -4.0]), torch.tensor([1.5, 2.5]), torch.tensor([0.5, 4.0])
    inplace = {"g": g.clone(), "a": a, "b": b}
    exec(f"g {operator}= {value}", {}, inplace)
    fixed = {"g": g.clone(), "a": a, "b": b}
    exec(out_of_place("g", operator, value), {}, fixed)
    assert torch.allclose(inplace["g"], fixed["g"])


def test_normalising_a_gradient_keeps_the_epsilon_in_the_division() -> None:
    assert out_of_place("g", "/", "g.norm() + 1e-12") == "g = g / (g.norm() + 1e-12)"
    assert out_of_place("probs", "+", "1e-6") == "probs = probs + 1e-6"
