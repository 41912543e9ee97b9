"""Hyper-parameter search: the reference's evolution (``train --evolve``) and Optuna studies (``tune``).

Optuna is imported only by :func:`tune` (the ``tune`` extra); evolution needs nothing beyond training.
"""

from .evolve import EvolveResult, evolve
from .study import TuneError, TuneResult, tune

__all__ = ["EvolveResult", "TuneError", "TuneResult", "evolve", "tune"]
