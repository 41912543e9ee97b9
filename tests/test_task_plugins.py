"""Tasks are plug-ins: the shared code asks a task (``yolotrain.task.get_task``) instead of comparing task
names or checking model classes, and the registry finds each task's package by name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from yolotrain.settings import ConfigError
from yolotrain.task import Task, get_task, task_names, task_of

SRC = Path(__file__).resolve().parents[1] / "src" / "yolotrain"
TASK_NAME = r'"(?:detect|segment|classify)"'
# What counts as a branch on a task outside its package: a comparison against a task's name (either
# side, or membership in a literal tuple of names), an isinstance check on a task's model, head, metrics or
# result class, a call of an `is_classifier...` test (its definition, in the model, is not a branch), and a branch on a
# derived `segment` flag.
TASK_BRANCH = re.compile(
    rf"(?:==|!=)\s*{TASK_NAME}|{TASK_NAME}\s*(?:==|!=)|\bin\s*\(\s*{TASK_NAME}"
    r"|isinstance\([^)]*\b(?:Yolov5\b|Classif\w*|Segment\w*|Detect(?!or\b)\w*)"
    r"|(?<!def )\bis_classifier"
    r"|\b(?:if|and|or|not)\s+(?:self\.)?segment\b(?!\s*[=(\[])|\b(?:self\.)?segment\s+(?:and|or|else)\b"
)


def task_branches() -> list[str]:
    """``path:line: text`` of every task branch in the shared code (outside the plug-ins: ``tasks/`` and the model
    families' ``families/``, which know their own models)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC)
        if relative.parts[0] in ("tasks", "families"):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            found += [f"{relative}:{number}: {line.strip()}"] * len(TASK_BRANCH.findall(code))
    return found


def test_the_shared_code_does_not_branch_on_tasks():
    assert task_branches() == []


def test_the_branch_count_sees_each_kind_of_branch():
    lines = ['if model.task == "segment":', 'x = "classify" != task', 'if task in ("detect", "segment"):',
             "if isinstance(model, (Yolov5, Classifier)):", "if is_classifier_name(name):",
             "if self.segment and plots:", "y = a if segment else b", "if isinstance(result, ClassifyResult):",
             "isinstance(metrics, SegmentationStats)"]
    assert [len(TASK_BRANCH.findall(line)) for line in lines] == [1] * 9
    assert not TASK_BRANCH.findall("if isinstance(source, Detector):")  # the protocol every model has
    assert not TASK_BRANCH.findall('segment = model.task_outputs  # "segment" as a word')
    assert not TASK_BRANCH.findall("def is_classifier_name(name: str) -> bool:")


@pytest.mark.parametrize("name", ["detect", "segment", "classify"])
def test_each_task_is_found_by_its_name(name):
    task = get_task(name)
    assert isinstance(task, Task) and task.name == name and get_task(name) is task
    assert name in task_names()


def test_a_model_is_asked_for_its_task_by_name():
    class Carrier:
        task = "segment"

    assert task_of(Carrier()) is get_task("segment")


def test_an_unknown_task_is_one_line():
    with pytest.raises(ConfigError,
                       match=r"^unknown task 'panoptic': expected one of detect, segment, classify, pose$"):
        get_task("panoptic")
