"""Softmax and LogSoftmax (ONNX opset 13), their VJP rules and fused backward ops.

The softmax axis is never split: a tile holds whole rows along it. The backward ops
``dfdl.SoftmaxGrad`` and ``dfdl.LogSoftmaxGrad`` read the forward's output, compute in
float64 and round once to the output dtype; they are not differentiable themselves.

The CPU kernels (:mod:`dfdl.ops.cpu.softmax`) run on the last axis only and take no
parameters: :func:`softmax_params` resolves the axis to nothing.

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["Softmax"].forward(np.zeros((1, 2), np.float32))
    array([[0.5, 0.5]], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from dfdl.ops.common import letters, normalize_axis
from dfdl.ops.norm_common import as_f64, check_axis, check_like
from dfdl.ops.registry import DFDL_DOMAIN, TileContext, TileSpec, defvjp, register


def _softmax_shape(inputs, consts, *, axis=-1):
    check_axis(axis, inputs[0].rank, "Softmax")
    return [inputs[0]]


def _softmax_tile(ctx: TileContext) -> TileSpec:
    rank = ctx.inputs[0].rank
    ax = normalize_axis(ctx.attrs.get("axis", -1), rank)
    x = letters(rank)
    x = x[:ax] + "." + x[ax + 1 :]
    return TileSpec(inputs=(x,), outputs=(x,))


def softmax_params(*inputs, axis=-1) -> dict:
    """The softmax kernels' parameters: none. They run on the last axis, the only one
    their ``accepts`` rule takes, so ``axis`` tells them nothing.

    Example:
        >>> softmax_params(np.ones((2, 3)), axis=-1)
        {}
    """
    return {}


@register("Softmax", shape=_softmax_shape, tile=_softmax_tile, params=softmax_params)
def Softmax(input, *, axis=-1):
    """Softmax along one axis (opset 13)."""
    if input.size == 0:
        return input.copy()
    e = np.exp(input - input.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(input.dtype, copy=False)


@register("LogSoftmax", shape=_softmax_shape, tile=_softmax_tile, params=softmax_params)
def LogSoftmax(input, *, axis=-1):
    """Log of softmax along one axis (opset 13), computed as ``x - max - log(sum(exp))``."""
    if input.size == 0:
        return input.copy()
    d = input - input.max(axis=axis, keepdims=True)
    return (d - np.log(np.exp(d).sum(axis=axis, keepdims=True))).astype(input.dtype, copy=False)


# ------------------------------------------------ dfdl.SoftmaxGrad / LogSoftmaxGrad


def _softmax_grad_shape(inputs, consts, *, axis=-1):
    dY, Y = inputs
    check_axis(axis, Y.rank, "dfdl.SoftmaxGrad")
    check_like("dfdl.SoftmaxGrad", "dY", dY, Y.shape)
    return [Y]


def _softmax_grad_tile(ctx: TileContext) -> TileSpec:
    spec = _softmax_tile(TileContext(ctx.inputs[1:], ctx.outputs, ctx.consts[1:], ctx.attrs))
    return TileSpec(inputs=(spec.inputs[0], spec.inputs[0]), outputs=spec.outputs)


@register(
    "SoftmaxGrad",
    domain=DFDL_DOMAIN,
    shape=_softmax_grad_shape,
    tile=_softmax_grad_tile,
    differentiable=False,
    params=softmax_params,
)
def SoftmaxGrad(dY, Y, *, axis=-1):
    """Softmax backward from its output: ``dX = Y * (dY - sum(dY * Y, axis))``."""
    y, dy = as_f64(Y), as_f64(dY)
    return (y * (dy - (dy * y).sum(axis=axis, keepdims=True))).astype(Y.dtype)


@register(
    "LogSoftmaxGrad",
    domain=DFDL_DOMAIN,
    shape=_softmax_grad_shape,
    tile=_softmax_grad_tile,
    differentiable=False,
    params=softmax_params,
)
def LogSoftmaxGrad(dY, Y, *, axis=-1):
    """LogSoftmax backward from its output: ``dX = dY - exp(Y) * sum(dY, axis)``."""
    dy = as_f64(dY)
    return (dy - np.exp(as_f64(Y)) * dy.sum(axis=axis, keepdims=True)).astype(Y.dtype)


# ============================================================================ VJP rules


@defvjp("Softmax")
def _softmax_vjp(b, node, dys):
    axis = node.attrs.get("axis", -1)
    return [b.op("SoftmaxGrad", [dys[0], node.outputs[0]], {"axis": axis}, domain=DFDL_DOMAIN)]


@defvjp("LogSoftmax")
def _log_softmax_vjp(b, node, dys):
    axis = node.attrs.get("axis", -1)
    return [b.op("LogSoftmaxGrad", [dys[0], node.outputs[0]], {"axis": axis}, domain=DFDL_DOMAIN)]
