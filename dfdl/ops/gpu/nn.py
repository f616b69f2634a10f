"""cupy kernels of the layers around the GEMMs: softmax, layer normalization, Gelu,
Dropout and the softmax cross-entropy loss, with their gradients.

Each follows its numpy forward's formula and precision (statistics and gradients of the
normalizations and softmax in float64, as on the CPU); Dropout's mask is the CPU's bit
for bit (the same counter-based hash of each element's global index).

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["Softmax"].kernel("gpu").kernel.__name__
    'softmax'
"""

from __future__ import annotations

import math

import numpy as np

from dfdl.ops.gpu.device import cupy, to_device
from dfdl.ops.gpu.kernels import elementwise, floats
from dfdl.ops.registry import DFDL_DOMAIN, kernel


def _one_float(X, *rest, **attrs) -> bool:
    return floats(X)


def _pair(A, B, *rest, **attrs) -> bool:
    return floats(A, B) and A.shape == B.shape


# -------------------------------------------------------------------------- softmax


@kernel("Softmax", "gpu", accepts=_one_float)
def softmax(input, *, axis=-1):
    """exp(x - max) / sum, along ``axis``."""
    x = to_device(input)
    if x.size == 0:
        return x.copy()
    e = cupy().exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@kernel("SoftmaxGrad", "gpu", accepts=_pair, domain=DFDL_DOMAIN)
def softmax_grad(dY, Y, *, axis=-1):
    """``Y * (dY - sum(dY * Y))`` in float64, from the softmax's output."""
    y, dy = to_device(Y).astype(np.float64), to_device(dY).astype(np.float64)
    return (y * (dy - (dy * y).sum(axis=axis, keepdims=True))).astype(Y.dtype)


# ------------------------------------------------------------------------ LayerNorm


def _ln_accepts(X, Scale, B=None, **attrs) -> bool:
    return floats(X, Scale, B)


@kernel("LayerNormalization", "gpu", accepts=_ln_accepts)
def layer_norm(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    """(Y, Mean, InvStdDev), statistics in the ``stash_type`` precision."""
    from dfdl.ops.common import normalize_axis
    from dfdl.ops.norm import stash_dtype

    cp = cupy()
    x = to_device(X)
    axes = tuple(range(normalize_axis(axis, x.ndim), x.ndim))
    xs = x.astype(stash_dtype(stash_type), copy=False)
    mean = xs.mean(axis=axes, keepdims=True)
    d = xs - mean
    var = (d * d).mean(axis=axes, keepdims=True)
    inv = cp.reciprocal(cp.sqrt(var + epsilon))
    y = (d * inv).astype(x.dtype, copy=False) * to_device(Scale)
    if B is not None:
        y = y + to_device(B)
    return y.astype(x.dtype, copy=False), mean, inv


def _centered(x, axes, epsilon):
    """x - mean and 1 / std over ``axes``, in float64."""
    xc = x - x.mean(axis=axes, keepdims=True)
    return xc, 1.0 / cupy().sqrt((xc * xc).mean(axis=axes, keepdims=True) + epsilon)


def _ln_grad_accepts(dY, X, Scale, *rest, **attrs) -> bool:
    return floats(X, Scale) and (dY is None or floats(dY, X))


@kernel("LayerNormalizationGrad", "gpu", accepts=_ln_grad_accepts, domain=DFDL_DOMAIN)
def layer_norm_grad(dY, X, Scale, dMean=None, dInvStdDev=None, *, axis=-1, epsilon=1e-5,
                    stash_type=1):  # fmt: skip
    """dX of LayerNormalization, statistics recomputed in float64."""
    from dfdl.ops.common import normalize_axis

    f64 = np.float64
    x = to_device(X).astype(f64)
    ax = normalize_axis(axis, x.ndim)
    axes = tuple(range(ax, x.ndim))
    k = math.prod(x.shape[ax:])
    xc, inv = _centered(x, axes, epsilon)
    dx = cupy().zeros_like(x)
    if dY is not None:
        g = to_device(dY).astype(f64) * to_device(Scale).astype(f64)
        xhat = xc * inv
        mg = g.mean(axis=axes, keepdims=True)
        mgx = (g * xhat).mean(axis=axes, keepdims=True)
        dx = inv * (g - mg - xhat * mgx)
    if dMean is not None:
        dx = dx + to_device(dMean).astype(f64) / k
    if dInvStdDev is not None:
        dx = dx - to_device(dInvStdDev).astype(f64) * inv**3 * xc / k
    return dx.astype(X.dtype)


@kernel("LayerNormalizationParamGrad", "gpu", accepts=_pair, domain=DFDL_DOMAIN)
def layer_norm_param_grad(dY, X, *, axis=-1, epsilon=1e-5, stash_type=1, param_axis=None):
    """``[sum(dY * xhat), sum(dY)]`` over the axes before ``param_axis``, in float64."""
    from dfdl.ops.common import normalize_axis

    cp = cupy()
    x = to_device(X).astype(np.float64)
    ax = normalize_axis(axis, x.ndim)
    pa = ax if param_axis is None else normalize_axis(param_axis, x.ndim)
    xc, inv = _centered(x, tuple(range(ax, x.ndim)), epsilon)
    dy = to_device(dY).astype(np.float64)
    lead = tuple(range(pa))
    return cp.stack([(dy * (xc * inv)).sum(axis=lead), dy.sum(axis=lead)]).astype(X.dtype)


# ----------------------------------------------------------------------------- Gelu

_GELU = {
    False: "y = (T)0.5 * x * erfc(-x * (T)INV_SQRT2)",
    True: "T u = (T)TWO_C * (x + (T)0.044715 * x * x * x); "
    "T e = exp(-fabs(u)); T s = u >= (T)0 ? (T)1 / ((T)1 + e) : e / ((T)1 + e); y = x * s",
}
_GELU_GRAD = {
    False: "T d = (T)0.5 * erfc(-x * (T)INV_SQRT2) + x * (exp((T)-0.5 * x * x) / (T)SQRT_2PI); "
    "out = dy * d",
    True: "T u = (T)TWO_C * (x + (T)0.044715 * x * x * x); "
    "T e = exp(-fabs(u)); T s = u >= (T)0 ? (T)1 / ((T)1 + e) : e / ((T)1 + e); "
    "T du = (T)TWO_C * ((T)1 + (T)(3 * 0.044715) * x * x); "
    "out = dy * (s + x * s * ((T)1 - s) * du)",
}
_GELU_CONSTANTS = (
    f"#define INV_SQRT2 {1.0 / math.sqrt(2.0)!r}\n"
    f"#define TWO_C {2.0 * math.sqrt(2.0 / math.pi)!r}\n"
    f"#define SQRT_2PI {math.sqrt(2.0 * math.pi)!r}\n"
)


@kernel("Gelu", "gpu", accepts=_one_float)
def gelu(X, *, approximate="none"):
    """x * Phi(x) via erfc, or with the tanh approximation (as a sigmoid)."""
    tanh = approximate == "tanh"
    k = elementwise(f"gelu_{tanh}", "T x", "T y", _GELU[tanh], preamble=_GELU_CONSTANTS)
    return k(to_device(X))


@kernel("GeluGrad", "gpu", accepts=_pair, domain=DFDL_DOMAIN)
def gelu_grad(dY, X, *, approximate="none"):
    """dY * d Gelu / dX, from the Gelu's input."""
    tanh = approximate == "tanh"
    k = elementwise(
        f"gelu_grad_{tanh}", "T dy, T x", "T out", _GELU_GRAD[tanh], preamble=_GELU_CONSTANTS
    )
    return k(to_device(dY), to_device(X))


# -------------------------------------------------------------------------- Dropout

_DROPOUT = """
unsigned long long idx = base + (unsigned long long)(i % ncol);
unsigned long long z = key + (idx + 1ull) * 0x9E3779B97F4A7C15ull;
z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
z = z ^ (z >> 31);
double u = (double)(z >> 11) * (1.0 / 9007199254740992.0);
m = u >= rate;
y = m ? x * scale : (T)0;
"""


def _dropout_accepts(data, *rest, **attrs) -> bool:
    return floats(data) and data.ndim >= 1


@kernel("Dropout", "gpu", accepts=_dropout_accepts)
def dropout(data, ratio=None, training_mode=None, *, seed=None, _offset=None, _full_shape=None):
    """(output, mask), the mask the CPU's bit for bit (same hash of the same indices)."""
    from dfdl.ops.dropout import _ratio, _training, dropout_params

    cp = cupy()
    x = to_device(data)
    r = _ratio(ratio)
    if not _training(training_mode) or r == 0:
        return x, cp.ones(x.shape, dtype=np.bool_)
    if not 0 <= r <= 1:
        raise ValueError(f"Dropout: ratio must be in [0, 1], got {r}")
    p = dropout_params(x, ratio, training_mode, seed=seed, _offset=_offset, _full_shape=_full_shape)
    ncol = x.shape[-1]
    base = cp.asarray(p["row_base"]).reshape(*x.shape[:-1], 1)
    scale = x.dtype.type(1.0 / (1.0 - r)) if r < 1 else x.dtype.type(0)
    k = elementwise(
        "dropout",
        "T x, uint64 base, uint64 key, float64 rate, T scale, int64 ncol",
        "T y, bool m",
        _DROPOUT,
    )
    y, m = k(x, base, np.uint64(p["key"]), r, scale, ncol)
    return (cp.zeros_like(x) if r == 1 else y), m


def _dropout_grad_accepts(dY, mask, *rest, **attrs) -> bool:
    return floats(dY) and mask.dtype == np.bool_ and mask.shape == dY.shape


@kernel("DropoutGrad", "gpu", accepts=_dropout_grad_accepts, domain=DFDL_DOMAIN)
def dropout_grad(dY, mask, ratio=None, training_mode=None):
    """dY * mask / (1 - ratio) in training."""
    from dfdl.ops.dropout import _ratio, _training

    cp = cupy()
    dy = to_device(dY)
    r = _ratio(ratio)
    if not _training(training_mode) or r == 0:
        return dy
    if r == 1:
        return cp.zeros_like(dy)
    scale = dy.dtype.type(1.0 / (1.0 - r))
    return cp.where(to_device(mask), dy * scale, dy.dtype.type(0))


# --------------------------------------------------------------------------- losses


def _sce_accepts(scores, labels, weights=None, **attrs) -> bool:
    return floats(scores, weights) and scores.ndim >= 2 and labels.dtype.kind in "iu"


@kernel("SoftmaxCrossEntropyLoss", "gpu", accepts=_sce_accepts)
def sce_loss(scores, labels, weights=None, *, ignore_index=None, reduction="mean"):
    """(loss, log_prob): the NLL of ``labels`` under log-softmax over axis 1."""
    cp = cupy()
    x = to_device(scores)
    d = x - x.max(axis=1, keepdims=True)
    log_prob = d - cp.log(cp.exp(d).sum(axis=1, keepdims=True))
    t = to_device(labels)
    ignored = cp.zeros(t.shape, dtype=np.bool_) if ignore_index is None else t == ignore_index
    safe = cp.where(ignored, 0, t).astype(np.int64)
    picked = cp.take_along_axis(log_prob, safe[:, None], axis=1)[:, 0]
    if weights is None:
        w = (~ignored).astype(x.dtype)
    else:
        w = cp.where(ignored, 0, cp.take(to_device(weights), safe)).astype(x.dtype)
    loss = -picked * w
    if reduction == "none":
        return loss, log_prob
    total = loss.sum()
    if reduction == "sum":
        return total, log_prob
    return (total / w.sum()).astype(x.dtype), log_prob


def _sce_grad_accepts(dloss, scores, labels, weights=None, **attrs) -> bool:
    return floats(scores, weights) and scores.ndim >= 2 and labels.dtype.kind in "iu"


@kernel("SoftmaxCrossEntropyLossGrad", "gpu", accepts=_sce_grad_accepts, domain=DFDL_DOMAIN)
def sce_loss_grad(dloss, scores, labels, weights=None, *, ignore_index=None, reduction="mean"):
    """``coef * (softmax(scores) - onehot(labels))`` in float64, as the CPU's."""
    cp = cupy()
    f64 = np.float64
    t = to_device(labels)
    ignored = cp.zeros(t.shape, dtype=np.bool_) if ignore_index is None else t == ignore_index
    safe = cp.where(ignored, 0, t).astype(np.int64)
    w = cp.ones(t.shape, f64) if weights is None else cp.take(to_device(weights).astype(f64), safe)
    w = cp.where(ignored, 0.0, w)
    coef = to_device(dloss).astype(f64) * w
    if reduction == "mean":
        coef = coef / w.sum()
    coef = cp.broadcast_to(coef, t.shape)
    x = to_device(scores).astype(f64)
    e = cp.exp(x - x.max(axis=1, keepdims=True))
    dx = e / e.sum(axis=1, keepdims=True) * coef[:, None]
    classes = cp.arange(x.shape[1]).reshape(1, -1, *([1] * (x.ndim - 2)))
    dx = dx - (classes == safe[:, None]) * coef[:, None]
    return dx.astype(scores.dtype)
