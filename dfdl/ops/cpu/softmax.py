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


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _sub_row_max(x, out):
    """out[r, :] = x[r, :] - max(x[r, :]) (NaNs do not count in the max).

    The max runs in 8 independent lanes: one running max is a chain of dependent
    compare-selects that LLVM does not vectorize (it may not reorder a NaN-ignoring max
    without ``nnan``), so 8 chains keep the core busy: 6.7 -> 2.8 ms for (16384, 256)
    float32 rows in blocks of 128 on one thread. The max of a row is the same value
    whatever order it is taken in (a +0 for a -0 at most, which gives the same output).
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


# ----------------------------------------------------------------- backward kernels


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


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _sce_finish_rows(e, labels, coef):
    """e[r, :] = coef[r] * (e[r, :] / sum(e[r, :]) - onehot(labels[r])), in place."""
    rows, n = e.shape
    for r in range(rows):
        s = 0.0
        for j in range(n):
            s += e[r, j]
        a = coef[r] / s
        for j in range(n):
            e[r, j] = e[r, j] * a
        e[r, labels[r]] -= coef[r]


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _sub_max_axis1(x, out):
    """out[n, :, s] = x[n, :, s] - max over the class axis, for x (N, C, S)."""
    N, C, S = x.shape
    mx = np.empty(S, dtype=x.dtype)
    for n in range(N):
        for s in range(S):
            mx[s] = x[n, 0, s]
        for c in range(1, C):
            for s in range(S):
                if x[n, c, s] > mx[s]:
                    mx[s] = x[n, c, s]
        for c in range(C):
            for s in range(S):
                out[n, c, s] = x[n, c, s] - mx[s]


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _sce_finish_nc(e, labels, coef):
    """_sce_finish_rows over the class axis of e (N, C, S): S-vectors stay contiguous."""
    N, C, S = e.shape
    sm = np.empty(S)
    for n in range(N):
        for s in range(S):
            sm[s] = 0.0
        for c in range(C):
            for s in range(S):
                sm[s] += e[n, c, s]
        for s in range(S):
            sm[s] = coef[n, s] / sm[s]
        for c in range(C):
            for s in range(S):
                e[n, c, s] = e[n, c, s] * sm[s]
        for s in range(S):
            e[n, labels[n, s], s] -= coef[n, s]


# ----------------------------------------------------------------- backward wrappers


def _grad_rows(kernel, dY, Y):
    n = Y.shape[-1]
    y = np.ascontiguousarray(Y).reshape(-1, n)
    dy = np.ascontiguousarray(dY).reshape(-1, n)
    dx = np.empty_like(y)
    kernel(dy, y, dx)
    return dx.reshape(Y.shape)


def cpu_softmax_grad(dY, Y, *, axis=-1):
    """dfdl.SoftmaxGrad with a row kernel on the last axis; numpy forward otherwise."""
    if not _use_kernel(Y, axis):
        from dfdl.ops.norm import SoftmaxGrad

        return SoftmaxGrad(dY, Y, axis=axis)
    return _grad_rows(_softmax_grad_rows, dY, Y)


def cpu_log_softmax_grad(dY, Y, *, axis=-1):
    """dfdl.LogSoftmaxGrad with a row kernel on the last axis; numpy forward otherwise."""
    if not _use_kernel(Y, axis):
        from dfdl.ops.norm import LogSoftmaxGrad

        return LogSoftmaxGrad(dY, Y, axis=axis)
    n = Y.shape[-1]
    y = np.ascontiguousarray(Y).reshape(-1, n)
    dy = np.ascontiguousarray(dY).reshape(-1, n)
    dx = np.empty_like(y)
    step = max(1, _BLOCK // max(n, 1))
    for i in range(0, y.shape[0], step):
        # numpy's SIMD exp on a cache-sized block, written into dx then overwritten
        e = np.exp(y[i : i + step], out=dx[i : i + step])
        _log_softmax_grad_rows(dy[i : i + step], e, dx[i : i + step])
    return dx.reshape(Y.shape)


def cpu_softmax_cross_entropy_loss_grad(
    dloss, scores, labels, weights=None, *, ignore_index=None, reduction="mean"
):
    """dfdl.SoftmaxCrossEntropyLossGrad with a numba kernel for float32/float64 scores."""
    from dfdl.ops.loss import SoftmaxCrossEntropyLossGrad, loss_coefficients

    if scores.dtype not in _FLOATS or scores.size == 0:
        return SoftmaxCrossEntropyLossGrad(
            dloss, scores, labels, weights, ignore_index=ignore_index, reduction=reduction
        )
    coef, safe = loss_coefficients(dloss, labels, weights, reduction, ignore_index)
    N, C = scores.shape[:2]
    x = np.ascontiguousarray(scores).reshape(N, C, -1)
    S = x.shape[2]
    coef = np.ascontiguousarray(coef, dtype=np.float64).reshape(N, S)
    safe = safe.reshape(N, S)
    out = np.empty_like(x)
    step = max(1, _BLOCK // max(C * S, 1))
    for i in range(0, N, step):
        ob = out[i : i + step]
        if S == 1:  # rows: the class axis is contiguous
            rows = ob.reshape(-1, C)
            _sub_row_max(x[i : i + step].reshape(-1, C), rows)
            np.exp(rows, out=rows)
            _sce_finish_rows(rows, safe[i : i + step, 0], coef[i : i + step, 0])
        else:
            _sub_max_axis1(x[i : i + step], ob)
            np.exp(ob, out=ob)
            _sce_finish_nc(ob, safe[i : i + step], coef[i : i + step])
    return out.reshape(scores.shape)
