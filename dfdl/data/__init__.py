"""Training data: array sources (numpy, dask.array, ``.npy`` paths) and batch order."""

from __future__ import annotations

from dfdl.data.order import batch_plan
from dfdl.data.sources import ArraySource, as_source

__all__ = ["ArraySource", "as_source", "batch_plan"]
