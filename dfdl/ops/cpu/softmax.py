"""Softmax and LogSoftmax kernels over the last axis (float32/float64).

numba has no vectorized ``exp`` here (no SVML), so numpy's SIMD ``exp`` runs in place on
cache-sized blocks of rows, between two numba passes: subtract the row max, then
normalize with a float64 row sum. Other axes and dtypes use the numpy forward.
"""

from __future__ import annotations

import math

import numba
import numpy as np

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
#: elements per block of rows (fits in L2 with its temporaries)
_BLOCK = 1 << 15


@numba.njit(cache=True, fastmath={"reassoc", "contract"})
def _sub_row_max(x, out):
    """out[r, :] = x[r, :] - max(x[r, :])."""
    rows, n = x.shape
    for r in range(rows):
        m = -np.inf
        for j in range(n):
            if x[r, j] > m:
                m = x[r, j]
        for j in range(n):
            out[r, j] = x[r, j] - m


@numba.njit(cache=True, fastmath={"reassoc", "contract"})
def _div_row_sum(e):
    """e[r, :] /= sum(e[r, :]) (sum in float64)."""
    rows, n = e.shape
    for r in range(rows):
        s = 0.0
        for j in range(n):
            s += e[r, j]
        inv = 1.0 / s
        for j in range(n):
            e[r, j] = e[r, j] * inv


@numba.njit(cache=True, fastmath={"reassoc", "contract"})
def _sub_log_row_sum(d, e):
    """d[r, :] -= log(sum(e[r, :])) where e = exp(d) (sum in float64)."""
    rows, n = d.shape
    for r in range(rows):
        s = 0.0
        for j in range(n):
            s += e[r, j]
        ls = math.log(s)
        for j in range(n):
            d[r, j] = d[r, j] - ls


def _use_kernel(x: np.ndarray, axis: int) -> bool:
    # another axis would need two transposing copies: numpy's strided reductions win there
    return x.dtype in _FLOATS and x.size > 0 and axis in (-1, x.ndim - 1)


def _run_rows(x: np.ndarray, log: bool) -> np.ndarray:
    """Runs the row kernels on the last axis, block by block."""
    n = x.shape[-1]
    x2 = np.ascontiguousarray(x).reshape(-1, n)
    out = np.empty_like(x2)
    step = max(1, _BLOCK // max(n, 1))
    for i in range(0, x2.shape[0], step):
        ob = out[i : i + step]
        _sub_row_max(x2[i : i + step], ob)
        if log:
            _sub_log_row_sum(ob, np.exp(ob))
        else:
            np.exp(ob, out=ob)
            _div_row_sum(ob)
    return out.reshape(x.shape)


def cpu_softmax(input, *, axis=-1):
    """Softmax with the row kernels for float32/float64; numpy forward otherwise."""
    if not _use_kernel(input, axis):
        from dfdl.ops.norm import Softmax

        return Softmax(input, axis=axis)
    return _run_rows(input, False)


def cpu_log_softmax(input, *, axis=-1):
    """LogSoftmax with the row kernels for float32/float64; numpy forward otherwise."""
    if not _use_kernel(input, axis):
        from dfdl.ops.norm import LogSoftmax

        return LogSoftmax(input, axis=axis)
    return _run_rows(input, True)
