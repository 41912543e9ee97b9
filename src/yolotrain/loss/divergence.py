"""The error every training criterion raises when training has diverged, whatever the task."""


class DivergenceError(FloatingPointError):
    """Training has diverged: the loss or the predictions are NaN/infinite, or the logits saturated."""
