"""Softmax and LogSoftmax kernels and their gradients, over the last axis (float32/64).

numba has no vectorized ``exp`` here (no SVML), so numpy's SIMD ``exp`` runs in place on
cache-sized blocks of rows, between two numba passes: subtract the row max, then
normalize with a float64 row sum. The ``accepts`` rules leave other axes (they would need
two transposing copies: numpy's strided reductions win there), other dtypes and empty
tensors to the numpy forwards; the kernels take no parameters (see
:func:`dfdl.ops.softmax.softmax_params`).

Example:
    >>> softmax(np.array([[0.0, 0.0]], np.float32))
    array([[0.5, 0.5]], dtype=float32)
"""

from __future__ import annotations

import math

import numba
import numpy as np

from dfdl.ops.registry import kernel

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
#: elements per block of rows (fits in L2 with its temporaries)
BLOCK = 1 << 15


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def sub_row_max(x, out):
    """out[r, :] = x[r, :] - max(x[r, :]) (NaNs do not count in the max).

    The max runs in 8 independent lanes: one running max is a chain of dependent
    compare-selects that LLVM does not vectorize (it may not reorder a NaN-ignoring max
    without ``nnan``), so 8 chains keep the core busy (``docs/design/softmax-row-max.md``).
    The max of a row is the same value whatever order it is taken in (a +0 for a -0 at
    most, which gives the same output).
    """
    rows, n = x.shape
    for r in range(rows):
        m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = -np.inf
        j = 0
        while j + 8 <= n:
            v0, v1, v2, v3 = x[r, j], x[r, j + 1], x[r, j + 2], x[r, j + 3]
            v4, v5, v6, v7 = x[r, j + 4], x[r, j + 5], x[r, j + 6], x[r, j + 7]
            m0 = v0 if v0 > m0 else m0
            m1 = v1 if v1 > m1 else m1
            m2 = v2 if v2 > m2 else m2
            m3 = v3 if v3 > m3 else m3
            m4 = v4 if v4 > m4 else m4
            m5 = v5 if v5 > m5 else m5
            m6 = v6 if v6 > m6 else m6
            m7 = v7 if v7 > m7 else m7
            j += 8
        m = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
        while j < n:
            m = x[r, j] if x[r, j] > m else m
            j += 1
        for j in range(n):
            out[r, j] = x[r, j] - m


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
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


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
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


def _last_axis(x, *inputs, axis=-1) -> bool:
    """Whether the (soft)max axis of ``x`` is its last and the kernels take ``x``."""
    return x.dtype in _FLOATS and x.size > 0 and axis in (-1, x.ndim - 1)


def _output_last_axis(dY, Y, *, axis=-1) -> bool:
    return _last_axis(Y, axis=axis)


def _run_rows(x: np.ndarray, log: bool) -> np.ndarray:
    """Runs the row kernels on the last axis, block by block."""
    n = x.shape[-1]
    x2 = np.ascontiguousarray(x).reshape(-1, n)
    out = np.empty_like(x2)
    step = max(1, BLOCK // max(n, 1))
    for i in range(0, x2.shape[0], step):
        ob = out[i : i + step]
        sub_row_max(x2[i : i + step], ob)
        if log:
            _sub_log_row_sum(ob, np.exp(ob))
        else:
            np.exp(ob, out=ob)
            _div_row_sum(ob)
    return out.reshape(x.shape)


@kernel("Softmax", accepts=_last_axis)
def softmax(input):
    """Softmax of a float32/float64 tile over its last axis."""
    return _run_rows(input, False)


@kernel("LogSoftmax", accepts=_last_axis)
def log_softmax(input):
    """LogSoftmax of a float32/float64 tile over its last axis."""
    return _run_rows(input, True)


# ------------------------------------------------------------ backward row kernels


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _softmax_grad_rows(dy, y, dx):
    """dx[r, :] = y[r, :] * (dy[r, :] - sum(dy[r, :] * y[r, :]))."""
    rows, n = y.shape
    for r in range(rows):
        s = 0.0
        for j in range(n):
            s += dy[r, j] * y[r, j]
        for j in range(n):
            dx[r, j] = y[r, j] * (dy[r, j] - s)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _log_softmax_grad_rows(dy, e, dx):
    """dx[r, :] = dy[r, :] - e[r, :] * sum(dy[r, :]) where e = exp(y)."""
    rows, n = e.shape
    for r in range(rows):
        s = 0.0
        for j in range(n):
            s += dy[r, j]
        for j in range(n):
            dx[r, j] = dy[r, j] - e[r, j] * s


# ------------------------------------------------------------- backward kernels


def _grad_rows(rows_kernel, dY, Y):
    n = Y.shape[-1]
    y = np.ascontiguousarray(Y).reshape(-1, n)
    dy = np.ascontiguousarray(dY).reshape(-1, n)
    dx = np.empty_like(y)
    rows_kernel(dy, y, dx)
    return dx.reshape(Y.shape)


@kernel("SoftmaxGrad", domain="dfdl", accepts=_output_last_axis)
def softmax_grad(dY, Y):
    """dfdl.SoftmaxGrad of a float32/float64 tile over its last axis."""
    return _grad_rows(_softmax_grad_rows, dY, Y)


@kernel("LogSoftmaxGrad", domain="dfdl", accepts=_output_last_axis)
def log_softmax_grad(dY, Y):
    """dfdl.LogSoftmaxGrad of a float32/float64 tile over its last axis."""
    n = Y.shape[-1]
    y = np.ascontiguousarray(Y).reshape(-1, n)
    dy = np.ascontiguousarray(dY).reshape(-1, n)
    dx = np.empty_like(y)
    step = max(1, BLOCK // max(n, 1))
    for i in range(0, y.shape[0], step):
        # numpy's SIMD exp on a cache-sized block, written into dx then overwritten
        e = np.exp(y[i : i + step], out=dx[i : i + step])
        _log_softmax_grad_rows(dy[i : i + step], e, dx[i : i + step])
    return dx.reshape(Y.shape)
