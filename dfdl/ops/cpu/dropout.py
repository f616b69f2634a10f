"""Numba kernel of Dropout: the counter hash, mask and scaled output in one pass.

Element ``(r, c)`` of a tile seen as (rows, last axis) has global flat index
``row_base[r] + c``; the kernel draws exactly :func:`dfdl.ops.dropout.dropout_uniform`'s
numbers for it (splitmix64 of ``key + (index + 1) * golden``, top 53 bits). ``rate``,
``key`` and ``row_base`` come from :func:`dfdl.ops.dropout.dropout_params`. The
``accepts`` rule takes float32/float64 tiles of rank >= 1 in training mode with
``0 < ratio < 1``; the numpy forward covers the rest (inference, ratio 0 or 1).

Example:
    >>> out, mask = dropout(
    ...     np.ones((1, 2), np.float32), rate=0.5, key=np.uint64(1), row_base=np.zeros(1, "u8")
    ... )
    >>> bool((out[mask] == 2).all() and (out[~mask] == 0).all())
    True
"""

from __future__ import annotations

import numba
import numpy as np

from dfdl.ops.registry import kernel

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@numba.njit(cache=True, nogil=True)
def _dropout_rows(x, out, mask, row_base, key, ratio, scale):
    """One pass: counter hash of each element's global index, mask, scaled output.

    Element (r, c) of the (rows, cols) tile has global flat index ``row_base[r] + c``;
    the numbers are exactly those of :func:`dfdl.ops.dropout.dropout_uniform`.
    """
    golden = np.uint64(0x9E3779B97F4A7C15)
    m1 = np.uint64(0xBF58476D1CE4E5B9)
    m2 = np.uint64(0x94D049BB133111EB)
    inv = 1.0 / 9007199254740992.0  # 2**-53
    zero = x.dtype.type(0)
    for r in range(x.shape[0]):
        base = row_base[r]
        for c in range(x.shape[1]):
            z = key + (base + np.uint64(c) + np.uint64(1)) * golden
            z = (z ^ (z >> np.uint64(30))) * m1
            z = (z ^ (z >> np.uint64(27))) * m2
            z = z ^ (z >> np.uint64(31))
            keep = np.float64(z >> np.uint64(11)) * inv >= ratio
            mask[r, c] = keep
            out[r, c] = x[r, c] * scale if keep else zero


def _accepts(data, ratio=None, training_mode=None, **attrs) -> bool:
    r = 0.5 if ratio is None else float(np.asarray(ratio).item())
    training = training_mode is not None and bool(np.asarray(training_mode).item())
    return data.dtype in _FLOATS and data.ndim > 0 and training and 0 < r < 1


@kernel("Dropout", accepts=_accepts)
def dropout(
    data, ratio=None, training_mode=None, *, rate: float, key: np.uint64, row_base: np.ndarray
):
    """Training-mode Dropout of a float32/float64 tile; returns ``(output, mask)``."""
    shape = data.shape
    x = np.ascontiguousarray(data).reshape(-1, shape[-1])
    out = np.empty_like(x)
    mask = np.empty(x.shape, dtype=np.bool_)
    scale = np.asarray(1.0 / (1.0 - rate), dtype=data.dtype)[()]
    _dropout_rows(x, out, mask, row_base, key, rate, scale)
    return out.reshape(shape), mask.reshape(shape)
