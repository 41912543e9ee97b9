"""What starting up imports: ``import yolotrain`` loads its public names on first use, and ``yolotrain doctor``
starts with the doctor alone (neither OpenCV, torchvision nor the command line). Each case runs in a fresh
interpreter, where ``sys.modules`` says what was imported."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import inplace_doctor

import yolotrain

ROOT = Path(__file__).resolve().parents[1]
# Modules the doctor and a bare `import yolotrain` do without: each costs seconds of start-up.
HEAVY = ("cv2", "torchvision", "yolotrain.cli", "yolotrain.engine")
LOADED_AT_EXIT = """
import atexit, json, sys
atexit.register(lambda: print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)), file=sys.stderr))
"""


def python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -c code`` in ``cwd`` on this checkout's sources."""
    sources = [str(ROOT / "src"), str(Path(inplace_doctor.__file__).parents[1])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sources), PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def heavy_modules_at_exit(result: subprocess.CompletedProcess) -> list[str]:
    return json.loads(result.stderr.strip().splitlines()[-1])


def test_import_yolotrain_imports_none_of_the_api(tmp_path):
    result = python(LOADED_AT_EXIT.format(heavy=HEAVY) + "import yolotrain\nprint(yolotrain.__version__)", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0.1.0"
    assert heavy_modules_at_exit(result) == []


def test_every_public_name_resolves_to_its_modules_object(tmp_path):
    code = """
import yolotrain
from yolotrain.interop import resolve_trainable
from yolotrain.track.run import track
from yolotrain.yolo import YOLO
names = [name for name in yolotrain.__all__ if getattr(yolotrain, name) is not None]
print(names == yolotrain.__all__, set(yolotrain.__all__) <= set(dir(yolotrain)))
print(yolotrain.load is resolve_trainable, yolotrain.track is track, yolotrain.YOLO is YOLO)
namespace = {}
exec("from yolotrain import *", namespace)
print(sorted(set(namespace) - {"__builtins__"}) == sorted(yolotrain.__all__))
"""
    result = python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True"] * 6
    missing = python("import yolotrain\nyolotrain.no_such_name", tmp_path)
    assert "AttributeError: module 'yolotrain' has no attribute 'no_such_name'" in missing.stderr


def test_the_names_type_checkers_read_are_the_public_names():
    tree = ast.parse((ROOT / "src" / "yolotrain" / "__init__.py").read_text())
    checking = next(node for node in tree.body
                    if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    imported = [alias.asname or alias.name for node in checking.body for alias in node.names]
    assert sorted(imported) == sorted(yolotrain.__all__)


def test_yolotrain_track_is_the_function_whichever_is_imported_first(tmp_path):
    subpackage_first = "import yolotrain.track.trackers\nfrom yolotrain import track\nimport yolotrain\n"
    function_first = "from yolotrain import track\nimport yolotrain.track.trackers\nimport yolotrain\n"
    check = ("from yolotrain.track.run import track as function\nfrom yolotrain.track import make_tracker\n"
             "print(track is function, yolotrain.track is function, callable(make_tracker))")
    for code in (subpackage_first, function_first):
        result = python(code + check, tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["True", "True", "True"], code


def test_the_doctor_command_starts_without_the_command_line(tmp_path):
    (tmp_path / "step.py").write_text("import torch\nx = torch.ones(3, requires_grad=True)\n"
                                      "(x.sigmoid() * 2).sum().backward()\nprint(x.grad.shape)\n")
    launchers = {  # the console script's function, and what `python -m yolotrain` runs
        "console script": "from yolotrain.entry import main\nsys.exit(main(['doctor', 'step.py']))",
        "python -m": "import runpy\nsys.argv = ['yolotrain', 'doctor', 'step.py']\n"
                     "runpy.run_module('yolotrain', run_name='__main__', alter_sys=True)",
    }
    for name, launch in launchers.items():
        result = python(LOADED_AT_EXIT.format(heavy=HEAVY) + launch, tmp_path)
        assert result.returncode == 0, (name, result.stderr)
        assert result.stdout.strip() == "torch.Size([3])", name
        assert heavy_modules_at_exit(result) == [], name


def test_other_commands_go_to_the_command_line(tmp_path):
    result = python("import sys\nfrom yolotrain.entry import main\nsys.exit(main(['--version']))", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "yolotrain 0.1.0"
