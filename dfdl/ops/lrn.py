"""LRN (local response normalization across channels, opset 13) and its backward op.

For ``X`` of shape ``(N, C, D1, ...)``, ``size`` channels around each channel ``c``
(``floor((size - 1) / 2)`` before it, ``ceil((size - 1) / 2)`` after it, clipped to
``[0, C)``) give ``S[c] = bias + alpha / size * sum(X[i] ** 2)`` and
``Y = X * S ** -beta``. Window sums and powers run in float64 and are rounded once to
X's dtype.

Tiling: the batch and spatial axes are tiled; channels are never split, so every tile
sees each channel's whole window. The VJP is ``dfdl.LRNGrad(dY, X)``:
``dX[i] = dY[i] * S[i] ** -beta - 2 alpha beta / size * X[i] * sum_c dY[c] X[c]
S[c] ** (-beta - 1)`` over the channels ``c`` whose window holds ``i``.

The CPU kernels are in :mod:`dfdl.ops.cpu.lrn` (AlexNet, ZFNet and GoogLeNet put LRN
after their first convolutions); they receive :func:`lrn_params`.

Example:
    >>> from dfdl.ops import REGISTRY
    >>> x = np.ones((1, 3, 1, 1))
    >>> REGISTRY["LRN"].forward(x, size=3, alpha=3.0, beta=1.0).ravel()
    array([0.33333333, 0.25      , 0.33333333])
"""

from __future__ import annotations

import math

import numpy as np

from dfdl.errors import ShapeError, UnsupportedOpError
from dfdl.ops.common import letters
from dfdl.ops.norm_common import as_f64, check_like
from dfdl.ops.registry import DFDL_DOMAIN, Cost, TileContext, TileSpec, defvjp, register


def lrn_params(X, *, alpha=1e-4, beta=0.75, bias=1.0, size=None) -> dict:
    """The LRN kernels' parameters: the attributes as Python floats and ``size`` as an int.

    Example:
        >>> lrn_params(np.ones((1, 2, 1, 1)), size=3)
        {'alpha': 0.0001, 'beta': 0.75, 'bias': 1.0, 'size': 3}
    """
    return {"alpha": float(alpha), "beta": float(beta), "bias": float(bias), "size": int(size)}


def _window(size: int) -> tuple[int, int]:
    """Channels before and after ``c`` in its window."""
    return (size - 1) // 2, math.ceil((size - 1) / 2)


def _check(op: str, X, size) -> None:
    if size is None:
        raise ShapeError(f"{op}: attribute size is required", name="size")
    if int(size) < 1:
        raise ShapeError(f"{op}: size must be positive, got {size}", name="size")
    if X.rank < 2:
        raise ShapeError(f"{op}: input must have rank >= 2 (N x C x ...), got {X.shape}")
    if X.dtype.kind != "f":
        raise UnsupportedOpError(f"{op}: dtype {X.dtype} is not supported", op_type=op)


def _lrn_shape(inputs, consts, *, alpha=1e-4, beta=0.75, bias=1.0, size=None):
    _check("LRN", inputs[0], size)
    return [inputs[0]]


def _lrn_tile(ctx: TileContext) -> TileSpec:
    # the channel axis stays whole: each tile holds every channel's window
    x = "n." + letters(ctx.inputs[0].rank - 2, 2)
    return TileSpec(inputs=(x,) * len(ctx.inputs), outputs=(x,))


def _lrn_cost(inputs, outputs, *, size=None, **attrs) -> Cost:
    x = inputs[0]
    # a window sum per element, then a power (counted as 10 operations)
    return Cost(x.size * (2 * int(size or 1) + 12), 2 * x.nbytes)


def square_sums(x: np.ndarray, size: int) -> np.ndarray:
    """Per element, the sum of squares over its channel window (float64, axis 1).

    Example:
        >>> square_sums(np.ones((1, 4)), 3)
        array([[2., 3., 3., 2.]])
    """
    sq = np.square(as_f64(x))
    out = np.zeros_like(sq)
    before, after = _window(size)
    c = x.shape[1]
    for k in range(-before, after + 1):
        lo, hi = max(0, -k), min(c, c - k)
        if lo < hi:
            out[:, lo:hi] += sq[:, lo + k : hi + k]
    return out


@register("LRN", shape=_lrn_shape, tile=_lrn_tile, params=lrn_params, cost=_lrn_cost)
def LRN(X, *, alpha=1e-4, beta=0.75, bias=1.0, size=None):
    """``X / (bias + alpha / size * window sum of X^2) ** beta`` across channels."""
    p = lrn_params(X, alpha=alpha, beta=beta, bias=bias, size=size)
    s = p["bias"] + p["alpha"] / p["size"] * square_sums(X, p["size"])
    return (as_f64(X) * s ** -p["beta"]).astype(X.dtype)


# ------------------------------------------------------------------------ dfdl.LRNGrad


def _lrn_grad_shape(inputs, consts, *, alpha=1e-4, beta=0.75, bias=1.0, size=None):
    dY, X = inputs
    _check("dfdl.LRNGrad", X, size)
    check_like("dfdl.LRNGrad", "dY", dY, X.shape)
    return [X]


def lrn_grad_params(dY, X, *, alpha=1e-4, beta=0.75, bias=1.0, size=None) -> dict:
    """The LRNGrad kernels' parameters (those of :func:`lrn_params`).

    Example:
        >>> lrn_grad_params(None, np.ones((1, 2, 1, 1)), size=5)["size"]
        5
    """
    return lrn_params(X, alpha=alpha, beta=beta, bias=bias, size=size)


@register(
    "LRNGrad",
    domain=DFDL_DOMAIN,
    shape=_lrn_grad_shape,
    tile=_lrn_tile,
    params=lrn_grad_params,
    cost=_lrn_cost,
    differentiable=False,
)
def LRNGrad(dY, X, *, alpha=1e-4, beta=0.75, bias=1.0, size=None):
    """dX of ``LRN(X)`` given dY, in float64 (see the module docstring)."""
    p = lrn_params(X, alpha=alpha, beta=beta, bias=bias, size=size)
    n = p["size"]
    x, dy = as_f64(X), as_f64(dY)
    s = p["bias"] + p["alpha"] / n * square_sums(X, n)
    t = dy * x * s ** (-p["beta"] - 1)
    # the transpose of the window: channel i collects t from the channels whose window
    # holds it, i - after <= c <= i + before
    before, after = _window(n)
    c = x.shape[1]
    back = np.zeros_like(t)
    for k in range(-after, before + 1):
        lo, hi = max(0, -k), min(c, c - k)
        if lo < hi:
            back[:, lo:hi] += t[:, lo + k : hi + k]
    dx = dy * s ** -p["beta"] - (2.0 * p["alpha"] * p["beta"] / n) * x * back
    return dx.astype(X.dtype)


@defvjp("LRN")
def _lrn_vjp(b, node, dys):
    return [b.op("LRNGrad", [dys[0], node.inputs[0]], dict(node.attrs), domain=DFDL_DOMAIN)]
