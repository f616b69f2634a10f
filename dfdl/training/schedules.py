"""Learning-rate schedules: ``schedule(step, base_lr) -> lr`` for the step's update.

``step`` counts the updates already done (0 for the first update), which is torch's
``scheduler.last_epoch`` when ``scheduler.step()`` is called after every
``optimizer.step()``: the ``t``-th update (1-based) uses ``schedule(t - 1, base_lr)``.
Each schedule is the closed form of the torch scheduler it names; torch computes some of
them recursively, so the two agree to float64 rounding.

Example:
    >>> s = step(step_size=2, gamma=0.5)
    >>> [s(k, 1.0) for k in range(5)]
    [1.0, 1.0, 0.5, 0.5, 0.25]
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dfdl.errors import ConfigError

Schedule = Callable[[int, float], float]


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, not {value!r}")
    return int(value)


def _finite(name: str, value, low: float | None = None, high: float | None = None) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, not {value!r}") from None
    if not math.isfinite(v) or (low is not None and v < low) or (high is not None and v > high):
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        raise ConfigError(f"{name} must be a finite number in [{lo}, {hi}], not {value!r}")
    return v


def _check_step(step: int) -> int:
    if step < 0:
        raise ConfigError(f"schedule step must be >= 0 (updates already done), not {step}")
    return step


def constant() -> Schedule:
    """The base learning rate at every step (no scheduler in torch).

    Example:
        >>> constant()(10, 0.1)
        0.1
    """

    def schedule(step: int, base_lr: float) -> float:
        _check_step(step)
        return base_lr

    return schedule


def step(step_size: int, gamma: float = 0.1) -> Schedule:
    """``torch.optim.lr_scheduler.StepLR``: ``base_lr * gamma ** (step // step_size)``.

    Example:
        >>> step(10, 0.1)(25, 1.0)
        0.010000000000000002
    """
    step_size = _positive_int("step_size", step_size)
    gamma = _finite("gamma", gamma, low=0.0)

    def schedule(k: int, base_lr: float) -> float:
        return base_lr * gamma ** (_check_step(k) // step_size)

    return schedule


def cosine(total_steps: int, min_lr: float = 0.0) -> Schedule:
    """``torch.optim.lr_scheduler.CosineAnnealingLR(T_max=total_steps, eta_min=min_lr)``.

    ``min_lr + (base_lr - min_lr) * (1 + cos(pi * step / total_steps)) / 2``; like torch,
    it keeps following the cosine (rising again) past ``total_steps``.

    Example:
        >>> cosine(4)(2, 1.0)
        0.5
    """
    total_steps = _positive_int("total_steps", total_steps)
    min_lr = _finite("min_lr", min_lr, low=0.0)

    def schedule(k: int, base_lr: float) -> float:
        k = _check_step(k)
        return min_lr + (base_lr - min_lr) * (1 + math.cos(math.pi * k / total_steps)) / 2

    return schedule


def linear_warmup(
    warmup_steps: int, then: Schedule | None = None, *, start_factor: float | None = None
) -> Schedule:
    """Linear warmup, then an optional schedule.

    For ``step <= warmup_steps`` this is ``torch.optim.lr_scheduler.LinearLR(
    start_factor=start_factor, end_factor=1.0, total_iters=warmup_steps)``: the factor
    rises linearly from ``start_factor`` (default ``1 / (warmup_steps + 1)``, so the
    factor is ``(step + 1) / (warmup_steps + 1)``) to 1 at ``step == warmup_steps``.
    From ``warmup_steps`` on, ``then(step - warmup_steps, base_lr)`` is used (torch's
    ``SequentialLR([LinearLR(...), then], milestones=[warmup_steps])``); without
    ``then`` the rate stays at ``base_lr``.

    Example:
        >>> s = linear_warmup(3)
        >>> [s(k, 1.0) for k in range(5)]
        [0.25, 0.5, 0.75, 1.0, 1.0]
    """
    warmup_steps = _positive_int("warmup_steps", warmup_steps)
    if start_factor is None:
        start_factor = 1.0 / (warmup_steps + 1)
    start_factor = _finite("start_factor", start_factor, low=0.0, high=1.0)
    if start_factor == 0.0:
        raise ConfigError("start_factor must be > 0 (as in torch's LinearLR), not 0")
    if then is not None and not callable(then):
        raise ConfigError(f"then must be a schedule (callable) or None, not {then!r}")

    def schedule(k: int, base_lr: float) -> float:
        k = _check_step(k)
        if then is not None and k >= warmup_steps:
            return then(k - warmup_steps, base_lr)
        frac = min(k, warmup_steps) / warmup_steps
        return base_lr * (start_factor + (1.0 - start_factor) * frac)

    return schedule
