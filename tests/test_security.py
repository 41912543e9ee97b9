"""Model files that are programs need trust; outputs never overwrite inputs; run-folder locks; file modes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from yolotrain import Yolov5, load, predict, train, val
from yolotrain.checkpoint import CheckpointError, save_checkpoint
from yolotrain.cli import main
from yolotrain.data import generate_shapes_dataset
from yolotrain.interop import export, load_exported
from yolotrain.interop.loading.resolve import weights_inputs
from yolotrain.interop.trust import UntrustedModelError
from yolotrain.outputs import OutputOverlapError, refuse_overwriting_inputs
from yolotrain.runs import LOCK_NAME, RunInUseError, RunLock

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
    claimed = {"producer": "yolotrain", "model": "yolov5n", "nc": "2\n", "img_size": "[64, 64]", "precision": "fp32"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # TorchScript is deprecated upstream
        torch.jit.save(torch.jit.script(_Hostile(str(target))), str(path),
                       _extra_files={"config.json": json.dumps(claimed)})
    return path


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    return generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=4, n_val=4, img_size=SIZE)


@pytest.fixture
def data(tmp_path) -> Path:
    """A dataset of this test's own, which a failing check could write into."""
    return generate_shapes_dataset(root=tmp_path / "shapes", n_train=4, n_val=4, img_size=SIZE)


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2, names=["circle", "rectangle"]).eval()
    return save_checkpoint(tmp_path / "run" / "weights" / "best", model, state={"epoch": 0})


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


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


@pytest.mark.parametrize(("weights", "output"), [("best.json", "best.json"), ("best.json", "best.safetensors"),
                                                  ("best.json", "best.state.pt"), ("best.safetensors", "best.json"),
                                                  ("best", "best.safetensors"), ("best.json", ".")])
def test_export_never_writes_over_the_weights_it_reads(checkpoint, capsys, weights, output):
    folder = checkpoint.parent
    before = digests(folder)
    assert main(["export", "--weights", str(folder / weights), "--output", str(folder / output), "--format", "onnx",
                 "--img-size", str(SIZE)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("yolotrain export: error: the output") and err.count("\n") == 1, err
    assert "outputs never overwrite inputs: choose another --output" in err
    assert digests(folder) == before and sorted(p.name for p in folder.iterdir()) == sorted(before)


@pytest.fixture(scope="module")
def spelled(tmp_path_factory) -> tuple[Path, Path]:
    """A checkpoint set in root/a/b, and root/link pointing at root/a."""
    root = tmp_path_factory.mktemp("spelled")
    (root / "a" / "b").mkdir(parents=True)
    for name in ("best.json", "best.safetensors"):
        (root / "a" / "b" / name).write_text(name)
    (root / "link").symlink_to(root / "a")
    return root, root / "a" / "b" / "best.json"


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(st.sampled_from(["a", "b", "c", ".", "..", "link", "best.json", "best.safetensors",
                                       "best.state.pt"]), min_size=1, max_size=6))
def test_any_spelling_of_an_output_over_a_checkpoint_set_is_caught(spelled, parts):
    """Outputs spelled with ``.``, ``..`` and symbolic links are refused exactly when the real path is, lies
    inside, or holds a file of the set (checked against ``os.path.realpath``)."""
    root, weights = spelled
    out = root.joinpath(*parts)
    real = os.path.realpath(out)
    members = [os.path.realpath(weights.with_name(f"best{s}")) for s in (".json", ".safetensors", ".state.pt")]
    expected = any(os.path.commonpath([real, m]) in (real, m) for m in members)
    try:
        refuse_overwriting_inputs([("--output", out)], weights_inputs(weights))
    except OutputOverlapError:
        assert expected, out
    else:
        assert not expected, out


def test_val_predict_and_data_check_never_write_into_their_data(tmp_path, data, checkpoint, capsys):
    images, labels = data / "images" / "val", data / "labels" / "val"
    before = digests(data)
    weights = ["--weights", str(checkpoint), "--img", str(SIZE)]
    for argv, relation in [
        (["val", *weights, "--data", str(data / "data.yaml"), "--project", str(labels.parent), "--name", "val",
          "--exist-ok", "--save-txt"], "is the input"),
        (["val", *weights, "--data", str(data), "--project", str(images), "--name", "scores"], "is inside the input"),
        (["predict", *weights, "--source", str(images), "--project", str(images.parent), "--name", "val",
          "--exist-ok"], "contains the input"),
        (["predict", *weights, "--source", str(next(images.iterdir())), "--project", str(data / "images"),
          "--name", "val", "--exist-ok"], "contains the input"),
        (["predict", "--weights", str(checkpoint), "--source", str(images), "--project", str(checkpoint.parent.parent),
          "--name", "weights", "--exist-ok"], "contains the input"),
        (["data", "check", str(data / "data.yaml"), "--out", str(data / "images" / "train")], "is the input"),
    ]:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert "error: the output" in err and relation in err and err.count("\n") == 1, (argv, err)
    after = digests(data)
    assert {k: v for k, v in after.items() if not k.endswith(".cache")} == before  # only our label caches added


def test_outputs_beside_a_dataset_rooted_at_the_working_folder_are_allowed(data, checkpoint, monkeypatch):
    """The generated dataset's YAML says ``path: .``; run from its folder, runs/ outputs are not "inside" it:
    only the image and label folders that are read count."""
    assert yaml_path_is_dot(data / "data.yaml")
    monkeypatch.chdir(data)
    assert main(["val", "--weights", str(checkpoint), "--data", "data.yaml", "--img", str(SIZE), "--workers", "0"]) == 0
    image = next((data / "images" / "val").iterdir())
    assert main(["predict", "--weights", str(checkpoint), "--source", str(image), "--img", str(SIZE)]) == 0
    assert (data / "runs" / "val" / "exp").is_dir() and (data / "runs" / "predict" / "exp" / image.name).is_file()


def yaml_path_is_dot(path: Path) -> bool:
    return "path: ." in path.read_text().splitlines()


def test_training_never_writes_over_its_weights_or_data(tmp_path, data, checkpoint):
    run = checkpoint.parent.parent  # the checkpoint is weights/best.json of this folder
    before, data_before = digests(run), digests(data)
    common = {"data": str(data / "data.yaml"), "epochs": 1, "img_size": SIZE, "batch_size": 4, "workers": 0}
    with pytest.raises(OutputOverlapError, match=r"contains the input .*best\.\w+ \(weights\)"):
        train(model=str(checkpoint), project=str(run.parent), name=run.name, exist_ok=True, **common)
    with pytest.raises(OutputOverlapError, match=r"is inside the input .*images.train \(dataset images\)"):
        train(project=str(data / "images" / "train"), **common)
    (run / "config.yaml").write_text("epochs: 1\n")
    with pytest.raises(OutputOverlapError, match=r"contains the input .*config\.yaml \(settings file\)"):
        train(run / "config.yaml", project=str(run.parent), name=run.name, exist_ok=True, **common)
    before["config.yaml"] = hashlib.sha256(b"epochs: 1\n").hexdigest()
    assert digests(run) == before
    assert {k: v for k, v in digests(data).items() if not k.endswith(".cache")} == data_before


def test_resume_takes_only_a_run_folder_or_its_last_checkpoint(tmp_path, checkpoint, capsys):
    """A last.json outside a run's weights/ folder would make its parent the run folder."""
    other = tmp_path / "other"
    save_checkpoint(other / "last", load(checkpoint), state={"epoch": 0})
    (other / "results.csv").write_text("my own results\n")
    before = digests(other)
    for resume in (other / "last.json", other / "last.safetensors", checkpoint, checkpoint.parent / "x.json"):
        assert main(["train", "--resume", str(resume)]) == 1
        err = capsys.readouterr().err
        assert err == f"yolotrain train: error: --resume takes a run folder or the weights/last checkpoint inside " \
                      f"one, not {resume}\n"
    assert digests(other) == before


HOLDER = """
import sys
from yolotrain.runs import RunLock
with RunLock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


def hold_lock(folder: Path) -> subprocess.Popen:
    """Another process holding ``folder``'s lock."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_second_writer_of_a_run_folder_is_refused_naming_the_holder(tmp_path, data, capsys):
    run = tmp_path / "runs" / "exp"
    holder = hold_lock(run)
    try:
        with pytest.raises(RunInUseError, match=f"is being written by process {holder.pid}: wait"), RunLock(run):
            pass
        assert main(["train", "--data", str(data / "data.yaml"), "--epochs", "1", "--img", str(SIZE), "--batch", "4",
                     "--workers", "0", "--project", str(run.parent), "--name", "exp", "--exist-ok"]) == 1
        err = capsys.readouterr().err
        assert f"is being written by process {holder.pid}" in err and err.count("\n") == 1, err
        assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]  # nothing else was written
    finally:
        holder.stdin.close()
        holder.wait()
    assert not (run / LOCK_NAME).exists()  # released and removed when the holder ended
    with RunLock(run), pytest.raises(RunInUseError, match="already being written by this process"), RunLock(run):
        pass


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path):
    run = tmp_path / "exp"
    holder = hold_lock(run)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (run / LOCK_NAME).read_text() == f"{holder.pid}\n"  # left behind, naming a dead process
    with RunLock(run):
        assert (run / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    assert not (run / LOCK_NAME).exists()


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_files_get_the_users_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        model = Yolov5("n", num_classes=2).eval()
        json_path = save_checkpoint(tmp_path / "ckpt" / "last", model, state={"epoch": 0})
        shapes = generate_shapes_dataset(root=tmp_path / "shapes", n_train=1, n_val=1, img_size=32)
    finally:
        os.umask(previous)
    for path in (json_path, json_path.with_suffix(".safetensors"), json_path.with_name("last.state.pt"),
                 shapes / "data.yaml"):
        assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~umask), path
    assert oct(shapes.stat().st_mode & 0o777) == oct(0o777 & ~umask)


@pytest.mark.slow
def test_two_resumes_of_one_run_one_trains_the_other_is_refused(tmp_path, data):
    """Real processes: a run killed after its first checkpoint, resumed twice at once."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "yolotrain", "train"]
    args = ["--data", str(data / "data.yaml"), "--epochs", "300", "--img", str(SIZE), "--batch", "4", "--workers", "0",
            "--no-val", "--project", str(tmp_path / "runs")]
    last = tmp_path / "runs" / "exp" / "weights" / "last.json"
    first = subprocess.Popen([*command, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not last.exists() and first.poll() is None:
            time.sleep(0.05)
    finally:
        first.kill()
        first.wait()
    lock = last.parent.parent / LOCK_NAME
    assert last.exists() and lock.exists()  # the killed run left its lock file behind
    resuming = subprocess.Popen([*command, "--resume", str(last.parent.parent), "--workers", "0"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not (lock.exists() and lock.read_text() == f"{resuming.pid}\n") and resuming.poll() is None:
            time.sleep(0.05)
        assert resuming.poll() is None, "the first resume ended before the second could start"
        second = subprocess.run([*command, "--resume", str(last), "--workers", "0"], env=env, capture_output=True,
                                text=True, timeout=600)
        assert second.returncode == 1 and resuming.poll() is None
        assert f"is being written by process {resuming.pid}" in second.stderr and second.stderr.count("\n") == 1
    finally:
        resuming.kill()
        resuming.wait()
