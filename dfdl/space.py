"""Search spaces of :func:`dfdl.tune`, in plain Python.

A space is a dict from a :func:`dfdl.train` argument (or an optimizer hyperparameter, a
loss option or a model-builder argument, see :func:`dfdl.tune`) to a distribution made
here, an Optuna distribution (``optuna.distributions.FloatDistribution`` ...), or a
plain value, which every trial takes as it is. The distributions check their bounds
when made and turn into Optuna's (:func:`to_optuna`), so the study opens in
``optuna-dashboard`` as any Optuna study. Importing this module does not import Optuna.

Example:
    >>> import dfdl.space
    >>> space = {"lr": dfdl.space.loguniform(1e-4, 1e-1), "batch_size": dfdl.space.choice([16, 32])}
    >>> space["lr"]
    loguniform(0.0001, 0.1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dfdl.errors import ConfigError

__all__ = ["Choice", "Distribution", "choice", "intuniform", "loguniform", "to_optuna", "uniform"]

#: what Optuna stores of a categorical choice as it is; other values are stored by label
PLAIN = (type(None), bool, int, float, str)


class Distribution:
    """Base class of this module's distributions."""


@dataclass(frozen=True)
class Uniform(Distribution):
    """A float drawn between ``low`` and ``high``, on a log scale with ``log``."""

    low: float
    high: float
    log: bool = False

    def __repr__(self) -> str:
        return f"{'loguniform' if self.log else 'uniform'}({self.low!r}, {self.high!r})"


@dataclass(frozen=True)
class IntUniform(Distribution):
    """An integer from ``low`` to ``high`` (both included), by ``step``."""

    low: int
    high: int
    step: int = 1
    log: bool = False

    def __repr__(self) -> str:
        return f"intuniform({self.low!r}, {self.high!r}, step={self.step!r}, log={self.log!r})"


@dataclass(frozen=True)
class Choice(Distribution):
    """One of ``values`` (any Python values: numbers, names, classes, schedules)."""

    values: tuple

    def labels(self) -> list:
        """What Optuna stores for each value: the value itself when Optuna can store
        it, else its name or ``repr`` (made unique by its index where two clash)."""
        out = []
        for i, v in enumerate(self.values):
            label = v if isinstance(v, PLAIN) else getattr(v, "__name__", None) or repr(v)
            out.append(label if label not in out else f"{label}#{i}")
        return out

    def __repr__(self) -> str:
        return f"choice({list(self.values)!r})"


def _bounds(kind: str, low, high, *, positive: bool = False) -> None:
    for name, v in (("low", low), ("high", high)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ConfigError(f"{kind}: {name} must be a finite number, not {v!r}")
    if positive and low <= 0:
        raise ConfigError(f"{kind}: low must be > 0 on a log scale, not {low!r}")
    if not low < high:
        raise ConfigError(f"{kind}: low must be below high, got low={low!r}, high={high!r}")


def uniform(low: float, high: float) -> Uniform:
    """A float drawn uniformly between ``low`` and ``high``.

    Example:
        >>> uniform(0.0, 0.99)
        uniform(0.0, 0.99)
    """
    _bounds("uniform", low, high)
    return Uniform(float(low), float(high))


def loguniform(low: float, high: float) -> Uniform:
    """A float drawn uniformly on a log scale between ``low`` and ``high`` (> 0): a
    learning rate, a weight decay.

    Example:
        >>> loguniform(1e-4, 1e-1)
        loguniform(0.0001, 0.1)
    """
    _bounds("loguniform", low, high, positive=True)
    return Uniform(float(low), float(high), log=True)


def intuniform(low: int, high: int, step: int = 1, log: bool = False) -> IntUniform:
    """An integer from ``low`` to ``high``, both included, by ``step`` (on a log scale
    with ``log``).

    Example:
        >>> intuniform(1, 4)
        intuniform(1, 4, step=1, log=False)
    """
    for name, v in (("low", low), ("high", high), ("step", step)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"intuniform: {name} must be an integer, not {v!r}")
    _bounds("intuniform", low, high, positive=log)
    if step < 1 or (log and step != 1):
        raise ConfigError(f"intuniform: step must be a positive integer (1 with log), not {step}")
    return IntUniform(low, high, step, bool(log))


def choice(values) -> Choice:
    """One of ``values``, a non-empty list of distinct values of any type.

    Example:
        >>> choice([16, 32, 64])
        choice([16, 32, 64])
    """
    if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
        raise ConfigError(f"choice takes a list of values, not {values!r}")
    values = tuple(values)
    if not values:
        raise ConfigError("choice needs at least one value")
    return Choice(values)


def is_distribution(value: Any) -> bool:
    """Whether ``value`` is drawn per trial (ours or Optuna's), not a fixed value.

    Example:
        >>> is_distribution(uniform(0, 1)), is_distribution(0.9)
        (True, False)
    """
    if isinstance(value, Distribution):
        return True
    return type(value).__module__.startswith("optuna.distributions")


def to_optuna(value: Distribution):
    """The Optuna distribution of one of this module's (Optuna's are returned as they are).

    Example:
        >>> to_optuna(loguniform(1e-3, 1e-1))  # doctest: +SKIP
        FloatDistribution(high=0.1, log=True, low=0.001, step=None)
    """
    from optuna import distributions as od

    if isinstance(value, Uniform):
        return od.FloatDistribution(value.low, value.high, log=value.log)
    if isinstance(value, IntUniform):
        return od.IntDistribution(value.low, value.high, log=value.log, step=value.step)
    if isinstance(value, Choice):
        return od.CategoricalDistribution(value.labels())
    return value
