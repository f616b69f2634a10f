"""Numba kernels of the split training-mode BatchNormalization (dfdl/ops/batch_norm_split.py).

Inputs are (N, C, S) views; statistics and sums accumulate in float64.
"""

from __future__ import annotations

import numba
import numpy as np

from dfdl.ops.cpu.norm import _as_nc_s, _batch_norm, _channel_stats


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
    as ``p * dy + q * xc + r`` in x's dtype with ``p, q, r`` per channel (float64
    math per value took 2.4x as long on a ResNet stage-1 tile, 1.07 against 0.44 ms
    from cache; the results differ by about an ulp)."""
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


def cpu_moments(X: np.ndarray) -> np.ndarray:
    """(C, 3) float64 moments (count, mean, sum of squared deviations) of an (N, C, ...)
    tile, from the fused BatchNorm's two-pass statistics kernel."""
    x = _as_nc_s(X)
    mean, var = np.empty(x.shape[1]), np.empty(x.shape[1])
    _channel_stats(x, mean, var)
    cnt = x.shape[0] * x.shape[2]
    return np.stack([np.full_like(mean, cnt), mean, var * cnt], axis=1)


def cpu_apply(X: np.ndarray, scale, B, mean, var, epsilon: float, relu: bool) -> np.ndarray:
    """Y (``relu``: Relu(Y)) of one (N, C, ...) tile from the batch statistics, with the
    whole BatchNormalization's affine kernel."""
    return _batch_norm(X, scale, B, mean, var, epsilon, 0.9, 0, relu=relu)


def cpu_grad_sums(dY: np.ndarray, X: np.ndarray, mean, inv, Z=None) -> np.ndarray:
    """(C, 2) float64 sums (dY * xhat, dY) of an (N, C, ...) tile; with the Relu output
    ``Z``, of ``ReluGrad(dY, Z)`` instead of dY."""
    x = _as_nc_s(X)
    dy = _as_nc_s(dY)
    out = np.empty((x.shape[1], 2))
    _grad_sums(x, dy, None if Z is None else _as_nc_s(Z), mean, inv, out)
    return out


def cpu_grad_apply(dY, X, mean, inv, scale, sums, cnt, dmean, dvar, Z=None) -> np.ndarray:
    """dX of one (N, C, ...) tile (of ``ReluGrad(dY, Z)`` with the Relu output ``Z``)."""
    x = _as_nc_s(X)
    dy = _as_nc_s(dY)
    z = None if Z is None else _as_nc_s(Z)
    dx = np.empty_like(x)
    _grad_apply(x, dy, z, mean, inv, scale, sums, float(cnt), dmean, dvar, dx)
    return dx.reshape(X.shape)
