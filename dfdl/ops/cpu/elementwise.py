"""numba kernels for elementwise ops on float32/float64 tiles.

Each kernel registers itself for its op (:func:`dfdl.ops.registry.kernel`) and runs one
flat loop over float32/float64 tiles. Its ``accepts`` predicate leaves every other tile
(integer dtypes, float16, operands of a binary op that broadcast or differ in dtype) to
the op's numpy forward. Ops with attributes hand their kernels resolved parameters
through their ``params`` rules in :mod:`dfdl.ops.elementwise`: ``alpha`` (and
HardSigmoid's ``beta``) as floats, ``tanh`` for Gelu's approximation, ClipGrad's bounds
``lo`` and ``hi``. The fused activation gradients (``dfdl.ReluGrad``, ``SigmoidGrad``,
``TanhGrad``, ``GeluGrad``, ``HardSigmoidGrad``, ``HardSwishGrad``, ``ClipGrad``) run
one loop over ``dY`` and the saved tensor. HardSwish and HardSigmoid (every MobileNetV3
block) compute in the tile's dtype with the constants rounded to it, as their numpy
forwards do, so the two agree bit for bit.

Guarantees: every value depends on its own inputs only, so results do not depend on
the tiling. float32 GELU (forward and gradient, ``approximate="none"``) runs on the
vectorizable ``exp``/``erfc`` of :mod:`dfdl.ops.cpu.gelu_f32`, within 2e-6 relative or
1e-6 absolute of float64 libm; float64 keeps libm's ``erfc``. Exp, Log and Tanh have
no kernel on purpose: numpy's SIMD ufuncs are faster, so their numpy forward is the
CPU kernel.

Example:
    >>> relu(np.array([-1.0, 2.0], np.float32))
    array([0., 2.], dtype=float32)

Measurements: ``docs/design/gelu-f32.md``.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from dfdl.ops.cpu import gelu_f32
from dfdl.ops.registry import kernel

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_APPROXIMATIONS = ("none", "tanh")

# error_model="numpy": x / 0 gives inf/nan like numpy instead of raising
_jit = numba.njit(cache=True, nogil=True, error_model="numpy")


# ------------------------------------------------------- what the kernels take, and how


def _is_float(*xs) -> bool:
    return all(isinstance(x, np.ndarray) and x.dtype in _FLOATS for x in xs)


def floats(X, **attrs) -> bool:
    """Whether a one-input kernel takes ``X``: a float32 or float64 array.

    Example:
        >>> floats(np.ones(2, np.float32)), floats(np.ones(2, np.float16))
        (True, False)
    """
    return _is_float(X)


def same_floats(A, B, *bounds, **attrs) -> bool:
    """Whether a two-tensor kernel takes ``A`` and ``B``: float32 or float64 arrays of one
    shape and dtype (ClipGrad's scalar bounds are not looked at).

    Example:
        >>> a = np.ones((2, 3), np.float32)
        >>> same_floats(a, a), same_floats(a, a[:1])
        (True, False)
    """
    return _is_float(A, B) and A.shape == B.shape and A.dtype == B.dtype


def _gelu_accepts(X, *, approximate="none") -> bool:
    return _is_float(X) and approximate in _APPROXIMATIONS


def _gelu_grad_accepts(dY, X, *, approximate="none") -> bool:
    return approximate in _APPROXIMATIONS and same_floats(dY, X)


def _map(loop, X: np.ndarray, *args) -> np.ndarray:
    """Run the flat loop ``loop(x, out, *args)`` over X viewed as 1-D."""
    x = np.ascontiguousarray(X).reshape(-1)
    out = np.empty_like(x)
    loop(x, out, *args)
    return out.reshape(X.shape)


def _map2(loop, A: np.ndarray, B: np.ndarray, *args) -> np.ndarray:
    """Run the flat loop ``loop(a, b, out, *args)`` over same-shape A and B viewed as 1-D."""
    a = np.ascontiguousarray(A).reshape(-1)
    b = np.ascontiguousarray(B).reshape(-1)
    out = np.empty_like(a)
    loop(a, b, out, *args)
    return out.reshape(A.shape)


# ---------------------------------------------------------------------------- unary loops


@_jit
def _relu(x, out):
    for i in range(x.size):
        v = x[i]
        out[i] = 0.0 if v < 0 else v  # NaN passes through, like np.maximum


@_jit
def _leaky_relu(x, out, alpha):
    for i in range(x.size):
        v = x[i]
        out[i] = v * alpha if v < 0 else v


@_jit
def _sigmoid(x, out):
    for i in range(x.size):
        v = x[i]
        if v >= 0:
            out[i] = 1.0 / (1.0 + math.exp(-v))
        else:  # exp of a negative number cannot overflow
            e = math.exp(v)
            out[i] = e / (1.0 + e)


@_jit
def _gelu_erf(x, out):
    for i in range(x.size):
        v = x[i]
        out[i] = 0.5 * v * math.erfc(-v * _INV_SQRT2)  # erfc: no cancellation for v << 0


@_jit
def _gelu_tanh(x, out):
    for i in range(x.size):
        v = x[i]
        u = 2.0 * _SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)
        # 0.5 * (1 + tanh(u / 2)) == sigmoid(u), evaluated without overflow or cancellation
        if u >= 0:
            out[i] = v / (1.0 + math.exp(-u))
        else:
            e = math.exp(u)
            out[i] = v * e / (1.0 + e)


@_jit
def _erf(x, out):
    for i in range(x.size):
        out[i] = math.erf(x[i])


@_jit
def _sqrt(x, out):
    for i in range(x.size):
        out[i] = math.sqrt(x[i])  # NaN below 0, as in numpy


@_jit
def _hard_sigmoid(x, out, alpha, beta):
    for i in range(x.size):
        v = x[i] * alpha + beta
        out[i] = 0.0 if v < 0 else (1.0 if v > 1 else v)  # NaN passes through, like np.clip


@_jit
def _hard_swish(x, out, zero, three, six):
    # typed constants keep the arithmetic in x's dtype (a 0.0 literal would widen c)
    for i in range(x.size):
        v = x[i]
        c = v + three
        if c < zero:
            c = zero
        elif c > six:
            c = six
        out[i] = v * c / six


# --------------------------------------------------------------------------- binary loops


@_jit
def _add(a, b, out):
    for i in range(a.size):
        out[i] = a[i] + b[i]


@_jit
def _sub(a, b, out):
    for i in range(a.size):
        out[i] = a[i] - b[i]


@_jit
def _mul(a, b, out):
    for i in range(a.size):
        out[i] = a[i] * b[i]


@_jit
def _div(a, b, out):
    for i in range(a.size):
        out[i] = a[i] / b[i]


# ------------------------------------------------------------------------ forward kernels


@kernel("Add", accepts=same_floats)
def add(A, B):
    """A + B."""
    return _map2(_add, A, B)


@kernel("Sub", accepts=same_floats)
def sub(A, B):
    """A - B."""
    return _map2(_sub, A, B)


@kernel("Mul", accepts=same_floats)
def mul(A, B):
    """A * B."""
    return _map2(_mul, A, B)


@kernel("Div", accepts=same_floats)
def div(A, B):
    """A / B (float operands only: integer division is the forward's)."""
    return _map2(_div, A, B)


@kernel("Relu", accepts=floats)
def relu(X):
    """max(X, 0)."""
    return _map(_relu, X)


@kernel("LeakyRelu", accepts=floats)
def leaky_relu(X, *, alpha: float):
    """X, or alpha * X below 0; alpha is rounded to X's dtype, as in the numpy forward."""
    return _map(_leaky_relu, X, X.dtype.type(alpha))


@kernel("Sigmoid", accepts=floats)
def sigmoid(X):
    """1 / (1 + exp(-X))."""
    return _map(_sigmoid, X)


@kernel("Gelu", accepts=_gelu_accepts)
def gelu(X, *, tanh: bool):
    """x * Phi(x), with the tanh approximation when ``tanh``."""
    if tanh:
        return _map(_gelu_tanh, X)
    return _map(gelu_f32.gelu if X.dtype == np.float32 else _gelu_erf, X)


@kernel("HardSigmoid", accepts=floats)
def hard_sigmoid(X, *, alpha: float, beta: float):
    """max(0, min(1, alpha * X + beta)), alpha and beta rounded to X's dtype (as the numpy
    forward does)."""
    t = X.dtype.type
    return _map(_hard_sigmoid, X, t(alpha), t(beta))


@kernel("HardSwish", accepts=floats)
def hard_swish(X):
    """X * clamp(X + 3, 0, 6) / 6 in X's dtype (torch's formula, as the numpy forward)."""
    t = X.dtype.type
    return _map(_hard_swish, X, t(0), t(3), t(6))


@kernel("Erf", accepts=floats)
def erf(input):
    """The Gauss error function."""
    return _map(_erf, input)


@kernel("Sqrt", accepts=floats)
def sqrt(X):
    """Square root."""
    return _map(_sqrt, X)


# ------------------------------------------------------------- backward (dfdl.*Grad) loops


@_jit
def _relu_grad(dy, x, out, alpha):
    for i in range(dy.size):
        out[i] = dy[i] if x[i] > 0 else dy[i] * alpha


@_jit
def _sigmoid_grad(dy, y, out):
    for i in range(dy.size):
        v = y[i]
        out[i] = dy[i] * v * (1.0 - v)


@_jit
def _tanh_grad(dy, y, out):
    for i in range(dy.size):
        v = y[i]
        out[i] = dy[i] * (1.0 - v * v)


@_jit
def _gelu_grad_erf(dy, x, out):
    for i in range(dy.size):
        v = x[i]
        # Phi(v) + v * phi(v)
        cdf = 0.5 * math.erfc(-v * _INV_SQRT2)
        pdf = _INV_SQRT_2PI * math.exp(-0.5 * v * v)
        out[i] = dy[i] * (cdf + v * pdf)


@_jit
def _gelu_grad_tanh(dy, x, out):
    for i in range(dy.size):
        v = x[i]
        u = 2.0 * _SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)
        # s = sigmoid(u) = 0.5 * (1 + tanh(u / 2)); d tanh = 1 - tanh^2 = 4 s (1 - s)
        if u >= 0:
            s = 1.0 / (1.0 + math.exp(-u))
        else:
            e = math.exp(u)
            s = e / (1.0 + e)
        du = 2.0 * _SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * v * v)
        out[i] = dy[i] * (s + v * s * (1.0 - s) * du)


@_jit
def _clip_grad(dy, x, out, lo, hi):
    for i in range(dy.size):
        v = x[i]
        out[i] = dy[i] if (v >= lo and v <= hi) else 0.0


@_jit
def _hard_sigmoid_grad(dy, x, out, alpha, beta):
    for i in range(dy.size):
        v = x[i] * alpha + beta
        out[i] = dy[i] * alpha if (v > 0 and v < 1) else 0.0


@_jit
def _hard_swish_grad(dy, x, out, three, half):
    for i in range(dy.size):
        v = x[i]
        if v <= -three:
            out[i] = 0.0
        elif v < three:
            out[i] = dy[i] * (v / three + half)
        else:
            out[i] = dy[i]


# ----------------------------------------------------------------------- backward kernels


@kernel("ReluGrad", accepts=same_floats, domain="dfdl")
def relu_grad(dY, X, *, alpha: float):
    """dY where X > 0, else alpha * dY (alpha rounded to X's dtype)."""
    return _map2(_relu_grad, dY, X, X.dtype.type(alpha))


@kernel("SigmoidGrad", accepts=same_floats, domain="dfdl")
def sigmoid_grad(dY, Y):
    """dY * Y * (1 - Y)."""
    return _map2(_sigmoid_grad, dY, Y)


@kernel("TanhGrad", accepts=same_floats, domain="dfdl")
def tanh_grad(dY, Y):
    """dY * (1 - Y**2)."""
    return _map2(_tanh_grad, dY, Y)


@kernel("HardSigmoidGrad", accepts=same_floats, domain="dfdl")
def hard_sigmoid_grad(dY, X, *, alpha: float, beta: float):
    """dY * alpha where 0 < alpha * X + beta < 1, else 0 (alpha and beta rounded to X's
    dtype)."""
    t = X.dtype.type
    return _map2(_hard_sigmoid_grad, dY, X, t(alpha), t(beta))


@kernel("HardSwishGrad", accepts=same_floats, domain="dfdl")
def hard_swish_grad(dY, X):
    """0 at and below X = -3, dY at and above 3, dY * (X / 3 + 1/2) between."""
    t = X.dtype.type
    return _map2(_hard_swish_grad, dY, X, t(3), t(0.5))


@kernel("GeluGrad", accepts=_gelu_grad_accepts, domain="dfdl")
def gelu_grad(dY, X, *, tanh: bool):
    """dY * d Gelu(X) / dX, with the tanh approximation when ``tanh``."""
    if tanh:
        loop = _gelu_grad_tanh
    elif X.dtype == np.float32:
        loop = gelu_f32.gelu_grad
    else:
        loop = _gelu_grad_erf
    return _map2(loop, dY, X)


@kernel("ClipGrad", accepts=same_floats, domain="dfdl")
def clip_grad(dY, X, min=None, max=None, *, lo: float, hi: float):
    """dY where lo <= X <= hi, else 0 (the bounds rounded to X's dtype; ``min`` and
    ``max``, the op's inputs, are already resolved into them)."""
    return _map2(_clip_grad, dY, X, X.dtype.type(lo), X.dtype.type(hi))
