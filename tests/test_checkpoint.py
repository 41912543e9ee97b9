"""Our checkpoint format: exact round trips, atomic sets, weights_only-safe state, one-line errors."""

from __future__ import annotations

import errno
import hashlib
import json
from pathlib import Path

import pytest
import torch

from yolotrain import Yolov5
from yolotrain.checkpoint import CheckpointError, CheckpointWarning, load_state, read_checkpoint, save_checkpoint
from yolotrain.interop import load_checkpoint


@pytest.fixture(scope="module")
def models() -> tuple[Yolov5, Yolov5]:
    torch.manual_seed(0)
    model, ema = Yolov5("n", num_classes=3), Yolov5("n", num_classes=3)
    model.model[0].bn.running_mean = torch.randn(16)  # something not at its initial value
    return model, ema


def training_state(model: Yolov5) -> dict:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model(torch.rand(1, 3, 64, 64))[0].sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return {"optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state(), "epoch": 4,
            "python_rng": list(range(3))}


def test_round_trip_is_bitwise_and_keeps_metadata(tmp_path, models):
    model, ema = models
    state = training_state(Yolov5("n", num_classes=3).train())
    meta = {"names": ["a", "b", "c"], "img_size": 640, "epoch": 4, "metrics": {"mAP50": 0.5},
            "train_args": {"batch": 16, "data": "coco128.yaml"}}
    json_path = save_checkpoint(tmp_path / "last", model, ema, metadata=meta, state=state)
    assert json_path == tmp_path / "last.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.json", "last.safetensors", "last.state.pt"]

    contents = read_checkpoint(tmp_path / "last.safetensors")
    for source, loaded in ((model, contents.model_state), (ema, contents.ema_state)):
        assert loaded.keys() == source.state_dict().keys()
        for key, value in source.state_dict().items():
            assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key
    for path in (tmp_path / "last", tmp_path / "last.json", tmp_path / "last.safetensors"):
        loaded_model, metadata = load_checkpoint(path, use_ema=False)
        assert all(torch.equal(a, b) for a, b in zip(loaded_model.state_dict().values(), model.state_dict().values()))
    assert {k: metadata[k] for k in meta} == meta
    assert (metadata["version"], metadata["nc"], metadata["strides"], metadata["format_version"]) == ("n", 3,
                                                                                                      [8, 16, 32], 1)
    assert metadata["anchors"][0] == [[10, 13], [16, 30], [33, 23]]
    assert loaded_model.names == ["a", "b", "c"] and not loaded_model.training
    served, _ = load_checkpoint(tmp_path / "last")  # EMA by default
    assert torch.equal(served.model[0].conv.weight, ema.model[0].conv.weight)

    restored = load_state(tmp_path / "last")
    assert torch.equal(restored["torch_rng"], state["torch_rng"]) and restored["epoch"] == 4
    momentum = restored["optimizer"]["state"][0]["momentum_buffer"]
    assert torch.equal(momentum, state["optimizer"]["state"][0]["momentum_buffer"])


def test_every_pt_we_write_loads_with_weights_only(tmp_path, models):
    save_checkpoint(tmp_path / "a", models[0], metadata={}, state=training_state(Yolov5("n", 3).train()))
    written = list(tmp_path.rglob("*.pt"))
    assert written
    for path in written:
        assert isinstance(torch.load(path, weights_only=True), dict)


def test_unsafe_state_is_refused_before_anything_is_written(tmp_path, models):
    import numpy as np
    with pytest.raises(ValueError, match=r"weights_only=True"):
        save_checkpoint(tmp_path / "bad", models[0], state={"numpy_rng": np.random.get_state()})
    # The new set is written under temporary names first: a refused save leaves no file at all.
    assert not list(tmp_path.iterdir())
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "bad")


def one_line_error(path: Path, expected: str) -> None:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_missing_truncated_and_mismatched_sets_get_one_line_errors(tmp_path, models):
    model, _ = models
    one_line_error(tmp_path / "nothing", "no such checkpoint")

    save_checkpoint(tmp_path / "cut", model)
    weights = tmp_path / "cut.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    one_line_error(tmp_path / "cut", "SHA-256 differs")

    save_checkpoint(tmp_path / "two", Yolov5("n", num_classes=5))
    save_checkpoint(tmp_path / "one", model)
    (tmp_path / "one.safetensors").write_bytes((tmp_path / "two.safetensors").read_bytes())
    one_line_error(tmp_path / "one.json", "does not match one.json")

    # A json edited to claim another class count no longer describes the tensors.
    save_checkpoint(tmp_path / "edited", model)
    document = json.loads((tmp_path / "edited.json").read_text())
    (tmp_path / "edited.json").write_text(json.dumps({**document, "nc": 7, "names": list("abcdefg")}))
    one_line_error(tmp_path / "edited", "does not match its tensors (yolov5n nc=7")

    (tmp_path / "broken.json").write_text("{")
    one_line_error(tmp_path / "broken.json", "not valid JSON")

    (tmp_path / "foreign.json").write_text(json.dumps({"model": "something else"}))
    one_line_error(tmp_path / "foreign.json", "foreign.json: not a yolotrain-checkpoint file")
    (tmp_path / "future.json").write_text(json.dumps({**document, "format_version": 99}))
    one_line_error(tmp_path / "future.json", "format version 99 is newer than this yolotrain reads")

    save_checkpoint(tmp_path / "lost", model)
    (tmp_path / "lost.safetensors").unlink()
    one_line_error(tmp_path / "lost", "lost.safetensors: missing (listed in lost.json)")
    save_checkpoint(tmp_path / "interrupted", model)
    (tmp_path / "interrupted.json").unlink()
    one_line_error(tmp_path / "interrupted", "interrupted.json: missing (its interrupted.safetensors is incomplete")


def test_metadata_may_not_contradict_the_model(tmp_path, models):
    with pytest.raises(ValueError, match="contradicts the model"):
        save_checkpoint(tmp_path / "x", models[0], metadata={"nc": 80})
    with pytest.raises(ValueError, match="3 class names"):
        save_checkpoint(tmp_path / "x", Yolov5("n", num_classes=2), metadata={"names": ["a", "b", "c"]})
    assert not list(tmp_path.iterdir())


def test_half_precision_round_trip_keeps_dtype(tmp_path):
    torch.manual_seed(1)
    model = Yolov5("n", num_classes=1).half()
    save_checkpoint(tmp_path / "h", model)
    loaded, _ = load_checkpoint(tmp_path / "h")
    assert loaded.model[0].conv.weight.dtype == torch.float16
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))


@pytest.mark.parametrize(("edit", "message"), [
    ({"nc": 1_000_000_000}, "field 'nc' must be an integer from 1 to 10000"),
    ({"nc": 80, "names": [str(i) for i in range(80)]}, "does not match its tensors (yolov5n nc=80"),
    ({"format_version": 1e400}, "field 'format_version' must be a positive integer"),
    ({"format_version": None}, "field 'format_version' must be a positive integer"),
    ({"files": "x"}, "field 'files' must list the weights file"),
    ({"files": {"weights": {"name": "../../etc/passwd", "sha256": "0" * 64}}}, "'files.weights.name' must be"),
    ({"names": 5}, "field 'names' must be a list of 3 class names"),
    ({"anchors": [[[10, 13]] * 3] * 2 + [[[-1, 2]] * 3]}, "field 'anchors' must be"),
    ({"anchors": [[[[[[1]]]]]]}, "field 'anchors' must be"),
    ({"in_channels": 10**9}, "field 'in_channels' must be an integer from 1 to 64"),
    ({"version": ["n"]}, "field 'version' must be a model size"),
    ({"epoch": "7"}, "field 'epoch' must be an integer"),
])
def test_edited_metadata_is_refused_before_anything_is_built(tmp_path, models, edit, message):
    save_checkpoint(tmp_path / "last", models[0])
    document = json.loads((tmp_path / "last.json").read_text())
    (tmp_path / "last.json").write_text(json.dumps({**document, **edit}))
    one_line_error(tmp_path / "last", message)


def test_a_key_given_twice_in_the_json_is_one_line(tmp_path, models):
    save_checkpoint(tmp_path / "last", models[0])
    text = (tmp_path / "last.json").read_text()
    (tmp_path / "last.json").write_text(text.replace('"nc": ', '"nc": 2, "nc": ', 1))
    one_line_error(tmp_path / "last", "key 'nc' given twice in one object")


def test_deeply_nested_json_is_one_line(tmp_path):
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    one_line_error(tmp_path / "deep.json", "not valid JSON")


def test_zip_records_claiming_more_than_the_file_holds_are_refused_unread(tmp_path):
    from yolotrain.interop import read_torch_file

    path = tmp_path / "claims.pt"
    torch.save({"model": torch.zeros(1000)}, path)
    raw = bytearray(path.read_bytes())
    # Raise the uncompressed size of the tensor record in the central directory to 1.5 GB.
    record = raw.rfind(b"PK\x01\x02", 0, raw.rfind(b"data/0") + 1)
    raw[record + 24:record + 28] = (1_500_000_000).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="claims 1500000000 bytes, which this .*-byte file cannot hold"):
        read_torch_file(path)


def test_garbage_training_state_is_one_line(tmp_path, models):
    save_checkpoint(tmp_path / "last", models[0], state={"epoch": 1})
    (tmp_path / "last.state.pt").write_bytes(b"not a torch file at all")
    document = json.loads((tmp_path / "last.json").read_text())
    document["files"]["state"]["sha256"] = hashlib.sha256(b"not a torch file at all").hexdigest()
    (tmp_path / "last.json").write_text(json.dumps(document))
    with pytest.raises(CheckpointError) as info:
        load_state(tmp_path / "last")
    message = str(info.value)
    assert "last.state.pt: not a readable training state" in message and "\n" not in message
    assert "weights_only=False" not in message


def test_an_interrupted_save_falls_back_to_the_previous_set_and_is_repaired(tmp_path, models):
    model, ema = models
    save_checkpoint(tmp_path / "last", model, state={"epoch": 1}, metadata={"epoch": 1})
    old_weights = (tmp_path / "last.safetensors").read_bytes()
    # The window between setting the old files aside and committing the new json.
    (tmp_path / "last.safetensors").rename(tmp_path / ".last.safetensors.prev")
    (tmp_path / "last.safetensors").write_bytes(b"half of a new file")
    (tmp_path / ".last.json.123.tmp").write_text("{")
    with pytest.warns(CheckpointWarning, match="an interrupted save replaced it"):
        contents = read_checkpoint(tmp_path / "last")
    assert contents.metadata["epoch"] == 1
    # The next save puts the old set back first, then replaces it whole and leaves nothing behind.
    save_checkpoint(tmp_path / "last", ema, state={"epoch": 2}, metadata={"epoch": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.json", "last.safetensors", "last.state.pt"]
    assert read_checkpoint(tmp_path / "last").metadata["epoch"] == 2
    assert (tmp_path / "last.safetensors").read_bytes() != old_weights


def test_a_failed_save_keeps_the_previous_set(tmp_path, models, monkeypatch):
    model, ema = models
    save_checkpoint(tmp_path / "last", model, state={"epoch": 1}, metadata={"epoch": 1})
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(tmp_path / "last", ema, state={"epoch": 2}, metadata={"epoch": 2})
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert read_checkpoint(tmp_path / "last").metadata["epoch"] == 1
