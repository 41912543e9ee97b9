"""Callbacks: every hook in the reference's order, stopping a run, a failing callback, predict streaming."""

import csv
import inspect
import json
import re
from pathlib import Path

import pytest
import torch

from yolotrain import predict, resolve_config, train
from yolotrain.callbacks import HOOKS, CallbackError, Callbacks
from yolotrain.engine import Trainer, TrainResult
from yolotrain.interop import load_checkpoint
from yolotrain.prediction.run import Predictor, Result

FAST = {"img_size": 64, "batch_size": 4, "workers": 0, "autoanchor": False}
TRAIN_BATCH = ["on_train_batch_start", "optimizer_step", "on_before_zero_grad", "on_train_batch_end"]


@pytest.fixture(scope="module")
def recorded(tiny_data, tmp_path_factory):
    """A 2-epoch run with one recording function on every hook: (hook, arguments) in firing order."""
    calls: list[tuple[str, tuple]] = []
    callbacks = {hook: (lambda *args, hook=hook: calls.append((hook, args))) for hook in HOOKS}
    project = tmp_path_factory.mktemp("runs")
    result = train(data=str(tiny_data), epochs=2, plots=False, project=str(project), callbacks=callbacks, **FAST)
    return calls, result


def expected_epoch(images: int) -> list[str]:
    val = ["on_val_start", "on_val_batch_start", *["on_val_image_end"] * images, "on_val_batch_end", "on_val_end"]
    return ["on_train_epoch_start", *TRAIN_BATCH * 2, "on_train_epoch_end", *val, "on_fit_epoch_end", "on_model_save"]


def test_a_callback_sees_every_training_hook_in_the_reference_order(recorded):
    calls, result = recorded
    expected = ["on_pretrain_routine_start", "on_params_update", "on_pretrain_routine_end", "on_train_start",
                *expected_epoch(4) * 2, "on_train_end", "teardown"]
    assert [hook for hook, _ in calls] == expected
    training_hooks = set(HOOKS) - {"on_predict_start", "on_predict_image_end", "on_predict_end"}
    assert {hook for hook, _ in calls} == training_hooks


def test_hook_arguments_are_the_documented_ones(recorded):
    calls, result = recorded
    args = {}
    for hook, values in calls:
        args.setdefault(hook, []).append(values)
    trainer = args["on_train_start"][0][0]
    assert isinstance(trainer, Trainer) and trainer.save_dir == result.save_dir
    assert args["on_params_update"][0][1]["epochs"] == 2
    assert [a[1] for a in args["on_train_epoch_start"]] == [0, 1]
    _, epoch, batch, imgs, targets, loss = args["on_train_batch_end"][-1]
    assert (epoch, batch, imgs.shape[-1], targets.shape[1], loss.requires_grad) == (1, 1, 64, 6, False)
    path, detections = args["on_val_image_end"][0]
    assert Path(path).is_file() and detections.shape[1] == 6
    metrics = args["on_val_end"][-1][0]
    _, epoch, row, fitness = args["on_fit_epoch_end"][-1]
    assert epoch == 1 and row["mAP50"] == metrics.map50 and fitness == metrics.fitness()
    rows = list(csv.DictReader((result.save_dir / "results.csv").open()))
    assert float(rows[-1]["mAP50"]) == pytest.approx(row["mAP50"], rel=1e-5)
    _, last, epoch, final, best_fitness, _ = args["on_model_save"][-1]
    assert last == result.last and (epoch, final) == (1, True) and best_fitness >= fitness
    assert args["on_train_end"][0][1] is result and isinstance(result, TrainResult)
    assert args["teardown"][0][1] is None


def test_a_callback_stops_the_run_as_patience_does(tiny_data, tmp_path):
    trainer = Trainer(resolve_config(data=str(tiny_data), epochs=3, val=False, plots=False,
                                     project=str(tmp_path / "runs"), **FAST))
    ended = []

    def stop_after_first_epoch(trainer: Trainer, epoch: int, row: dict, fitness: float) -> None:
        trainer.stop = True

    trainer.add_callback("on_fit_epoch_end", stop_after_first_epoch)
    trainer.add_callback("on_train_end", lambda trainer, result: ended.append(result))
    trainer.add_callback("teardown", lambda trainer, error: ended.append(error))
    result = trainer.fit()
    assert result.epochs_run == 1 and ended == [result, None]
    model, metadata = load_checkpoint(result.last.with_suffix(".json"))
    assert metadata["epoch"] == 0 and metadata["train_args"]["epochs"] == 3
    assert (result.save_dir / "results.csv").read_text().count("\n") == 2  # header and epoch 1


def fail_on_second_epoch(trainer: Trainer, epoch: int, row: dict, fitness: float) -> None:
    if epoch == 1:
        raise ValueError("no good\nat all")


def test_a_failing_callback_stops_the_run_in_one_line_and_keeps_the_checkpoint(tiny_data, tmp_path):
    errors = []
    with pytest.raises(CallbackError) as raised:
        train(data=str(tiny_data), epochs=3, val=False, plots=False, project=str(tmp_path / "runs"),
              callbacks={"on_fit_epoch_end": [fail_on_second_epoch], "teardown": lambda t, e: errors.append(e)},
              **FAST)
    message = str(raised.value)
    assert "\n" not in message and raised.value.__suppress_context__
    assert re.match(r"callback \S*test_callbacks\.fail_on_second_epoch on on_fit_epoch_end failed: ValueError: "
                    r"no good at all; the last checkpoint \S+last\.safetensors is intact: continue with --resume ",
                    message), message
    assert errors == [raised.value]
    last = tmp_path / "runs" / "exp" / "weights" / "last.json"
    model, metadata = load_checkpoint(last)
    assert metadata["epoch"] == 0


def test_an_unknown_hook_is_one_line_naming_the_closest(tiny_data, tmp_path):
    with pytest.raises(ValueError, match=r"^unknown callback hook 'on_fit_epoch_ends'; did you mean "
                                         r"'on_fit_epoch_end'\?[^\n]*$"):
        train(data=str(tiny_data), epochs=1, project=str(tmp_path / "runs"),
              callbacks={"on_fit_epoch_ends": print}, **FAST)
    assert not (tmp_path / "runs").exists()
    trainer = Trainer(resolve_config(data=str(tiny_data), epochs=1, project=str(tmp_path / "runs"), **FAST))
    with pytest.raises(ValueError, match="did you mean 'on_train_batch_end'"):
        trainer.add_callback("on_train_batch_ends", print)
    with pytest.raises(ValueError, match="callback for teardown must be callable, got str"):
        trainer.add_callback("teardown", "print")


def test_predict_stream_yields_one_result_at_a_time(recorded, tiny_data, tmp_path):
    model, _ = load_checkpoint(recorded[1].last.with_suffix(".json"))
    images = sorted((tiny_data.parent / "images" / "val").glob("*"))
    whole = predict(model, images, conf=0.01, max_det=20, save_dir=tmp_path / "whole")
    seen = []
    hooks = {"on_predict_start": lambda p: seen.append(type(p)), "on_predict_image_end": seen.append,
             "on_predict_end": lambda results: seen.append(len(results))}
    stream = predict(model, images, conf=0.01, max_det=20, save_dir=tmp_path / "stream", stream=True, callbacks=hooks)
    assert inspect.isgenerator(stream) and seen == []
    first = next(stream)
    assert seen == [Predictor, first] and isinstance(first, Result)
    assert not (tmp_path / "stream" / "predictions.json").exists()  # written when the stream ends
    streamed = [first, *stream]
    assert seen == [Predictor, *streamed, len(images)]
    assert [r.path for r in streamed] == [r.path for r in whole] == [str(p) for p in images]
    for a, b in zip(streamed, whole):
        assert torch.equal(a.boxes, b.boxes) and torch.equal(a.scores, b.scores)
    assert json.loads((tmp_path / "stream" / "predictions.json").read_text()) == \
        json.loads((tmp_path / "whole" / "predictions.json").read_text())


def test_a_closed_stream_writes_what_it_predicted(recorded, tiny_data, tmp_path):
    model, _ = load_checkpoint(recorded[1].last.with_suffix(".json"))
    images = sorted((tiny_data.parent / "images" / "val").glob("*"))
    stream = predict(model, images, max_det=20, save_dir=tmp_path / "out", stream=True)
    first = next(stream)
    stream.close()
    assert [r["source"] for r in json.loads((tmp_path / "out" / "predictions.json").read_text())] == [first.path]


@pytest.mark.parametrize("callbacks, message", [
    ({"on_train_start": 5}, "callbacks['on_train_start'] must be a function or a list or tuple of functions, "
                            "got int 5"),
    ({"on_train_start": "print"}, "callbacks['on_train_start'] must be a function or a list or tuple of functions, "
                                  "got str 'print'"),
    ({"on_train_start": [print, None]}, "callbacks['on_train_start'][1] must be callable, got NoneType None"),
    ({"on_trian_strat": print}, "unknown callback hook 'on_trian_strat'; did you mean 'on_train_start'?"),
    ({"before_everything": print}, "unknown callback hook 'before_everything' (hooks: see yolotrain.callbacks.HOOKS)"),
    ({5: print}, "callback hooks are named by strings, got int 5"),
    ([print], "callbacks must be a mapping of hook names to a function or a list of functions"),
])
def test_callbacks_are_checked_when_given(tiny_data, tmp_path, callbacks, message):
    """Checked when added, in one line, before anything is built or written (before: ``TypeError: 'int' object
    is not iterable`` and the like from deep in the run)."""
    with pytest.raises(ValueError) as raised:
        train(data=str(tiny_data), epochs=1, project=str(tmp_path / "runs"), callbacks=callbacks, **FAST)
    assert message in str(raised.value) and "\n" not in str(raised.value), raised.value
    assert not (tmp_path / "runs").exists()
    with pytest.raises(ValueError, match=re.escape(message)):
        Callbacks(callbacks)


def test_callbacks_given_as_lists_and_tuples_run_in_order():
    calls = []
    hooks = Callbacks({"on_predict_end": (lambda r: calls.append(1), lambda r: calls.append(2)),
                       "on_predict_start": [lambda p: calls.append(0)], "teardown": []})
    hooks.run("on_predict_start", None)
    hooks.run("on_predict_end", [])
    assert calls == [0, 1, 2]
    with pytest.raises(ValueError, match=r"^callback for teardown must be callable, got int 3$"):
        hooks.add("teardown", 3)
