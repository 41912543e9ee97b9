"""Callbacks: user functions run at named points of training, validation and prediction.

The training hooks are the reference YOLOv5's (``utils/callbacks.py``), fired in its order; each gets
typed arguments instead of the reference's positional lists (see ``HOOKS``). Training fires them in
the main process (rank 0) only. A callback stops a run cleanly with ``trainer.stop = True``: the
epoch in progress is finished, validated and saved, then the run ends as ``--patience`` ends it. An
exception in a callback stops the run with a :class:`CallbackError` naming the hook and the function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .messages import brief, did_you_mean

# Every hook, in the order one training epoch fires them, with what each callback receives.
HOOKS: dict[str, str] = {
    "on_pretrain_routine_start": "(trainer) before the data and model are built",
    "on_pretrain_routine_end": "(trainer) data, model, optimiser and resumed state ready",
    "on_train_start": "(trainer) the run folder and loggers exist; before the first epoch",
    "on_train_epoch_start": "(trainer, epoch) epoch counted from 0",
    "on_train_batch_start": "(trainer, epoch, batch) batch index within the epoch",
    "optimizer_step": "(trainer, epoch, batch) after the optimiser and scaler stepped",
    "on_before_zero_grad": "(trainer, epoch, batch) before the applied gradients are cleared",
    "on_train_batch_end": "(trainer, epoch, batch, imgs, targets, loss) the batch as the model saw it, "
                          "the detached loss",
    "on_train_epoch_end": "(trainer, epoch) after the scheduler step, before validation",
    "on_val_start": "(loader) validation begins over this DataLoader",
    "on_val_batch_start": "(batch, imgs, targets) batch index, the batch on the device",
    "on_val_image_end": "(path, detections) one image: detections xyxy conf class in original pixels",
    "on_val_batch_end": "(batch, imgs, targets, detections) detections per image, in batch pixels (a segmentation "
                        "model's with its mask coefficients after the class)",
    "on_val_end": "(metrics) the Metrics being returned",
    "on_fit_epoch_end": "(trainer, epoch, row, fitness) the epoch's results.csv row (dict) and fitness",
    "on_model_save": "(trainer, last, epoch, final, best_fitness, fitness) after weights/last was saved",
    "on_train_end": "(trainer, result) the TrainResult being returned",
    "on_params_update": "(trainer, settings) the run's resolved settings (dict), fired once before "
                        "on_pretrain_routine_end",
    "teardown": "(trainer, error) always last; error is the exception ending the run, or None",
    "on_predict_start": "(predictor) before the first source item",
    "on_predict_image_end": "(result) one image or video frame's Result",
    "on_predict_end": "(results) every Result, when predicting ends",
}

Callback = Callable[..., Any]
CallbackSpec = Mapping[str, Callback | Iterable[Callback]]


class CallbackError(RuntimeError):
    """A callback raised: the message names the function, the hook and the error, on one line."""


def check_hook(hook: str) -> None:
    """Raise a one-line :class:`ValueError` when ``hook`` is not a hook's name (naming the closest one)."""
    if not isinstance(hook, str):
        raise ValueError(f"callback hooks are named by strings, got {type(hook).__name__} {brief(hook)} "
                         "(hooks: see yolotrain.callbacks.HOOKS)")
    if hook not in HOOKS:
        raise ValueError(f"unknown callback hook {brief(hook)}{did_you_mean(hook, HOOKS)} (hooks: see "
                         "yolotrain.callbacks.HOOKS)")


def check_callback(fn: Any, where: str) -> None:
    """Raise a one-line :class:`ValueError` when ``fn``, given as ``where``, cannot be called."""
    if not callable(fn):
        raise ValueError(f"{where} must be callable, got {type(fn).__name__} {brief(fn)}")


def function_name(fn: Callback) -> str:
    return f"{getattr(fn, '__module__', None) or '?'}.{getattr(fn, '__qualname__', None) or repr(fn)}"


class Callbacks:
    """The functions registered per hook, run in registration order (the default loggers first)."""

    def __init__(self, spec: CallbackSpec | None = None) -> None:
        # Each function with whether it is the user's (its errors are reported as a callback's).
        self._hooks: dict[str, list[tuple[Callback, bool]]] = {hook: [] for hook in HOOKS}
        if spec is None:
            return
        if not isinstance(spec, Mapping):
            raise ValueError("callbacks must be a mapping of hook names to a function or a list of functions "
                             f"({{'on_train_end': fn}}), got {type(spec).__name__} {brief(spec)}")
        for hook, fns in spec.items():
            check_hook(hook)
            if callable(fns):
                fns = [fns]
            elif not isinstance(fns, (list, tuple)):
                raise ValueError(f"callbacks[{hook!r}] must be a function or a list or tuple of functions, got "
                                 f"{type(fns).__name__} {brief(fns)}")
            for n, fn in enumerate(fns):
                check_callback(fn, f"callbacks[{hook!r}][{n}]")
                self.add(hook, fn)

    def add(self, hook: str, fn: Callback, *, user: bool = True) -> None:
        """Run ``fn`` at ``hook``. ``user=False`` marks yolotrain's own (the default loggers): their errors
        (a logger that cannot start, say) pass through as they are."""
        check_hook(hook)
        check_callback(fn, f"callback for {hook}")
        self._hooks[hook].append((fn, user))

    def extend(self, other: Callbacks) -> None:
        for hook, fns in other._hooks.items():
            self._hooks[hook].extend(fns)

    def run(self, hook: str, *args: Any) -> None:
        """Call each function of ``hook``; an exception becomes a one-line :class:`CallbackError`."""
        for fn, user in self._hooks[hook]:
            if not user:
                fn(*args)
                continue
            try:
                fn(*args)
            except Exception as error:
                detail = " ".join(str(error).split())
                raise CallbackError(f"callback {function_name(fn)} on {hook} failed: {type(error).__name__}"
                                    f"{': ' + detail if detail else ''}") from error


def as_callbacks(spec: Callbacks | CallbackSpec | None) -> Callbacks:
    return spec if isinstance(spec, Callbacks) else Callbacks(spec)
