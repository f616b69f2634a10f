"""Numba kernels of LRN and dfdl.LRNGrad (float32/float64, channels on axis 1).

Each ``(n, c)`` row of spatial positions sums the squares of its channel window in a
float64 accumulator and applies the power in float64, rounding once to the output
dtype: what :mod:`dfdl.ops.lrn`'s numpy forwards compute, without their window-sized
temporaries. The kernels receive :func:`dfdl.ops.lrn.lrn_params`.

Example:
    >>> x = np.ones((1, 3, 1, 1), np.float32)
    >>> lrn(x, alpha=3.0, beta=1.0, bias=1.0, size=3).ravel()
    array([0.33333334, 0.25      , 0.33333334], dtype=float32)
"""

from __future__ import annotations

import math

import numba
import numpy as np

from dfdl.ops.registry import kernel

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@numba.njit(cache=True, nogil=True)
def _window_sums(x, before, after, coef, bias, sq, s):
    """``s[c, :] = bias + coef * sum of x[i, :]^2`` over ``c - before <= i <= c + after``,
    for one sample ``x`` (C, S), in float64 (``sq`` is scratch of s's shape)."""
    C, S = x.shape
    for c in range(C):
        for j in range(S):
            v = np.float64(x[c, j])
            sq[c, j] = v * v
    for c in range(C):
        for j in range(S):
            s[c, j] = 0.0
        for i in range(max(0, c - before), min(C, c + after + 1)):
            for j in range(S):
                s[c, j] += sq[i, j]
        for j in range(S):
            s[c, j] = bias + coef * s[c, j]


@numba.njit(cache=True, nogil=True, inline="always")
def _pow_neg(s, beta):
    """``s ** -beta``; beta = 0.75 (AlexNet's, GoogLeNet's) through square roots, which
    vectorize where pow does not."""
    if beta == 0.75:
        return 1.0 / math.sqrt(s * math.sqrt(s))
    return s**-beta


@numba.njit(cache=True, nogil=True)
def _lrn(x, before, after, coef, bias, beta, y):
    N, C, S = x.shape
    s = np.empty((C, S))
    sq = np.empty((C, S))
    for n in range(N):
        _window_sums(x[n], before, after, coef, bias, sq, s)
        for c in range(C):
            for j in range(S):
                y[n, c, j] = np.float64(x[n, c, j]) * _pow_neg(s[c, j], beta)


@numba.njit(cache=True, nogil=True)
def _lrn_grad(dy, x, before, after, coef, bias, beta, dx):
    N, C, S = x.shape
    s = np.empty((C, S))
    t = np.empty((C, S))
    back = np.empty(S)
    k = 2.0 * coef * beta
    for n in range(N):
        # t is scratch for the squares first, then dY X S^(-beta - 1); s becomes S^-beta
        _window_sums(x[n], before, after, coef, bias, t, s)
        for c in range(C):
            for j in range(S):
                p = _pow_neg(s[c, j], beta)
                t[c, j] = np.float64(dy[n, c, j]) * x[n, c, j] * p / s[c, j]
                s[c, j] = p
        for i in range(C):
            # channel i is in the windows of channels i - after .. i + before
            for j in range(S):
                back[j] = 0.0
            for c in range(max(0, i - after), min(C, i + before + 1)):
                for j in range(S):
                    back[j] += t[c, j]
            for j in range(S):
                xi = np.float64(x[n, i, j])
                dx[n, i, j] = dy[n, i, j] * s[i, j] - k * xi * back[j]


def _nc_s(a: np.ndarray) -> np.ndarray:
    """(N, C, D1, ...) as a contiguous (N, C, S) view."""
    return np.ascontiguousarray(a).reshape(a.shape[0], a.shape[1], -1)


def _geometry(size: int, alpha: float) -> tuple[int, int, float]:
    return (size - 1) // 2, math.ceil((size - 1) / 2), alpha / size


def _accepts(X, *rest, **attrs) -> bool:
    return X.dtype in _FLOATS and all(r.dtype == X.dtype for r in rest)


@kernel("LRN", accepts=_accepts)
def lrn(X, *, alpha: float, beta: float, bias: float, size: int):
    """LRN of a float32/float64 (N, C, ...) tile."""
    before, after, coef = _geometry(size, alpha)
    x = _nc_s(X)
    y = np.empty(X.shape, X.dtype)
    _lrn(x, before, after, coef, bias, beta, y.reshape(x.shape))
    return y


def _grad_accepts(dY, X, **attrs) -> bool:
    return _accepts(X, dY)


@kernel("LRNGrad", domain="dfdl", accepts=_grad_accepts)
def lrn_grad(dY, X, *, alpha: float, beta: float, bias: float, size: int):
    """dfdl.LRNGrad of a float32/float64 tile."""
    before, after, coef = _geometry(size, alpha)
    x = _nc_s(X)
    dx = np.empty(X.shape, X.dtype)
    _lrn_grad(_nc_s(dY), x, before, after, coef, bias, beta, dx.reshape(x.shape))
    return dx
