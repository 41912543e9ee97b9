"""Optuna parts of ``tune``: the search space as distributions, and the reference's genetic mutation as a
sampler. Imported only when tuning (Optuna is the ``tune`` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from .evolve import FACTOR_RANGE, MUTATION_PROBABILITY, PARENTS, SIGMA
from .space import REFERENCE_META, Parameter


def distribution(parameter: Parameter) -> BaseDistribution:
    """The Optuna distribution of one searched setting."""
    if parameter.kind == "choice":
        return CategoricalDistribution(parameter.choices)
    if parameter.kind == "int":
        return IntDistribution(int(parameter.low), int(parameter.high), log=parameter.log)
    return FloatDistribution(parameter.low, parameter.high, log=parameter.log)


def suggest(trial: optuna.Trial, space: Sequence[Parameter]) -> dict[str, Any]:
    """The trial's values of every searched setting."""
    values: dict[str, Any] = {}
    for p in space:
        if p.kind == "choice":
            values[p.name] = trial.suggest_categorical(p.name, list(p.choices))
        elif p.kind == "int":
            values[p.name] = trial.suggest_int(p.name, int(p.low), int(p.high), log=p.log)
        else:
            values[p.name] = trial.suggest_float(p.name, p.low, p.high, log=p.log)
    return values


class ReferenceMutationSampler(optuna.samplers.BaseSampler):
    """The reference's evolution as a sampler: a parent drawn from the best 5 finished trials (weights
    rising with fitness) and its numbers multiplied by ``1 + gain * N(0,1) * U(0,1) * 0.2`` (kept within
    0.3..3, each mutating with probability 0.8, the gains of the reference's table, 1 for other settings),
    then kept within the searched range. Choices are inherited. Without finished trials, values are drawn
    at random (the first trial of a study is the default settings, queued)."""

    def __init__(self, space: Sequence[Parameter], seed: int | None = None) -> None:
        self._space = {p.name: distribution(p) for p in space}
        self._rng = np.random.default_rng(seed)
        self._random = optuna.samplers.RandomSampler(seed=seed)

    def reseed_rng(self) -> None:
        self._rng = np.random.default_rng()
        self._random.reseed_rng()

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self._space)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        finished = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None]
        if not finished:
            return {}
        best = sorted(finished, key=lambda t: -t.value)[:PARENTS]
        scores = np.array([t.value for t in best])
        weights = scores - scores.min() + 1e-6
        parent = best[self._rng.choice(len(best), p=weights / weights.sum())].params
        numeric = [name for name, d in search_space.items()
                   if not isinstance(d, CategoricalDistribution) and name in parent]
        gains = np.array([REFERENCE_META[n].gain if n in REFERENCE_META else 1.0 for n in numeric])
        factors = np.ones(len(numeric))
        while len(numeric) and np.all(factors == 1) and gains.any():
            mutated = self._rng.random(len(numeric)) < MUTATION_PROBABILITY
            factors = (gains * mutated * self._rng.standard_normal(len(numeric)) * self._rng.random() * SIGMA
                       + 1).clip(*FACTOR_RANGE)
        values = {name: parent[name] for name, d in search_space.items() if name in parent}
        for name, factor in zip(numeric, factors):
            d = search_space[name]
            value = min(max(float(f"{parent[name] * factor:.5g}"), d.low), d.high)  # 5 digits, as evolve.csv
            values[name] = int(round(value)) if isinstance(d, IntDistribution) else value
        return values

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)
