"""Which samples go into which step: per-epoch shuffles from the seed, drop_last.

:func:`batch_plan` yields ``(step, epoch, sample indices)`` for every step from
``start``; :func:`epoch_order` shuffles each epoch by a generator seeded with
``(seed, epoch)``. Guarantee: the order depends only on the sample count, the batch
size, the seed and the flags, so a run resumed from a checkpoint at step ``start`` (or
replayed after a lost worker) gets the same batches as one that never stopped.

Example:
    >>> steps_per_epoch(10, 4, drop_last=False), steps_per_epoch(10, 4, drop_last=True)
    (3, 2)
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def epoch_order(n: int, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
    """Sample order of one epoch: a permutation from ``(seed, epoch)``, or 0..n-1."""
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([seed, epoch]).permutation(n)


def batch_plan(
    n: int,
    batch_size: int,
    *,
    epochs: int = 1,
    steps: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    start: int = 0,
) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yield ``(step, epoch, sample indices)`` for every training step from ``start``.

    Example:
        >>> [(s, e, i.tolist()) for s, e, i in batch_plan(5, 2, shuffle=False)]
        [(0, 0, [0, 1]), (1, 0, [2, 3]), (2, 0, [4])]
    """
    per_epoch = n // batch_size if drop_last else -(-n // batch_size)
    total = per_epoch * epochs if steps is None else min(steps, per_epoch * max(epochs, 1))
    if steps is not None and steps > per_epoch * max(epochs, 1):
        total = steps  # more steps than epochs give: keep cycling epochs
    for step in range(start, total):
        epoch, k = divmod(step, per_epoch)
        order = epoch_order(n, epoch, seed, shuffle)
        yield step, epoch, order[k * batch_size : (k + 1) * batch_size]


def steps_per_epoch(n: int, batch_size: int, drop_last: bool) -> int:
    """Number of steps in one epoch."""
    return n // batch_size if drop_last else -(-n // batch_size)
