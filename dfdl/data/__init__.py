"""Training data: array sources (numpy, dask.array, ``.npy`` paths) and batch order.

:func:`as_source` wraps what a user passes as ``data=`` in an :class:`ArraySource`
that reads batches by sample index (files are read on the workers); :func:`batch_plan`
says which samples each step takes, from the seed alone, so a resumed or replayed run
sees the same batches.

Example:
    >>> [(s, e, i.tolist()) for s, e, i in batch_plan(5, 2, shuffle=False)]
    [(0, 0, [0, 1]), (1, 0, [2, 3]), (2, 0, [4])]
"""

from __future__ import annotations

from dfdl.data.order import batch_plan
from dfdl.data.sources import ArraySource, as_source

__all__ = ["ArraySource", "as_source", "batch_plan"]
