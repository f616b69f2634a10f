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

from dfdl.ops.gpu.device import cupy, scalar, to_device
from dfdl.ops.gpu.kernels import elementwise, floats
from dfdl.ops.registry import DFDL_DOMAIN, kernel


def _one_float(X, *rest, **attrs) -> bool:
    return floats(X)


def _pair(A, B, *rest, **attrs) -> bool:
    return floats(A, B) and A.shape == B.shape


def _last_axis(X, *rest, axis=-1) -> bool:
    """Softmax over the tile's last axis (the one its kernels compute over)."""
    return floats(X, *rest) and axis in (-1, X.ndim - 1) and all(r.shape == X.shape for r in rest)


# -------------------------------------------------------------------------- softmax


@kernel("Softmax", "gpu", accepts=_last_axis)
def softmax(input):
    """exp(x - max) / sum along the last axis."""
    x = to_device(input)
    if x.size == 0:
        return x.copy()
    e = cupy().exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@kernel("SoftmaxGrad", "gpu", accepts=_last_axis, domain=DFDL_DOMAIN)
def softmax_grad(dY, Y):
    """``Y * (dY - sum(dY * Y))`` along the last axis in float64, from the output."""
    y, dy = to_device(Y).astype(np.float64), to_device(dY).astype(np.float64)
    return (y * (dy - (dy * y).sum(axis=-1, keepdims=True))).astype(Y.dtype)


# ------------------------------------------------------------------------ LayerNorm


def _ln_accepts(X, Scale, B=None, **attrs) -> bool:
    return floats(X, Scale, B)


@kernel("LayerNormalization", "gpu", accepts=_ln_accepts)
def layer_norm(X, Scale, B=None, *, axis, epsilon, stash):
    """(Y, Mean, InvStdDev) over axes ``axis..``, statistics in the ``stash`` dtype."""
    cp = cupy()
    x = to_device(X)
    axes = tuple(range(axis, x.ndim))
    xs = x.astype(stash, copy=False)
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
def layer_norm_grad(dY, X, Scale, dMean=None, dInvStdDev=None, *, axis, epsilon):
    """dX of LayerNormalization, statistics recomputed in float64."""
    f64 = np.float64
    x = to_device(X).astype(f64)
    axes = tuple(range(axis, x.ndim))
    k = math.prod(x.shape[axis:])
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
def layer_norm_param_grad(dY, X, *, axis, param_axis, epsilon):
    """``[sum(dY * xhat), sum(dY)]`` over the axes before ``param_axis``, in float64."""
    cp = cupy()
    x = to_device(X).astype(np.float64)
    xc, inv = _centered(x, tuple(range(axis, x.ndim)), epsilon)
    dy = to_device(dY).astype(np.float64)
    lead = tuple(range(param_axis))
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
def gelu(X, *, tanh):
    """x * Phi(x) via erfc, or with the tanh approximation (as a sigmoid)."""
    k = elementwise(f"gelu_{tanh}", "T x", "T y", _GELU[tanh], preamble=_GELU_CONSTANTS)
    return k(to_device(X))


@kernel("GeluGrad", "gpu", accepts=_pair, domain=DFDL_DOMAIN)
def gelu_grad(dY, X, *, tanh):
    """dY * d Gelu / dX, from the Gelu's input."""
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


def _training(training_mode) -> bool:
    return training_mode is not None and scalar(training_mode) != 0


def _dropout_accepts(data, ratio=None, training_mode=None, **attrs) -> bool:
    """Any float tile but training mode with ratio 1 (all zeros: the forward's)."""
    rate = 0.5 if ratio is None else scalar(ratio)
    return floats(data) and data.ndim >= 1 and (not _training(training_mode) or rate < 1)


@kernel("Dropout", "gpu", accepts=_dropout_accepts)
def dropout(data, ratio=None, training_mode=None, *, rate, key, row_base):
    """(output, mask), the mask the CPU's bit for bit (same hash of the same indices);
    outside training, or at ratio 0, the input itself and a mask of ones (the forward's)."""
    cp = cupy()
    x = to_device(data)
    if not _training(training_mode) or rate == 0:
        return x, cp.ones(x.shape, dtype=np.bool_)
    base = cp.asarray(row_base).reshape(*x.shape[:-1], 1)
    k = elementwise(
        "dropout",
        "T x, uint64 base, uint64 key, float64 rate, T scale, int64 ncol",
        "T y, bool m",
        _DROPOUT,
    )
    scale = x.dtype.type(1.0 / (1.0 - rate))
    return k(x, base, np.uint64(key), float(rate), scale, x.shape[-1])


def _dropout_grad_accepts(dY, mask, *rest, **attrs) -> bool:
    return floats(dY) and mask.dtype == np.bool_ and mask.shape == dY.shape


@kernel("DropoutGrad", "gpu", accepts=_dropout_grad_accepts, domain=DFDL_DOMAIN)
def dropout_grad(dY, mask, ratio=None, training_mode=None, *, rate, training):
    """dY * mask / (1 - rate) in training; dY as it is otherwise."""
    cp = cupy()
    dy = to_device(dY)
    if not training or rate == 0:
        return dy
    if rate == 1:
        return cp.zeros_like(dy)
    scale = dy.dtype.type(1.0 / (1.0 - rate))
    return cp.where(to_device(mask), dy * scale, dy.dtype.type(0))


# --------------------------------------------------------------------------- losses


def _sce_accepts(scores, labels, weights=None, **attrs) -> bool:
    return floats(scores, weights) and scores.ndim >= 2 and labels.dtype.kind in "iu"


@kernel("SoftmaxCrossEntropyLoss", "gpu", accepts=_sce_accepts)
def sce_loss(scores, labels, weights=None, *, ignore_index, reduction):
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
def sce_loss_grad(dloss, scores, labels, weights=None, *, coef, safe_labels):
    """``coef * (softmax(scores) - onehot(safe_labels))`` in float64, as the CPU's
    (``coef``: each label's gradient factor, from the host)."""
    cp = cupy()
    c = to_device(coef)
    safe = to_device(safe_labels)
    x = to_device(scores).astype(np.float64)
    e = cp.exp(x - x.max(axis=1, keepdims=True))
    dx = e / e.sum(axis=1, keepdims=True) * c[:, None]
    classes = cp.arange(x.shape[1]).reshape(1, -1, *([1] * (x.ndim - 2)))
    dx = dx - (classes == safe[:, None]) * c[:, None]
    return dx.astype(scores.dtype)
