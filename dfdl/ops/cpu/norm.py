"""Numba kernels of Instance- and LayerNormalization and their gradients (float32/64).

Statistics accumulate in float64; results are rounded once to the output dtype. The
kernels receive the parameters of :mod:`dfdl.ops.norm`'s rules (``axis`` non-negative,
``epsilon`` a float, ``stash`` a numpy dtype); their ``accepts`` rules leave other
dtypes and layouts to the numpy forwards.

Example:
    >>> x = np.array([[1.0, 3.0]])
    >>> layer_normalization(x, np.ones(2), axis=1, epsilon=0.0, stash=np.dtype("f8"))[0]
    array([[-1.,  1.]])
"""

from __future__ import annotations

import math

import numba
import numpy as np

from dfdl.ops.registry import kernel

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def flat_f64(p) -> np.ndarray:
    """``p`` as a contiguous flat float64 array (a per-channel parameter for numba).

    Example:
        >>> flat_f64(np.ones((2, 1), np.float32))
        array([1., 1.])
    """
    return np.ascontiguousarray(np.asarray(p, dtype=np.float64).reshape(-1))


def as_nc_s(x: np.ndarray) -> np.ndarray:
    """(N, C, D1, ...) as a contiguous (N, C, S) view.

    Example:
        >>> as_nc_s(np.ones((2, 3, 4, 5))).shape
        (2, 3, 20)
    """
    return np.ascontiguousarray(x).reshape(x.shape[0], x.shape[1], -1)


# ----------------------------------------------------------------- numba kernels


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _instance_norm(x, scale, bias, eps, y):
    """Normalizes each x[n, c, :] over its S elements, then scale/bias per channel."""
    N, C, S = x.shape
    for n in range(N):
        for c in range(C):
            s1 = 0.0
            for s in range(S):
                s1 += x[n, c, s]
            m = s1 / S
            s2 = 0.0
            for s in range(S):
                d = x[n, c, s] - m
                s2 += d * d
            a = scale[c] / math.sqrt(s2 / S + eps)
            for s in range(S):
                y[n, c, s] = (x[n, c, s] - m) * a + bias[c]


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _row_stats(row, eps):
    """(mean, 1/sqrt(var + eps)) of a 1-D row, two-pass (biased variance)."""
    K = row.shape[0]
    s1 = 0.0
    for k in range(K):
        s1 += row[k]
    m = s1 / K
    s2 = 0.0
    for k in range(K):
        d = row[k] - m
        s2 += d * d
    return m, 1.0 / math.sqrt(s2 / K + eps)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _layer_norm_rows(x, scale, bias, eps, y, mean, inv):
    """Row-wise layer norm of x (R, K): stats stored in mean/inv (their dtype = stash)."""
    R, K = x.shape
    for r in range(R):
        m, iv = _row_stats(x[r], eps)
        mean[r] = m
        inv[r] = iv
        for k in range(K):
            y[r, k] = (x[r, k] - m) * iv * scale[k] + bias[k]


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _instance_norm_grad(x, dy, scale, eps, dx, dscale, dbias):
    """Instance-norm backward on (N, C, S); dscale/dbias per (n, c)."""
    N, C, S = x.shape
    for n in range(N):
        for c in range(C):
            s1 = 0.0
            for s in range(S):
                s1 += x[n, c, s]
            m = s1 / S
            s2 = 0.0
            for s in range(S):
                d = x[n, c, s] - m
                s2 += d * d
            inv = 1.0 / math.sqrt(s2 / S + eps)
            sdy = 0.0
            sdyx = 0.0
            for s in range(S):
                g = dy[n, c, s]
                sdy += g
                sdyx += g * (x[n, c, s] - m) * inv
            dscale[n, c] = sdyx
            dbias[n, c] = sdy
            a = scale[c] * inv
            mb = sdy / S
            mx = sdyx / S
            for s in range(S):
                dx[n, c, s] = a * (dy[n, c, s] - mb - (x[n, c, s] - m) * inv * mx)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _layer_norm_grad_rows(x, dy, scale, dmean, dinv, eps, dx):
    """Row-wise layer-norm backward of x (R, K) with the Mean/InvStdDev gradients."""
    R, K = x.shape
    for r in range(R):
        m, inv = _row_stats(x[r], eps)
        sg = 0.0
        sgx = 0.0
        for k in range(K):
            g = dy[r, k] * scale[k]
            sg += g
            sgx += g * (x[r, k] - m) * inv
        mg = sg / K
        mgx = sgx / K
        cm = dmean[r] / K
        # d inv / dx_k = -inv^3 (x_k - mean) / K
        ci = -dinv[r] * inv * inv * inv / K
        for k in range(K):
            xc = x[r, k] - m
            dx[r, k] = inv * (dy[r, k] * scale[k] - mg - xc * inv * mgx) + cm + ci * xc


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _layer_norm_param_grad(x, dy, eps, out):
    """out[0, m, k] += sum_r dy * xhat, out[1, m, k] += sum_r dy over x (R, M, K) rows."""
    R, M, K = x.shape
    for r in range(R):
        for j in range(M):
            m, inv = _row_stats(x[r, j], eps)
            for k in range(K):
                g = dy[r, j, k]
                out[0, j, k] += g * (x[r, j, k] - m) * inv
                out[1, j, k] += g


# ----------------------------------------------------------------- registered kernels


def _instance_accepts(input, *inputs, **attrs) -> bool:
    return input.dtype in _FLOATS and input.ndim >= 3


@kernel("InstanceNormalization", accepts=_instance_accepts)
def instance_normalization(input, scale, B, *, epsilon: float):
    """InstanceNormalization of a float32/float64 (N, C, D1, ...) tile."""
    x = as_nc_s(input)
    y = np.empty_like(x)
    _instance_norm(x, flat_f64(scale), flat_f64(B), epsilon, y)
    return y.reshape(input.shape)


def _layer_accepts(X, Scale, B=None, *, axis=-1, **attrs) -> bool:
    # Scale and B must broadcast to the normalized shape X.shape[axis:] (the usual case)
    k = len(X.shape[axis + X.ndim if axis < 0 else axis :])
    return X.dtype in _FLOATS and all(p is None or p.ndim <= k for p in (Scale, B))


@kernel("LayerNormalization", accepts=_layer_accepts)
def layer_normalization(X, Scale, B=None, *, axis: int, epsilon: float, stash: np.dtype):
    """LayerNormalization over axes ``axis..`` of a float32/float64 tile, statistics in
    ``stash`` precision; returns ``(Y, Mean, InvStdDev)``."""
    norm_shape = X.shape[axis:]
    K = int(np.prod(norm_shape, dtype=np.int64))
    R = int(np.prod(X.shape[:axis], dtype=np.int64))
    x = np.ascontiguousarray(X).reshape(R, K)
    if stash == np.float32 and X.dtype == np.float64:
        # statistics in float32 precision, as the stash type asks
        x = x.astype(np.float32).astype(np.float64)
    s = flat_f64(np.broadcast_to(Scale, norm_shape))
    b = np.zeros(K) if B is None else flat_f64(np.broadcast_to(B, norm_shape))
    y = np.empty((R, K), dtype=X.dtype)
    mean, inv = np.empty(R, dtype=stash), np.empty(R, dtype=stash)
    _layer_norm_rows(x, s, b, epsilon, y, mean, inv)
    stat = X.shape[:axis] + (1,) * (X.ndim - axis)
    return y.reshape(X.shape), mean.reshape(stat), inv.reshape(stat)


def _instance_grad_accepts(dY, X, *inputs, **attrs) -> bool:
    return X.dtype in _FLOATS and dY is not None


@kernel("InstanceNormalizationGrad", domain="dfdl", accepts=_instance_grad_accepts)
def instance_normalization_grad(dY, X, scale, *, epsilon: float):
    """dfdl.InstanceNormalizationGrad of a float32/float64 tile: ``(dX, dscale, dB)``,
    the parameter gradients per (n, c)."""
    x = as_nc_s(X)
    N, C = x.shape[:2]
    dx = np.empty_like(x)
    ds, db = np.empty((N, C)), np.empty((N, C))
    _instance_norm_grad(x, as_nc_s(dY), flat_f64(scale), epsilon, dx, ds, db)
    return dx.reshape(X.shape), ds.astype(scale.dtype), db.astype(scale.dtype)


def _layer_grad_accepts(dY, X, Scale, *inputs, axis=-1, **attrs) -> bool:
    k = len(X.shape[axis + X.ndim if axis < 0 else axis :])
    return X.dtype in _FLOATS and dY is not None and Scale.ndim <= k


@kernel("LayerNormalizationGrad", domain="dfdl", accepts=_layer_grad_accepts)
def layer_normalization_grad(
    dY, X, Scale, dMean=None, dInvStdDev=None, *, axis: int, epsilon: float
):
    """dfdl.LayerNormalizationGrad of a float32/float64 tile (Scale within the
    normalized axes ``axis..``)."""
    norm_shape = X.shape[axis:]
    K = int(np.prod(norm_shape, dtype=np.int64))
    R = int(np.prod(X.shape[:axis], dtype=np.int64))
    x = np.ascontiguousarray(X).reshape(R, K)
    dy = np.ascontiguousarray(dY).reshape(R, K)
    s = flat_f64(np.broadcast_to(Scale, norm_shape))
    dm = np.zeros(R) if dMean is None else flat_f64(dMean)
    di = np.zeros(R) if dInvStdDev is None else flat_f64(dInvStdDev)
    dx = np.empty((R, K), dtype=X.dtype)
    _layer_norm_grad_rows(x, dy, s, dm, di, epsilon, dx)
    return dx.reshape(X.shape)


def _param_grad_accepts(dY, X, **attrs) -> bool:
    return X.dtype in _FLOATS


@kernel("LayerNormalizationParamGrad", domain="dfdl", accepts=_param_grad_accepts)
def layer_normalization_param_grad(dY, X, *, axis: int, param_axis: int, epsilon: float):
    """dfdl.LayerNormalizationParamGrad of a float32/float64 tile: the Scale and B
    gradients stacked, summed over the axes before ``param_axis``."""
    R = int(np.prod(X.shape[:param_axis], dtype=np.int64))
    M = int(np.prod(X.shape[param_axis:axis], dtype=np.int64))
    K = int(np.prod(X.shape[axis:], dtype=np.int64))
    out = np.zeros((2, M, K))
    x = np.ascontiguousarray(X).reshape(R, M, K)
    _layer_norm_param_grad(x, np.ascontiguousarray(dY).reshape(R, M, K), epsilon, out)
    return out.reshape((2, *X.shape[param_axis:])).astype(X.dtype)
