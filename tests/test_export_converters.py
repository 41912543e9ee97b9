"""Converters that run as processes of their own (onnx2tf, PNNX, MNN's, X2Paddle, tensorflowjs_converter): a failure,
an output not written or a converter that never finishes is one line naming it and the last line it printed."""

import sys

import pytest

from yolotrain.interop.formats import ConversionError
from yolotrain.interop.formats._common import run_converter

FAILURE = "the converter could not convert the model"


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_an_exit_status_is_the_failure_with_the_last_line_printed(tmp_path):
    code = "import sys; print('step 1'); print('Traceback ...', file=sys.stderr); sys.exit('KeyError: conv7')"
    with pytest.raises(ConversionError) as error:
        run_converter(python(code), FAILURE, lambda printed: True, tmp_path)
    assert str(error.value) == f"{FAILURE} (KeyError: conv7)"


def test_a_converter_that_writes_nothing_fails_though_it_exits_well(tmp_path):
    made = tmp_path / "model.bin"
    with pytest.raises(ConversionError, match=r"^the converter could not convert the model \(done\)$"):
        run_converter(python("print('done')"), FAILURE, lambda printed: made.is_file(), tmp_path)
    with pytest.raises(ConversionError, match=r"\(exit status 0\)$"):  # nothing printed at all
        run_converter(python("pass"), FAILURE, lambda printed: made.is_file(), tmp_path)


def test_what_it_printed_and_its_working_folder_are_what_it_is_judged_by(tmp_path):
    code = "import pathlib; pathlib.Path('model.bin').write_bytes(b'x'); print('Converted Success')"
    run_converter(python(code), FAILURE, lambda printed: "Converted Success" in printed
                  and (tmp_path / "model.bin").is_file(), tmp_path)
    with pytest.raises(ConversionError, match=r"\(Converted\)$"):
        run_converter(python("print('Converted')"), FAILURE, lambda printed: "Converted Success" in printed, tmp_path)


def test_a_converter_past_its_time_is_stopped(tmp_path):
    with pytest.raises(ConversionError, match=r"^the converter could not convert the model \(stopped after 1 s\)$"):
        run_converter(python("import time; time.sleep(60)"), FAILURE, lambda printed: True, tmp_path, timeout_s=1)

