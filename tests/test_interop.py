"""Reading official YOLOv5 checkpoints without running pickled code, and the other weights formats."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import YOLOV5N_WEIGHTS

from yolotrain import Yolov5
from yolotrain.checkpoint import CheckpointError, save_checkpoint
from yolotrain.interop import UnsafeCheckpointError, UnsupportedCheckpointError, load_model, read_torch_file

FIXTURES = Path(__file__).parent / "fixtures" / "interop"
MAKE_CHECKPOINTS = FIXTURES / "make_checkpoints.py"


def run_python(code_or_args: list[str], env_extra: dict[str, str] | None = None, timeout: int = 120) -> str:
    env = {**os.environ, **(env_extra or {})}
    result = subprocess.run([sys.executable, *code_or_args], capture_output=True, text=True, env=env, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def reference_env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "yolov5-config"
    config.mkdir(exist_ok=True)
    return {"YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(config), "YOLOV5_CONFIG_DIR": str(config)}


# Our side runs with the reference unimportable: any attempt to import it fails loudly.
OURS = """
import sys, numpy as np, torch
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('yolov5', 'models', 'utils', 'ultralytics'):
            raise ImportError('blocked import of ' + name)
sys.meta_path.insert(0, Block())
from yolotrain.interop import load_model
model = load_model(sys.argv[1])
assert 'yolov5' not in sys.modules and 'models' not in sys.modules and 'utils' not in sys.modules
with torch.no_grad():
    out = model(torch.from_numpy(np.load(sys.argv[2])))
np.save(sys.argv[3], out.numpy())
print(model.version, model.num_classes, model.names[0], next(model.parameters()).dtype)
"""

# The reference side: its own torch.load of the checkpoint, state dict into a freshly built model.
REFERENCE = """
import os, sys, numpy as np, torch, yolov5
sys.path.insert(0, os.path.dirname(yolov5.__file__))  # the pickle names 'models.yolo.Model'
from yolov5.models.yolo import Model
checkpoint = torch.load(sys.argv[1], map_location='cpu', weights_only=False)
weights = (checkpoint.get('ema') or checkpoint['model']).float().state_dict()
model = Model(os.path.join(os.path.dirname(yolov5.__file__), 'models', 'yolov5n.yaml'), nc=80)
model.load_state_dict(weights)
with torch.no_grad():
    out = model.eval()(torch.from_numpy(np.load(sys.argv[2])))[0]
np.save(sys.argv[3], out.numpy())
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("inputs") / "images.npy"
    np.save(path, torch.rand(2, 3, 192, 256, generator=torch.Generator().manual_seed(0)).numpy())
    return path


def test_yolov5n_matches_reference_in_separate_processes(inputs, tmp_path):
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"official weights not found at {YOLOV5N_WEIGHTS}")
    if importlib.util.find_spec("yolov5") is None:
        pytest.skip("reference implementation not installed (pip install '.[parity]')")
    ours, theirs = tmp_path / "ours.npy", tmp_path / "reference.npy"
    summary = run_python(["-c", OURS, str(YOLOV5N_WEIGHTS), str(inputs), str(ours)])
    assert summary.split() == ["n", "80", "person", "torch.float32"]
    run_python(["-c", REFERENCE, str(YOLOV5N_WEIGHTS), str(inputs), str(theirs)], reference_env(tmp_path))
    a, b = np.load(ours), np.load(theirs)
    assert a.shape == b.shape == (2, 3 * (24 * 32 + 12 * 16 + 6 * 8), 85)
    assert np.abs(a - b).max() <= 1e-4


REFERENCE_SPECS = [
    pytest.param("n:3:float32:1", id="n-nc3-fp32-ema", marks=pytest.mark.slow),
    pytest.param("s:5:float16:0", id="s-nc5-fp16", marks=pytest.mark.slow),
    pytest.param("m:80:float16:0", id="m-nc80-fp16", marks=pytest.mark.slow),
    pytest.param("l:2:float16:1", id="l-nc2-fp16-ema", marks=pytest.mark.slow),
    pytest.param("x:1:float16:0", id="x-nc1-fp16", marks=pytest.mark.slow),
    # P6 (four detection levels, strides 8-64): the layout of the official yolov5n6.pt ... yolov5x6.pt
    pytest.param("n6:2:float32:1", id="n6-nc2-fp32-ema"),
    pytest.param("s6:80:float16:0", id="s6-nc80-fp16", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("spec", REFERENCE_SPECS)
def test_checkpoints_written_by_the_reference_load_exactly(reference, inputs, tmp_path, spec):
    """Genuine reference models (custom nc, fp16/fp32, with EMA) pickled under a checkout's class names."""
    run_python([str(MAKE_CHECKPOINTS), "reference", str(tmp_path), str(inputs), spec], reference_env(tmp_path),
               timeout=600)
    stem = tmp_path / spec.replace(":", "-")
    version, nc, _, with_ema = spec.split(":")
    model = load_model(stem.with_suffix(".pt"))
    assert (model.version, model.num_classes) == (version, int(nc))
    assert model.names == [f"class{i}" for i in range(int(nc))]
    with torch.no_grad():
        ours = model(torch.from_numpy(np.load(inputs))).numpy()
    # The reference serves the EMA weights when present; that is what the expected output used. Float32
    # rounding only: P6 anchors give boxes near 1000 px, whose last bits are 6e-5 px apart.
    np.testing.assert_allclose(ours, np.load(stem.with_suffix(".npy")), rtol=1e-6, atol=1e-4)
    if with_ema == "1":
        with torch.no_grad():
            plain = load_model(stem.with_suffix(".pt"), use_ema=False)(torch.from_numpy(np.load(inputs))).numpy()
        assert np.abs(plain - ours).max() > 1e-2


@pytest.fixture(scope="module")
def fake_checkpoints(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fake-checkpoints")
    run_python([str(MAKE_CHECKPOINTS), "fake", str(folder)])
    return folder


def test_official_layout_with_ema_custom_nc_and_mixed_dtypes(fake_checkpoints):
    """model (fp16) and ema (fp32) entries: the EMA is served, exactly, as float32, with dict names."""
    from safetensors.torch import load_file
    model = load_model(fake_checkpoints / "ours-as-official.pt")
    assert (model.version, model.num_classes, model.names) == ("n", 3, ["cat", "dog", "emu"])
    expected = load_file(str(fake_checkpoints / "ours-as-official.safetensors"))
    assert model.state_dict().keys() == expected.keys()
    for key, value in model.state_dict().items():
        assert value.dtype == expected[key].dtype and torch.equal(value, expected[key]), key
    plain = load_model(fake_checkpoints / "ours-as-official.pt", use_ema=False)
    assert not torch.equal(plain.model[0].conv.weight, model.model[0].conv.weight)
    assert plain.model[0].conv.weight.dtype == torch.float32


@pytest.mark.parametrize(("name", "expected"), [
    ("custom-no-yaml", "a custom YOLOv5 layout (30 layers, 3 detection levels) without its model yaml"),
    ("classify", "YOLOv5 classification model (models.yolo.ClassificationModel)"),
    ("focus", "YOLOv5 model from before v6.0 (Focus stem layer)"),
    ("leaky", "a model with torch.nn.modules.activation.LeakyReLU activations (yolotrain's blocks use SiLU)"),
])
def test_unsupported_architectures_are_named(fake_checkpoints, name, expected):
    path = fake_checkpoints / f"{name}.pt"
    with pytest.raises(UnsupportedCheckpointError) as info:
        load_model(path)
    message = str(info.value)
    assert message.startswith(f"{path}: unsupported checkpoint: ") and expected in message
    assert "\n" not in message


def test_an_ultralytics_model_without_its_description_is_one_line(fake_checkpoints):
    """An Ultralytics class (read as data, not imported) whose pickle lacks the model YAML that says its layers."""
    path = fake_checkpoints / "yolov8.pt"
    with pytest.raises(CheckpointError) as info:
        load_model(path)
    assert str(info.value) == f"{path}: the pickled model has no 'yaml' with its backbone and head"


class RunsShell:
    """Pickles as a call to os.system (or exec) that would create the marker file."""

    def __init__(self, marker: Path, use_exec: bool = False) -> None:
        self.marker, self.use_exec = marker, use_exec

    def __reduce__(self):
        if self.use_exec:
            return exec, (f"open({str(self.marker)!r}, 'w').close()",)
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("use_exec", [False, True], ids=["os.system", "exec"])
@pytest.mark.parametrize("container", ["bare-pickle", "torch-zip"])
def test_code_in_a_pickle_is_refused_and_never_runs(tmp_path, container, use_exec):
    marker = tmp_path / "pwned"
    payload = {"model": RunsShell(marker, use_exec), "weights": torch.ones(2)}
    path = tmp_path / "evil.pt"
    if container == "torch-zip":
        torch.save(payload, path)
        assert zipfile.is_zipfile(path)
    else:
        path.write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(UnsafeCheckpointError) as info:
        load_model(path)
    target = "builtins.exec" if use_exec else f"{os.system.__module__}.system"
    assert str(info.value).startswith(f"{path}: refusing to load '{target}'")
    assert not marker.exists()


def test_dotted_names_inside_allowed_namespaces_are_refused(tmp_path):
    """A protocol-4 STACK_GLOBAL may name 'os.system' inside an allowed module; find_class must not walk it."""
    path = tmp_path / "sneaky.pt"
    path.write_bytes(b"\x80\x04\x8c\x1btorch.nn.modules.activation\x94\x8c\tos.system\x94\x93\x94\x8c\x04true\x94"
                     b"\x85\x94R\x94.")
    with pytest.raises(UnsafeCheckpointError, match="refusing to load 'torch.nn.modules.activation.os.system'"):
        read_torch_file(path)


def test_corrupt_and_foreign_files_get_one_line_errors(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"definitely not a pickle")
    truncated = tmp_path / "truncated.pt"
    torch.save(Yolov5("n", num_classes=2).state_dict(), truncated)
    truncated.write_bytes(truncated.read_bytes()[:20000])
    not_yolo = tmp_path / "other.pt"
    torch.save({"fc.weight": torch.ones(2, 2)}, not_yolo)
    for path, expected in [(garbage, "not a readable PyTorch checkpoint"), (truncated, "not a readable PyTorch"),
                           (not_yolo, "a state dict without the YOLOv5 v6.0+ keys"),
                           (tmp_path / "absent.pt", "no such file")]:
        with pytest.raises(CheckpointError) as info:
            load_model(path)
        assert str(info.value).startswith(str(path)) and expected in str(info.value)
        assert "\n" not in str(info.value)


def rezip(src: Path, dst: Path, edit) -> Path:
    """Copy a zip's records through ``edit(name, data)``: new bytes, or None to drop the record."""
    with zipfile.ZipFile(src) as archive, zipfile.ZipFile(dst, "w") as out:
        for name in archive.namelist():
            data = edit(name, archive.read(name))
            if data is not None:
                out.writestr(name, data)
    return dst


class StorageIdPickler(pickle.Pickler):
    """Writes tensors as torch's persistent storage ids, but into a bare pickle with no data records."""

    def persistent_id(self, obj):
        return ("storage", torch.float32, "0", "cpu", 4) if isinstance(obj, torch.Tensor) else None


def test_tensors_read_have_memory_of_their_own_even_when_they_shared_a_storage(tmp_path):
    base = torch.arange(24.0).view(4, 6)
    saved = {"whole": base, "again": base.view(24), "row": base[1], "columns": base[:, 2:4], "transposed": base.t(),
             "alone": torch.ones(5, dtype=torch.float16), "empty": torch.zeros(0), "flags": torch.tensor([True, False])}
    path = tmp_path / "shared.pt"
    torch.save(saved, path)
    loaded = read_torch_file(path)
    for key, value in saved.items():
        assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key
    spans = sorted((t.data_ptr(), t.data_ptr() + t.untyped_storage().nbytes()) for t in loaded.values() if t.numel())
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))  # no two share memory
    assert all(t.data_ptr() % 64 == 0 for t in loaded.values() if t.numel())  # aligned as torch allocates
    loaded["whole"] += 1
    assert torch.equal(loaded["again"], base.view(24)) and torch.equal(loaded["row"], base[1])


def test_malformed_checkpoint_internals_get_one_line_errors(tmp_path):
    state = tmp_path / "state.pt"
    torch.save({"w": torch.arange(4.0)}, state)
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.arange(4.0)}, legacy, _use_new_zipfile_serialization=False)
    scripted = tmp_path / "scripted.pt"
    with pytest.warns(FutureWarning):  # TorchScript is deprecated upstream; users still have such files
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(scripted))
    plain_zip = tmp_path / "plain.pt"
    with zipfile.ZipFile(plain_zip, "w") as archive:
        archive.writestr("notes.txt", "hello")
    bare = tmp_path / "bare.pt"
    with bare.open("wb") as handle:
        StorageIdPickler(handle).dump({"w": torch.zeros(4)})
    is_record = lambda name: name.endswith("/data/0")  # noqa: E731
    cases = [
        (rezip(state, tmp_path / "no_record.pt", lambda n, d: None if is_record(n) else d), "missing record data/0"),
        (rezip(state, tmp_path / "short.pt", lambda n, d: d[:5] if is_record(n) else d), "has 5 bytes, expected 16"),
        (legacy, "pre-1.6 torch format"),
        (scripted, "not a torch.save checkpoint (TorchScript archive: load it with torch.jit.load"),
        (plain_zip, "not a torch.save checkpoint (zip file without data.pkl)"),
        (bare, "persistent id in a bare pickle"),
    ]
    for path, expected in cases:
        with pytest.raises(CheckpointError) as info:
            read_torch_file(path)
        message = str(info.value)
        assert message.startswith(str(path)) and expected in message and "\n" not in message, message


@pytest.mark.parametrize("layout", ["pt", "pt-ddp", "safetensors", "ours"])
def test_state_dicts_and_our_checkpoints_load(tmp_path, layout):
    torch.manual_seed(0)
    source = Yolov5("n", num_classes=4, anchors=[[12, 16, 19, 36, 40, 28], [36, 75, 76, 55, 72, 146],
                                                  [142, 110, 192, 243, 459, 401]]).eval()
    state = source.state_dict()
    if layout == "pt":
        path = tmp_path / "weights.pt"
        torch.save(state, path)
    elif layout == "pt-ddp":
        path = tmp_path / "weights.pt"
        torch.save({"model": {f"module.{k}": v for k, v in state.items()}, "epoch": 3}, path)
    elif layout == "safetensors":
        from safetensors.torch import save_file
        path = tmp_path / "weights.safetensors"
        save_file(state, str(path))
    else:
        path = tmp_path / "run" / "best"
        save_checkpoint(path, source, metadata={"names": ["a", "b", "c", "d"]})
    model = load_model(path)
    assert (model.version, model.num_classes, model.training) == ("n", 4, False)
    assert model.names == (["a", "b", "c", "d"] if layout == "ours" else ["0", "1", "2", "3"])
    for key, value in source.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    imgs = torch.rand(1, 3, 64, 96)
    with torch.no_grad():
        assert torch.equal(model(imgs), source(imgs))


def test_official_checkpoint_metadata_is_read(tmp_path):
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"official weights not found at {YOLOV5N_WEIGHTS}")
    checkpoint = read_torch_file(YOLOV5N_WEIGHTS)
    assert checkpoint["model"].pickled_name == "models.yolo.Model"
    assert checkpoint["model"].get("yaml")["width_multiple"] == 0.25
    model = load_model(YOLOV5N_WEIGHTS)
    assert len(model.names) == 80 and model.names[:3] == ["person", "bicycle", "car"]
    torch.testing.assert_close(model.head.anchors[0] * 8, torch.tensor([[10.0, 13], [16, 30], [33, 23]]))
    assert json.dumps(model.names)  # plain strings, ready for metadata files
