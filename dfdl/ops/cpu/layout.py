"""numba kernel for ``dfdl.GatherGrad`` (the scatter-add behind an embedding gradient).

Data and ``dY`` are viewed as ``(pre, n, post)`` and ``(pre, k, post)`` around the gathered
axis; every index adds one ``post``-long row of ``dY`` to its row of the output, in index
order. float32/float64 only; other dtypes use the numpy forward.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from dfdl.ops import layout as ref

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


def GatherGrad(dY, indices, *, axis=0, data_shape):
    """Same as :func:`dfdl.ops.layout.GatherGrad`, by a numba scatter-add loop."""
    dY, indices = np.asarray(dY), np.asarray(indices)
    if dY.dtype not in _FLOATS or indices.dtype.kind not in "iu":
        return ref.GatherGrad(dY, indices, axis=axis, data_shape=data_shape)
    shape = tuple(int(d) for d in np.asarray(data_shape).reshape(-1))
    ax = ref._axis(axis, len(shape), "GatherGrad")
    n = shape[ax]
    idx = np.ascontiguousarray(indices.reshape(-1), dtype=np.int64)
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"GatherGrad: index out of range [-{n}, {n}) on axis {ax}")
    pre, post = math.prod(shape[:ax]), math.prod(shape[ax + 1 :])
    out = np.zeros(shape, dtype=dY.dtype)
    dy3 = np.ascontiguousarray(dY).reshape(pre, idx.size, post)
    _scatter_add(dy3, idx, out.reshape(pre, n, post))
    return out
