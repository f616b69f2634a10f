"""Hyperparameter selection on one cluster: :func:`dfdl.tune`.

:mod:`~dfdl.tuning.tuner` checks and opens the study, :mod:`~dfdl.tuning.waves` runs
it (waves of trials, many at once), :mod:`~dfdl.tuning.trial` one trial (a training
that reports each epoch and stops when pruned), :mod:`~dfdl.tuning.order` the order
trials report in,
:mod:`~dfdl.tuning.params` the space resolved into training arguments,
:mod:`~dfdl.tuning.study` Optuna's storage, samplers and pruners,
:mod:`~dfdl.tuning.progress` the bar, :mod:`~dfdl.tuning.result` what it returns.
Optuna is imported when a study starts, not with dfdl.

Example:
    >>> from dfdl.tuning import tune, TuneResult
"""

from __future__ import annotations

from dfdl.tuning.result import Trial, TuneResult
from dfdl.tuning.tuner import tune

__all__ = ["Trial", "TuneResult", "tune"]
