"""cupy kernels of training-mode BatchNormalization (whole op, with the fused Relu pair)
and its gradients, following the CPU kernels' arithmetic: per-channel statistics and
sums in float64 (cupy's reductions, in a fixed order), then one pass per value in X's
dtype with per-channel coefficients (``x * a + b``; ``a * g + b * (x - mean) + e``).

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["BatchNormalization"].kernel("gpu").kernel.__name__
    'batch_normalization'
"""

from __future__ import annotations

import numpy as np

from dfdl.ops.gpu.device import cupy, to_device
from dfdl.ops.gpu.kernels import elementwise, floats
from dfdl.ops.registry import DFDL_DOMAIN, kernel

_F64 = np.float64


def _ncs(x):
    """``x`` as ``(N, C, S)`` (a view)."""
    return x.reshape(x.shape[0], x.shape[1], -1)


def _channel(v, dtype=_F64):
    """A per-channel vector on the device as ``(1, C, 1)`` of ``dtype``."""
    return to_device(v).astype(dtype).reshape(1, -1, 1)


def _moments(x3):
    """Per-channel mean and biased variance of ``(N, C, S)``, float64, two passes."""
    xs = x3.astype(_F64)
    mean = xs.mean(axis=(0, 2), keepdims=True)
    d = xs - mean
    return mean, (d * d).mean(axis=(0, 2), keepdims=True)


def _affine(x3, a, b, relu: bool):
    k = elementwise(
        "bn_affine",
        "T x, T a, T b, bool relu",
        "T y",
        "T v = x * a + b; y = relu && v < (T)0 ? (T)0 : v",
    )
    return k(x3, a, b, relu)


def _normalize(X, scale, B, input_mean, input_var, epsilon, momentum, training, relu):
    x = to_device(X)
    x3 = _ncs(x)
    if training:
        mean, var = _moments(x3)
        # the forward's batch statistics have X's dtype; the coefficients come from them
        mean, var = mean.astype(x.dtype), var.astype(x.dtype)
    else:
        mean, var = _channel(input_mean, x.dtype), _channel(input_var, x.dtype)
    a = _channel(scale) / cupy().sqrt(var.astype(_F64) + epsilon)
    b = _channel(B) - mean.astype(_F64) * a
    y = _affine(x3, a.astype(x.dtype), b.astype(x.dtype), relu).reshape(x.shape)
    if not training:
        return y
    mean, var = mean.reshape(-1), var.reshape(-1)
    rm, rv = to_device(input_mean), to_device(input_var)
    running_mean = rm * momentum + mean * (1 - momentum)
    running_var = rv * momentum + var * (1 - momentum)
    return y, running_mean.astype(rm.dtype, copy=False), running_var.astype(rv.dtype, copy=False)


def _float_nc(X, *inputs, **attrs) -> bool:
    return floats(X) and X.ndim >= 2


@kernel("BatchNormalization", "gpu", accepts=_float_nc)
def batch_normalization(X, scale, B, input_mean, input_var, *, epsilon, momentum, training_mode):
    """Y (and in training mode the running statistics) of an (N, C, ...) tile."""
    return _normalize(X, scale, B, input_mean, input_var, epsilon, momentum, training_mode, False)


@kernel("BatchNormalizationRelu", "gpu", accepts=_float_nc, domain=DFDL_DOMAIN)
def batch_normalization_relu(X, scale, B, input_mean, input_var, *, epsilon, momentum):
    """The training-mode BatchNormalization kernel with the Relu in its one pass."""
    return _normalize(X, scale, B, input_mean, input_var, epsilon, momentum, True, True)


def _masked(dy, z):
    """``dY``, or ``dY * 0`` where the Relu output ``z`` is not positive (ReluGrad's
    arithmetic)."""
    if z is None:
        return dy
    k = elementwise("bn_relu_mask", "T dy, T z", "T g", "g = z > (T)0 ? dy : dy * (T)0")
    return k(dy, z)


def _grad(dY, Z, X, scale, dMean, dVar, epsilon):
    cp = cupy()
    x = to_device(X)
    x3 = _ncs(x)
    g3 = _ncs(_masked(to_device(dY), None if Z is None else to_device(Z)))
    cnt = x3.shape[0] * x3.shape[2]
    mean, var = _moments(x3)
    inv = 1.0 / cp.sqrt(var + epsilon)
    gs = g3.astype(_F64)
    sg = gs.sum(axis=(0, 2), keepdims=True)
    sgx = (gs * (x3.astype(_F64) - mean)).sum(axis=(0, 2), keepdims=True) * inv
    a = _channel(scale) * inv
    dm = 0.0 if dMean is None else _channel(dMean)
    dv = 0.0 if dVar is None else _channel(dVar)
    # a * (g - sg/cnt - xc * inv * sgx/cnt) + dmean/cnt + 2 * dvar/cnt * xc, xc = x - mean
    ca = a
    cb = 2.0 * dv / cnt - a * inv * sgx / cnt
    ce = dm / cnt - a * sg / cnt
    k = elementwise(
        "bn_grad_apply",
        "T g, T x, T a, T b, T e, T m",
        "T dx",
        "dx = a * g + b * (x - m) + e",
    )
    t = x.dtype
    dx = k(g3, x3, ca.astype(t), cb.astype(t), ce.astype(t), mean.astype(t)).reshape(x.shape)
    st = np.dtype(scale.dtype)
    return dx, sgx.reshape(-1).astype(st), sg.reshape(-1).astype(st)


def _grad_accepts(dY, X, *inputs, **attrs) -> bool:
    return floats(dY, X)


@kernel("BatchNormalizationGrad", "gpu", accepts=_grad_accepts, domain=DFDL_DOMAIN)
def batch_normalization_grad(dY, X, scale, dMean=None, dVar=None, *, epsilon):
    """``(dX, dscale, dB)`` of a training-mode BatchNormalization tile."""
    return _grad(dY, None, X, scale, dMean, dVar, epsilon)


def _relu_grad_accepts(dZ, Z, X, *inputs, **attrs) -> bool:
    return floats(dZ, Z, X)


@kernel("BatchNormalizationReluGrad", "gpu", accepts=_relu_grad_accepts, domain=DFDL_DOMAIN)
def batch_normalization_relu_grad(dZ, Z, X, scale, dMean=None, dVar=None, *, epsilon):
    """BatchNormalizationGrad of ``ReluGrad(dZ, Z)``, the mask read from ``Z``."""
    return _grad(dZ, Z, X, scale, dMean, dVar, epsilon)
