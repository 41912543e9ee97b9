"""Model files that are programs need trust; outputs never overwrite inputs; run-folder locks; file modes."""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path

import pytest
import torch

from yolotrain import Yolov5, load, predict, val
from yolotrain.checkpoint import CheckpointError
from yolotrain.cli import main
from yolotrain.data import generate_shapes_dataset
from yolotrain.interop import export, load_exported
from yolotrain.interop.trust import UntrustedModelError

SIZE = 64


class _Hostile(torch.nn.Module):
    """A TorchScript program that creates files named after ``target``: ``.load`` when the archive is
    loaded (its ``__setstate__`` runs), ``.run`` when it is called. ``torch.from_file(shared=True)``
    creates the file it maps."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        written = torch.from_file(self.target + ".run", shared=True, size=16)
        return x + written.sum()

    @torch.jit.export
    def __getstate__(self) -> tuple[str, bool]:
        return (self.target, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[str, bool]) -> None:
        self.target = state[0]
        written = torch.from_file(self.target + ".load", shared=True, size=16)
        self.training = bool(written.sum() == 0.0) and state[1]


def hostile_torchscript(path: Path, target: Path) -> Path:
    """A hostile TorchScript file that claims, in our metadata's form, to be a yolotrain export."""
    claimed = {"producer": "yolotrain", "model": "yolov5n", "nc": "2", "img_size": "[64, 64]", "precision": "fp32"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # TorchScript is deprecated upstream
        torch.jit.save(torch.jit.script(_Hostile(str(target))), str(path),
                       _extra_files={"config.json": json.dumps(claimed)})
    return path


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    return generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=4, n_val=4, img_size=SIZE)


@pytest.fixture(scope="module")
def own_export(tmp_path_factory) -> Path:
    """A TorchScript export of a 2-class detector, written by yolotrain export."""
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2, names=["circle", "rectangle"]).eval()
    return export(model, "torchscript", out=tmp_path_factory.mktemp("export") / "own.torchscript", img_size=SIZE)


def test_a_hostile_torchscript_is_refused_before_any_of_it_runs(tmp_path, shapes, capsys):
    target = tmp_path / "pwned"
    hostile = hostile_torchscript(tmp_path / "hostile.torchscript", target)
    images = sorted((shapes / "images" / "val").iterdir())[:1]
    for load_it in (lambda: load_exported(hostile),
                    lambda: val(str(hostile), str(shapes / "data.yaml"), img_size=SIZE, workers=0, verbose=False),
                    lambda: predict(hostile, images, img_size=SIZE)):
        with pytest.raises(UntrustedModelError) as info:
            load_it()
        message = str(info.value)
        assert "\n" not in message and "--trust-model-code" in message and "trust_code=True" in message
        assert "is a program" in message and "yolotrain export of yolov5n (2 classes" in message, message
    for argv in (["val", "--weights", str(hostile), "--data", str(shapes / "data.yaml"), "--img", str(SIZE)],
                 ["predict", "--weights", str(hostile), "--source", str(images[0]), "--img", str(SIZE)]):
        assert main([*argv, "--project", str(tmp_path / "runs")]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"yolotrain {argv[0]}: error: {hostile}: not loaded") and err.count("\n") == 1, err
    with pytest.raises(CheckpointError, match="an exported model, not a torch checkpoint"):
        load(hostile)  # yolotrain.load never parses an export as a torch file
    assert not list(tmp_path.glob("pwned*")) and not (tmp_path / "runs").exists()
    # The same file, trusted, does run its code: the checks above could see it.
    with contextlib.suppress(CheckpointError, KeyError):  # its metadata lacks fields: refused after loading
        load_exported(hostile, trust_code=True)
    assert (tmp_path / "pwned.load").is_file()


def test_a_foreign_torchscript_is_refused_saying_it_has_no_metadata(tmp_path):
    foreign = tmp_path / "foreign.torchscript"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(foreign))
    with pytest.raises(UntrustedModelError, match="it carries no yolotrain export metadata"):
        load_exported(foreign)
    (tmp_path / "garbage.torchscript").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(UntrustedModelError, match="it carries no yolotrain export metadata"):
        load_exported(tmp_path / "garbage.torchscript")


def test_a_tensorrt_engine_is_refused_without_trust(tmp_path):
    """Engines are native code: refused from their header alone, without TensorRT or a GPU."""
    header = json.dumps({"producer": "yolotrain", "model": "yolov5s", "nc": "80", "img_size": "[640, 640]",
                         "precision": "fp16"}).encode()
    engine = tmp_path / "model.engine"
    engine.write_bytes(len(header).to_bytes(4, "little") + header + b"\x00" * 64)
    with pytest.raises(UntrustedModelError) as info:
        load_exported(engine)
    assert "compiled native code" in str(info.value) and "yolotrain export of yolov5s (80 classes" in str(info.value)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_our_trusted_torchscript_export_runs_through_val_and_predict(tmp_path, shapes, own_export, capsys):
    assert main(["val", "--weights", str(own_export), "--data", str(shapes / "data.yaml"), "--img", str(SIZE),
                 "--workers", "0", "--project", str(tmp_path / "runs"), "--trust-model-code"]) == 0
    image = sorted((shapes / "images" / "val").iterdir())[0]
    assert main(["predict", "--weights", str(own_export), "--source", str(image), "--img", str(SIZE),
                 "--project", str(tmp_path / "predicted"), "--trust-model-code"]) == 0
    assert (tmp_path / "predicted" / "exp" / image.name).is_file()
    capsys.readouterr()
    assert main(["predict", "--weights", str(own_export), "--source", str(image), "--img", str(SIZE),
                 "--project", str(tmp_path / "untrusted")]) == 1
    err = capsys.readouterr().err
    assert "yolotrain export of yolov5n (2 classes, image size [64, 64], fp32)" in err and err.count("\n") == 1
