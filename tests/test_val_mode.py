"""val's mode (``--mode``, the reference's ``--task``): what val does (score or time), never the model's task."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from yolotrain.cli import build_parser
from yolotrain.eval.val import ValConfig, val, val_config

REQUIRED = ["val", "--weights", "w.pt", "--data", "data.yaml"]


@pytest.mark.parametrize("spelling", [["--mode", "speed"], ["--task", "speed"], ["mode=speed"], ["task=speed"],
                                      ["--task", "SPEED"]])
def test_the_mode_and_the_references_task_spelling_set_one_setting(spelling):
    assert val_config(build_parser().parse_args([*REQUIRED, *spelling])).mode == "speed"


@pytest.mark.parametrize("spelling", [[], ["--mode", "val"], ["--task", "val"]])
def test_val_is_the_default_mode_in_either_spelling(spelling):
    assert val_config(build_parser().parse_args([*REQUIRED, *spelling])).mode == "val"


def test_task_is_no_setting_or_keyword_of_val():
    assert "task" not in {f.name for f in dataclasses.fields(ValConfig)}
    assert "task" not in inspect.signature(val).parameters
    assert inspect.signature(val).parameters["mode"].default == "val"


def test_a_mode_val_lacks_is_refused_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([*REQUIRED, "--task", "study"])
    assert "invalid choice: 'study'" in capsys.readouterr().err
