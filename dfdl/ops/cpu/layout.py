"""numba kernel for ``dfdl.GatherGrad`` (the scatter-add behind an embedding gradient).

Data and ``dY`` are viewed as ``(pre, n, post)`` and ``(pre, k, post)`` around the gathered
axis; every index adds one ``post``-long row of ``dY`` to its row of the output, in index
order, so repeated indices sum in a fixed order. An index out of range raises
``IndexError``. float32/float64 only; other dtypes use the numpy forward. The kernel
receives the axis and data shape resolved by :func:`dfdl.ops.layout.gather_grad_params`.

Example:
    >>> gather_grad(np.ones((3, 2), np.float32), np.array([0, 2, 0]), axis=0,
    ...             data_shape=(4, 2))[:, 0]
    array([2., 0., 1., 0.], dtype=float32)
"""

from __future__ import annotations

import math

import numba
import numpy as np

from dfdl.ops.registry import kernel

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@numba.njit(cache=True, nogil=True)
def _scatter_add(dy, idx, out):
    """out[p, idx[k], :] += dy[p, k, :] (negative indices count from the end)."""
    pre, k, post = dy.shape
    n = out.shape[1]
    for p in range(pre):
        for j in range(k):
            row = idx[j] + n if idx[j] < 0 else idx[j]
            for q in range(post):
                out[p, row, q] += dy[p, j, q]


def _accepts(dY, indices, **attrs) -> bool:
    return np.asarray(dY).dtype in _FLOATS and np.asarray(indices).dtype.kind in "iu"


@kernel("GatherGrad", accepts=_accepts, domain="dfdl")
def gather_grad(dY, indices, *, axis, data_shape):
    """``dY`` summed into zeros of ``data_shape`` at ``indices`` along ``axis`` (the
    params rule's normalized axis), by a numba scatter-add loop."""
    dY, indices = np.asarray(dY), np.asarray(indices)
    n = data_shape[axis]
    idx = np.ascontiguousarray(indices.reshape(-1), dtype=np.int64)
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"GatherGrad: index out of range [-{n}, {n}) on axis {axis}")
    pre, post = math.prod(data_shape[:axis]), math.prod(data_shape[axis + 1 :])
    out = np.zeros(data_shape, dtype=dY.dtype)
    dy3 = np.ascontiguousarray(dY).reshape(pre, idx.size, post)
    _scatter_add(dy3, idx, out.reshape(pre, n, post))
    return out
