"""Numba kernels of BatchNormalization, whole and split (float32/float64 tiles).

The whole op's kernels (BatchNormalization, dfdl.BatchNormalizationGrad and the fused
Relu pair) hold channels of every sample; the split ops' kernels (dfdl.BatchNormMoments,
BatchNormApply, BatchNormGradSums, BatchNormGradApply) run on any (N, C, ...) tile.
Inputs are (N, C, S) views; statistics and sums accumulate in float64, per-value math
runs in X's dtype with per-channel coefficients (PyTorch's CPU scheme). The kernels
receive the parameters of :mod:`dfdl.ops.batch_norm`'s rules; their ``accepts`` rules
leave other dtypes to the numpy forwards.

Example:
    >>> x = np.array([[1.0], [3.0]])
    >>> batch_norm_moments(x)
    array([[2., 2., 2.]])
"""

from __future__ import annotations

import math

import numba
import numpy as np

from dfdl.ops.cpu.norm import as_nc_s, flat_f64
from dfdl.ops.registry import kernel

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


# ----------------------------------------------------------------- numba kernels


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _affine_nc(x, mean, var, scale, bias, eps, y, relu):
    """y[n, c, :] = scale[c] * (x[n, c, :] - mean[c]) / sqrt(var[c] + eps) + bias[c],
    then (``relu``) 0 where that rounded value is negative, as the Relu kernel does.

    Computed as ``x * a + b`` in x's dtype with ``a`` and ``b`` per channel, as
    PyTorch's CPU kernel does: one multiply-add per value instead of float64 math (the
    pass is bound by memory, and float64 halves its vectors)."""
    N, C, S = x.shape
    ab = np.empty(2, y.dtype)  # the coefficients in y's dtype
    for c in range(C):
        a = scale[c] / math.sqrt(var[c] + eps)
        ab[0] = a
        ab[1] = bias[c] - mean[c] * a
        a_, b_ = ab[0], ab[1]
        for n in range(N):
            for s in range(S):
                v = x[n, c, s] * a_ + b_
                y[n, c, s] = 0 if relu and v < 0 else v


@numba.njit(inline="always")
def _shifted_sums(x, c):
    """``(k, sum(x - k), sum((x - k)**2))`` over channel ``c`` of (N, C, S) ``x``, in
    float64, shifted by its first value ``k`` (no cancellation for large means)."""
    N, _, S = x.shape
    k = np.float64(x[0, c, 0])
    s1 = 0.0
    s2 = 0.0
    for n in range(N):
        for s in range(S):
            d = x[n, c, s] - k
            s1 += d
            s2 += d * d
    return k, s1, s2


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _channel_stats(x, mean, var):
    """Per-channel mean and biased variance of x (N, C, S), one pass in float64 over the
    values shifted by the channel's first value."""
    N, C, S = x.shape
    cnt = N * S
    for c in range(C):
        k, s1, s2 = _shifted_sums(x, c)
        d = s1 / cnt
        mean[c] = k + d
        var[c] = max(s2 / cnt - d * d, 0.0)


@numba.njit(inline="always")
def _relu_masked(g, z, masked):
    """``g``, or (``masked`` and the Relu output ``z`` not positive) ``g * 0``: the
    ReluGrad kernel's arithmetic."""
    return g * 0 if masked and not z > 0 else g


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _bn_grad_nc(x, dy, z, masked, scale, dmean, dvar, eps, dx, dscale, dbias):
    """Training-mode batch-norm backward on (N, C, S); per-channel sums into dscale/dbias.
    With ``masked``, dY is first zeroed where the Relu output ``z`` is not positive (as
    ``dY * 0``, the ReluGrad kernel's arithmetic).

    Two passes per channel: the sums of x, x**2, dY and dY*x (float64, shifted by the
    channel's first value), then ``dx = a*dY + b*(x - mean) + e`` in x's dtype with
    per-channel coefficients (PyTorch's CPU scheme, faster than float64 math per value:
    ``docs/design/split-norm-grad-dtype.md``)."""
    N, C, S = x.shape
    cnt = N * S
    coef = np.empty(4, dx.dtype)  # the coefficients in dx's dtype
    for c in range(C):
        k = np.float64(x[0, c, 0])
        s1 = 0.0
        s2 = 0.0
        sg = 0.0
        sgx = 0.0
        for n in range(N):
            for s in range(S):
                d = x[n, c, s] - k
                g = _relu_masked(dy[n, c, s], z[n, c, s], masked)
                s1 += d
                s2 += d * d
                sg += g
                sgx += g * d
        d = s1 / cnt
        m = k + d
        inv = 1.0 / math.sqrt(max(s2 / cnt - d * d, 0.0) + eps)
        sdyx = (sgx - d * sg) * inv
        dscale[c] = sdyx
        dbias[c] = sg
        a = scale[c] * inv
        # a*(g - sg/cnt - xc*inv*sdyx/cnt) + dmean/cnt + 2*dvar/cnt*xc, xc = x - m
        coef[0] = a
        coef[1] = 2.0 * dvar[c] / cnt - a * inv * sdyx / cnt
        coef[2] = dmean[c] / cnt - a * sg / cnt
        coef[3] = m
        ca, cb, ce, cm = coef[0], coef[1], coef[2], coef[3]
        for n in range(N):
            for s in range(S):
                g = _relu_masked(dy[n, c, s], z[n, c, s], masked)
                dx[n, c, s] = ca * g + cb * (x[n, c, s] - cm) + ce


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _grad_sums(x, dy, z, mean, inv, out):
    """out[c] = (sum dy * xhat, sum dy) over x[:, c, :]; with a Relu output ``z`` (not
    None), dy is first zeroed where ``z`` is not positive (the ReluGrad kernel's
    arithmetic). numba compiles the ``z is None`` case without the test, to the
    unmasked kernel's exact code."""
    N, C, S = x.shape
    for c in range(C):
        sdyx = 0.0
        sdy = 0.0
        for n in range(N):
            for s in range(S):
                g = dy[n, c, s]
                if z is not None:
                    g = g if z[n, c, s] > 0 else g * np.float32(0)  # in dy's dtype
                sdy += g
                sdyx += g * (x[n, c, s] - mean[c]) * inv[c]
        out[c, 0] = sdyx
        out[c, 1] = sdy


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _grad_apply(x, dy, z, mean, inv, scale, sums, cnt, dmean, dvar, dx):
    """dX of training-mode batch norm from the batch's per-channel sums:
    ``a * (dy - mb - xc * inv * mx) + cm + cv * xc`` with ``xc = x - mean`` (``dy``
    masked by a Relu output ``z`` as in :func:`_grad_sums`), computed
    as ``p * dy + q * xc + r`` in x's dtype with ``p, q, r`` per channel (float64 math
    per value made the pass compute-bound: ``docs/design/split-norm-grad-dtype.md``)."""
    N, C, S = x.shape
    k = np.empty(4, dx.dtype)  # the coefficients in dx's dtype
    for c in range(C):
        a = scale[c] * inv[c]
        mb = sums[c, 1] / cnt
        mx = sums[c, 0] / cnt
        cm = dmean[c] / cnt
        cv = dvar[c] * 2.0 / cnt
        k[0] = a
        k[1] = cv - a * inv[c] * mx
        k[2] = cm - a * mb
        k[3] = mean[c]
        p, q, r, m = k[0], k[1], k[2], k[3]
        for n in range(N):
            for s in range(S):
                g = dy[n, c, s]
                if z is not None:
                    g = g if z[n, c, s] > 0 else g * np.float32(0)  # in dy's dtype
                dx[n, c, s] = p * g + q * (x[n, c, s] - m) + r


# ----------------------------------------------------------------- shared bodies


def _affine(X, scale, B, mean, var, epsilon: float, relu: bool) -> np.ndarray:
    """``scale * (X - mean) / sqrt(var + epsilon) + B`` per channel (``relu``: then
    Relu), from given statistics."""
    x = as_nc_s(X)
    y = np.empty_like(x)
    _affine_nc(x, flat_f64(mean), flat_f64(var), flat_f64(scale), flat_f64(B), epsilon, y, relu)
    return y.reshape(X.shape)


def _batch_norm(X, scale, B, input_mean, input_var, epsilon, momentum, training_mode, relu):
    """The BatchNormalization kernels' shared body (Relu on the output with ``relu``)."""
    if not training_mode:
        return _affine(X, scale, B, input_mean, input_var, epsilon, relu)
    x = as_nc_s(X)
    C = x.shape[1]
    y = np.empty_like(x)
    mean, var = np.empty(C), np.empty(C)
    _channel_stats(x, mean, var)
    # the forward's batch statistics have X's dtype; round alike
    mean, var = mean.astype(X.dtype), var.astype(X.dtype)
    _affine_nc(x, flat_f64(mean), flat_f64(var), flat_f64(scale), flat_f64(B), epsilon, y, relu)
    running_mean = input_mean * momentum + mean * (1 - momentum)
    running_var = input_var * momentum + var * (1 - momentum)
    return (
        y.reshape(X.shape),
        running_mean.astype(input_mean.dtype, copy=False),
        running_var.astype(input_var.dtype, copy=False),
    )


def _batch_norm_grad(dY, Z, X, scale, dMean, dVar, epsilon):
    x = as_nc_s(X)
    C = x.shape[1]
    dx = np.empty_like(x)
    ds, db = np.empty(C), np.empty(C)
    dm = np.zeros(C) if dMean is None else flat_f64(dMean)
    dv = np.zeros(C) if dVar is None else flat_f64(dVar)
    dy = as_nc_s(dY)
    z = dy if Z is None else as_nc_s(Z)  # unread without the mask
    _bn_grad_nc(x, dy, z, Z is not None, flat_f64(scale), dm, dv, epsilon, dx, ds, db)
    return dx.reshape(X.shape), ds.astype(scale.dtype), db.astype(scale.dtype)


def _inv(M: np.ndarray, epsilon: float) -> np.ndarray:
    """Per-channel ``1 / sqrt(var + epsilon)`` from the (C, 3) moments."""
    return 1.0 / np.sqrt(M[:, 2] / M[:, 0] + epsilon)


def _channel_or_zeros(p, c: int) -> np.ndarray:
    return np.zeros(c) if p is None else flat_f64(p)


# ------------------------------------------------------------- whole-op kernels


def _float_nc(X, *inputs, **attrs) -> bool:
    return X.dtype in _FLOATS and X.ndim >= 2


@kernel("BatchNormalization", accepts=_float_nc)
def batch_normalization(
    X, scale, B, input_mean, input_var, *, epsilon: float, momentum: float, training_mode: bool
):
    """BatchNormalization of a float32/float64 (N, C, ...) tile: Y, and in training
    mode the running statistics too."""
    return _batch_norm(X, scale, B, input_mean, input_var, epsilon, momentum, training_mode, False)


@kernel("BatchNormalizationRelu", domain="dfdl", accepts=_float_nc)
def batch_normalization_relu(
    X, scale, B, input_mean, input_var, *, epsilon: float, momentum: float
):
    """dfdl.BatchNormalizationRelu: the training-mode BatchNormalization kernel with the
    Relu applied as each value is written (one pass instead of two)."""
    return _batch_norm(X, scale, B, input_mean, input_var, epsilon, momentum, True, True)


def _grad_accepts(dY, X, *inputs, **attrs) -> bool:
    return X.dtype in _FLOATS and dY is not None


@kernel("BatchNormalizationGrad", domain="dfdl", accepts=_grad_accepts)
def batch_normalization_grad(dY, X, scale, dMean=None, dVar=None, *, epsilon: float):
    """dfdl.BatchNormalizationGrad of a float32/float64 tile: ``(dX, dscale, dB)``."""
    return _batch_norm_grad(dY, None, X, scale, dMean, dVar, epsilon)


def _relu_grad_accepts(dZ, Z, X, *inputs, **attrs) -> bool:
    return X.dtype in _FLOATS and dZ is not None and Z.dtype == dZ.dtype


@kernel("BatchNormalizationReluGrad", domain="dfdl", accepts=_relu_grad_accepts)
def batch_normalization_relu_grad(dZ, Z, X, scale, dMean=None, dVar=None, *, epsilon: float):
    """dfdl.BatchNormalizationReluGrad: the BatchNormalizationGrad kernel reading the
    Relu's gradient mask from its output ``Z`` as it goes (no ReluGrad pass)."""
    return _batch_norm_grad(dZ, Z, X, scale, dMean, dVar, epsilon)


# ------------------------------------------------------------- split-op kernels


def _float_x(X, *inputs, **attrs) -> bool:
    return X.dtype in _FLOATS


@kernel("BatchNormMoments", domain="dfdl", accepts=_float_x)
def batch_norm_moments(X):
    """(C, 3) float64 moments (count, mean, sum of squared deviations) of an (N, C, ...)
    tile, from the whole op's statistics kernel."""
    x = as_nc_s(X)
    mean, var = np.empty(x.shape[1]), np.empty(x.shape[1])
    _channel_stats(x, mean, var)
    cnt = x.shape[0] * x.shape[2]
    return np.stack([np.full_like(mean, cnt), mean, var * cnt], axis=1)


@kernel("BatchNormApply", domain="dfdl", accepts=_float_nc)
def batch_norm_apply(X, scale, B, M, *, epsilon: float, relu: bool):
    """Y (``relu``: Relu(Y)) of one (N, C, ...) tile from the batch's moments ``M``,
    with the whole op's affine kernel; the statistics are rounded to X's dtype first,
    as the whole op's forward rounds them."""
    mean, var = M[:, 1].astype(X.dtype), (M[:, 2] / M[:, 0]).astype(X.dtype)
    return _affine(X, scale, B, mean, var, epsilon, relu)


def _grad_sums_accepts(dY, X, M, Z=None, **attrs) -> bool:
    return X.dtype in _FLOATS and (Z is None or Z.dtype == dY.dtype)


@kernel("BatchNormGradSums", domain="dfdl", accepts=_grad_sums_accepts)
def batch_norm_grad_sums(dY, X, M, Z=None, *, epsilon: float):
    """(C, 2) float64 sums (dY * xhat, dY) of an (N, C, ...) tile; with the Relu output
    ``Z``, of ``ReluGrad(dY, Z)`` instead of dY."""
    x = as_nc_s(X)
    out = np.empty((x.shape[1], 2))
    z = None if Z is None else as_nc_s(Z)
    _grad_sums(x, as_nc_s(dY), z, np.ascontiguousarray(M[:, 1]), _inv(M, epsilon), out)
    return out


def _grad_apply_accepts(dY, X, scale, M, G, dMean=None, dVar=None, Z=None, **attrs) -> bool:
    return X.dtype in _FLOATS and (Z is None or Z.dtype == dY.dtype)


@kernel("BatchNormGradApply", domain="dfdl", accepts=_grad_apply_accepts)
def batch_norm_grad_apply(dY, X, scale, M, G, dMean=None, dVar=None, Z=None, *, epsilon: float):
    """dX of one (N, C, ...) tile from the moments ``M`` and the gradient sums ``G`` (of
    ``ReluGrad(dY, Z)`` with the Relu output ``Z``)."""
    c = X.shape[1]
    x = as_nc_s(X)
    z = None if Z is None else as_nc_s(Z)
    dx = np.empty_like(x)
    _grad_apply(
        x,
        as_nc_s(dY),
        z,
        np.ascontiguousarray(M[:, 1]),
        _inv(M, epsilon),
        _channel_or_zeros(scale, c),
        np.ascontiguousarray(G),
        float(M[0, 0]),
        _channel_or_zeros(dMean, c),
        _channel_or_zeros(dVar, c),
        dx,
    )
    return dx.reshape(X.shape)
