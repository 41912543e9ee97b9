"""Our checkpoint format: exact round trips, atomic sets, weights_only-safe state, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from yolotrain import Yolov5
from yolotrain.checkpoint import CheckpointError, load_state, read_checkpoint, save_checkpoint
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
    # The json is written last, so the interrupted set is never seen as complete.
    assert not (tmp_path / "bad.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]
    with pytest.raises(CheckpointError, match="bad.json: missing"):
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
    (tmp_path / "edited.json").write_text(json.dumps({**document, "nc": 7}))
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
