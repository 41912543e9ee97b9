"""Converters that run as processes of their own (onnx2tf, PNNX, MNN's, X2Paddle, tensorflowjs_converter): a failure,
an output not written or a converter that never finishes is one line naming it and the last line it printed. A
converter failing inside this process is one line naming the format and its error; an ONNX opset PyTorch cannot
write is refused before anything runs."""

import argparse
import sys

import pytest
import torch
from conftest import detecting_yolov5n

from yolotrain.checkpoint import save_checkpoint
from yolotrain.interop import add_export_arguments, export, run_export
from yolotrain.interop.exporting.exporter import MAX_OPSET
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



def export_command(tmp_path, *arguments: str) -> int:
    weights = save_checkpoint(tmp_path / "out" / "best", detecting_yolov5n(["a", "b"]))
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    return run_export(parser.parse_args(["--weights", str(weights), "--img-size", "64", *arguments]))


def test_an_opset_pytorch_cannot_write_is_one_line_before_anything_runs(tmp_path, capsys):
    """Past the newest opset it writes, PyTorch's exporter fails deep inside after printing its whole graph."""
    assert MAX_OPSET >= 17
    assert export_command(tmp_path, "--format", "onnx", "--opset", str(MAX_OPSET + 1)) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.splitlines() == [
        f"yolotrain export: error: opset must be 17 to {MAX_OPSET} (the newest PyTorch's ONNX exporter writes), got "
        f"{MAX_OPSET + 1}"]
    assert not list((tmp_path / "out").glob("*.onnx"))


def test_a_converter_failing_inside_this_process_is_one_line_naming_the_format(tmp_path, monkeypatch, capsys):
    def unsupported(*args, **kwargs):
        raise RuntimeError("Exporting the operator 'aten::fancy' to ONNX is not supported.\nPlease report it.")

    monkeypatch.setattr(torch.onnx, "export", unsupported)
    with pytest.raises(ConversionError) as error:
        export(detecting_yolov5n(["a", "b"]), "onnx", out=tmp_path / "model.onnx", img_size=64)
    assert str(error.value) == ("ONNX conversion failed: RuntimeError: Exporting the operator 'aten::fancy' to ONNX "
                                "is not supported.")
    assert isinstance(error.value.__cause__, RuntimeError)  # the library's own error, for whoever debugs it
    assert export_command(tmp_path, "--format", "onnx") == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.splitlines()[-1].startswith(
        "yolotrain export: error: ONNX conversion failed: RuntimeError: Exporting the operator")
    assert list(tmp_path.glob("*.onnx")) == [] and not list((tmp_path / "out").glob("*.onnx"))
