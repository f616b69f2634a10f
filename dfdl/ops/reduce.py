"""Reductions: ReduceMean, ReduceSum, ReduceMax (axes as input 1) and ArgMax.

Tiling: kept axes are tiled alike in input and output. A reduced axis is tiled as a
contracted letter where partial results combine exactly (sum for ReduceSum, max for
ReduceMax) and is never split (".") otherwise (ReduceMean, ArgMax).

VJPs are built from registry ops (Reshape, Expand, Mul, Equal, Cast, Div), so the backward
pass tiles like any other graph: the gradient is ``dY`` broadcast back over the reduced
axes (scaled by ``1/n`` for the mean, routed to the maxima for the max).

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["ReduceSum"].forward(np.ones((2, 3), np.float32), np.array([1])).ravel()
    array([3., 3.], dtype=float32)
"""

from __future__ import annotations

import math

import numpy as np
from onnx import helper

from dfdl.errors import ModelError
from dfdl.ops.common import letters, normalize_axis
from dfdl.ops.registry import TensorType, TileContext, TileSpec, defvjp, register


def reduce_axes(rank: int, axes, noop_with_empty_axes: int = 0) -> tuple[int, ...] | None:
    """Normalized, sorted reduced axes; ``None`` when the op is the identity.

    Args:
        rank: rank of the data.
        axes: the axes input (array, list or None).
        noop_with_empty_axes: ONNX attribute; with empty axes, 1 means identity and
            0 means "reduce every axis".
    """
    flat = [] if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
    if not flat:
        return None if noop_with_empty_axes else tuple(range(rank))
    out = set()
    for a in flat:
        if not -rank <= a < rank:
            raise ModelError(f"reduction axis {a} is out of range for rank {rank}")
        out.add(normalize_axis(a, rank))
    return tuple(sorted(out))


def _reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: int):
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _reduce_shape(inputs, consts, *, keepdims=1, noop_with_empty_axes=0, **attrs):
    data = inputs[0]
    axes = consts[1] if len(consts) > 1 else None
    red = reduce_axes(data.rank, axes, noop_with_empty_axes)
    if red is None:
        return [data]
    return [TensorType(_reduced_shape(data.shape, red, keepdims), data.dtype)]


def _reduce_tile(combine: str | None):
    """Tile rule for a reduction; ``combine`` is the exact partial combiner or None."""

    def rule(ctx: TileContext) -> TileSpec:
        data = ctx.inputs[0]
        axes = ctx.consts[1] if len(ctx.consts) > 1 else None
        red = reduce_axes(data.rank, axes, ctx.attrs.get("noop_with_empty_axes", 0))
        extra = (None,) * (len(ctx.inputs) - 1)
        names = letters(data.rank)
        if red is None:
            return TileSpec(inputs=(names, *extra), outputs=(names,))
        keep = ctx.attrs.get("keepdims", 1)
        spec_in, spec_out, reduce = [], [], {}
        for i, ch in enumerate(names):
            if i not in red:
                spec_in.append(ch)
                spec_out.append(ch)
                continue
            # partials over chunks of a reduced axis combine exactly only for sum and max
            spec_in.append(ch if combine else ".")
            if combine:
                reduce[ch] = combine
            if keep:
                spec_out.append(".")
        return TileSpec(
            inputs=("".join(spec_in), *extra), outputs=("".join(spec_out),), reduce=reduce
        )

    return rule


def _prepare(data, axes, keepdims, noop_with_empty_axes):
    data = np.asarray(data)
    return data, reduce_axes(data.ndim, axes, noop_with_empty_axes), bool(keepdims)


@register("ReduceMean", shape=_reduce_shape, tile=_reduce_tile(None), const_inputs=(1,))
def ReduceMean(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    """Mean over ``axes`` (all axes when empty, identity with noop_with_empty_axes)."""
    data, red, keep = _prepare(data, axes, keepdims, noop_with_empty_axes)
    if red is None:
        return data.copy()
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.mean(data, axis=red, keepdims=keep, dtype=data.dtype))


@register("ReduceSum", shape=_reduce_shape, tile=_reduce_tile("sum"), const_inputs=(1,))
def ReduceSum(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    """Sum over ``axes`` (all axes when empty, identity with noop_with_empty_axes)."""
    data, red, keep = _prepare(data, axes, keepdims, noop_with_empty_axes)
    if red is None:
        return data.copy()
    return np.asarray(np.sum(data, axis=red, keepdims=keep, dtype=data.dtype))


def _lowest(dtype: np.dtype):
    """The identity of max: -inf, the smallest integer, or False."""
    if dtype == np.bool_:
        return False
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).min
    return -np.inf


@register("ReduceMax", shape=_reduce_shape, tile=_reduce_tile("max"), const_inputs=(1,))
def ReduceMax(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    """Max over ``axes``; an empty reduction gives the dtype's lowest value."""
    data, red, keep = _prepare(data, axes, keepdims, noop_with_empty_axes)
    if red is None:
        return data.copy()
    if any(data.shape[a] == 0 for a in red):
        shape = _reduced_shape(data.shape, red, keep)
        return np.full(shape, _lowest(data.dtype), dtype=data.dtype)
    return np.asarray(np.max(data, axis=red, keepdims=keep))


# ---------------------------------------------------------------- VJP rules


def _vjp_axes(b, node) -> tuple:
    """(data type, reduced axes or None for the identity) of a reduction node."""
    x = b.type(node.inputs[0])
    name = node.inputs[1] if len(node.inputs) > 1 else ""
    axes = b.graph.initializers.get(name) if name else None
    return x, reduce_axes(x.rank, axes, node.attrs.get("noop_with_empty_axes", 0))


def _keepdims_grad(b, node, dy: str, x: TensorType, red: tuple[int, ...]) -> str:
    """``dy`` in the keepdims shape (size 1 on every reduced axis)."""
    if node.attrs.get("keepdims", 1):
        return dy
    shape = b.const(_reduced_shape(x.shape, red, 1), np.int64, "shape")
    return b.op("Reshape", [dy, shape], {"allowzero": 1})


def _expand_to(b, g: str, x: TensorType) -> str:
    return b.op("Expand", [g, b.const(x.shape, np.int64, "shape")])


@defvjp("ReduceSum")
def _reduce_sum_vjp(b, node, dys):
    x, red = _vjp_axes(b, node)
    if red is None:
        return [dys[0], None]
    return [_expand_to(b, _keepdims_grad(b, node, dys[0], x, red), x), None]


@defvjp("ReduceMean")
def _reduce_mean_vjp(b, node, dys):
    x, red = _vjp_axes(b, node)
    if red is None:
        return [dys[0], None]
    n = max(1, math.prod(x.shape[a] for a in red))
    # scale the small reduced gradient before broadcasting it
    g = b.op("Mul", [_keepdims_grad(b, node, dys[0], x, red), b.const(1.0 / n, x.dtype, "inv_n")])
    return [_expand_to(b, g, x), None]


@defvjp("ReduceMax")
def _reduce_max_vjp(b, node, dys):
    """dY goes to the maxima, shared evenly among ties (torch's amax convention)."""
    x, red = _vjp_axes(b, node)
    if red is None:
        return [dys[0], None]
    y = _keepdims_grad(b, node, node.outputs[0], x, red)
    hit = b.op("Equal", [node.inputs[0], y])
    mask = b.op("Cast", [hit], {"to": int(helper.np_dtype_to_tensor_dtype(x.dtype))})
    count = b.op("ReduceSum", [mask, b.const(list(red), np.int64, "axes")], {"keepdims": 1})
    share = b.op("Div", [_keepdims_grad(b, node, dys[0], x, red), count])
    return [b.op("Mul", [mask, share]), None]


def _argmax_axis(rank: int, axis: int) -> int:
    if not -rank <= axis < rank:
        raise ModelError(f"ArgMax axis {axis} is out of range for rank {rank}")
    return normalize_axis(axis, rank)


def _argmax_shape(inputs, consts, *, axis=0, keepdims=1, select_last_index=0, **attrs):
    data = inputs[0]
    ax = _argmax_axis(data.rank, axis)
    return [TensorType(_reduced_shape(data.shape, (ax,), keepdims), np.int64)]


def _argmax_tile(ctx: TileContext) -> TileSpec:
    data = ctx.inputs[0]
    ax = _argmax_axis(data.rank, ctx.attrs.get("axis", 0))
    names = letters(data.rank)
    spec_in = names[:ax] + "." + names[ax + 1 :]
    mid = "." if ctx.attrs.get("keepdims", 1) else ""
    return TileSpec(inputs=(spec_in,), outputs=(names[:ax] + mid + names[ax + 1 :],))


@register("ArgMax", shape=_argmax_shape, tile=_argmax_tile, differentiable=False)
def ArgMax(data, *, axis=0, keepdims=1, select_last_index=0):
    """Index of the maximum along ``axis`` (first one, or last with select_last_index)."""
    data = np.asarray(data)
    ax = _argmax_axis(data.ndim, axis)
    if select_last_index:
        # argmax of the reversed axis finds the last maximum; map it back
        n = data.shape[ax]
        idx = n - 1 - np.argmax(np.flip(data, axis=ax), axis=ax, keepdims=bool(keepdims))
    else:
        idx = np.argmax(data, axis=ax, keepdims=bool(keepdims))
    return np.asarray(idx, dtype=np.int64)
