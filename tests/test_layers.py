"""The layers hold: import-linter's contracts (pyproject ``[tool.importlinter]``) and every import of the
project's own modules at the top of its module, where the structure can be read."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (ROOT / "src" / "yolotrain", ROOT / "packages" / "inplace-doctor" / "src" / "inplace_doctor")
OWN_PACKAGES = {"yolotrain", "inplace_doctor"}
# Imports of the project's own modules inside functions, each with its reason.
ALLOWED_INSIDE_FUNCTIONS = {
    # pytest loads the plugin in every session of every project that has the doctor installed: torch and
    # the doctor proper are imported only when --inplace-doctor is given.
    ("inplace_doctor/pytest_plugin.py", "api"),
    ("inplace_doctor/pytest_plugin.py", "view_write"),
    ("inplace_doctor/pytest_plugin.py", "report"),
    # The cell magic imports IPython, an optional dependency: only when IPython loads the extension.
    ("inplace_doctor/__init__.py", "ipython"),
    # The tuner's samplers subclass Optuna's, an optional dependency imported only when tuning.
    ("yolotrain/tuning/study.py", "samplers"),
    # `yolotrain doctor` starts with torch and the doctor alone: the console script imports the command line
    # (OpenCV, torchvision, the whole API) only for the other commands.
    ("yolotrain/entry.py", "cli"),
}


def imports_inside_functions(path: Path) -> list[tuple[int, str]]:
    """(line, module) of each import of the project's own modules made inside a function of ``path``."""
    found = []
    for function in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in OWN_PACKAGES):
                found.append((node.lineno, node.module or "."))
            elif isinstance(node, ast.Import):
                found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] in OWN_PACKAGES]
    return found


def test_the_projects_own_imports_are_at_module_top():
    inside = [f"{path.relative_to(source.parent)}:{line} imports {module}"
              for source in SOURCES for path in sorted(source.rglob("*.py"))
              for line, module in imports_inside_functions(path)
              if (str(path.relative_to(source.parent)), module) not in ALLOWED_INSIDE_FUNCTIONS]
    assert not inside, "imports of the project's own modules inside functions:\n" + "\n".join(inside)


def test_a_function_level_import_is_found(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from .data import shapes\n    import yolotrain.cli\n"
                      "    import json\n")
    assert imports_inside_functions(module) == [(4, "data"), (5, "yolotrain.cli")]


def test_the_import_contracts_hold():
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint_imports is None:
        pytest.skip("import-linter is not installed (pip install '.[test]')")
    out = subprocess.run([lint_imports, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "3 kept, 0 broken" in out.stdout
