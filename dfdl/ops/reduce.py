"""Reductions (axes as input 1, opset 18+ form) and ArgMax.

ReduceMean, ReduceSum, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2,
ReduceSumSquare, ReduceLogSum and ReduceLogSumExp. With empty axes and
``noop_with_empty_axes=1`` the reduction is over no axis: the composite ones still apply
their elementwise steps (ReduceSumSquare squares, ReduceL1 takes the absolute value...),
as the spec says. Float16 data is accumulated in float32 by the norms and logs.

Tiling: kept axes are tiled alike in input and output. A reduced axis is tiled as a
contracted letter where a tile's partial result is the same reduction of its chunk and
partials combine exactly, in a fixed tree order (sum for ReduceSum, ReduceL1 and
ReduceSumSquare; max and min for ReduceMax and ReduceMin). It is never split (".")
otherwise: ReduceMean, ReduceProd, ReduceL2, ReduceLogSum and ReduceLogSumExp, whose
partials would need a combine other than sum, max or min, and ArgMax.

VJPs are built from registry ops (Reshape, Expand, Mul, Equal, Cast, Div, Sign, Exp...),
so the backward pass tiles like any other graph: the gradient is ``dY`` broadcast back
over the reduced axes (scaled by ``1/n`` for the mean, routed to the extrema for max and
min, times ``sign(x)``, ``2x``, ``x / y`` or ``exp(x - y)`` for the norms and
LogSumExp). ReduceProd's is ``dfdl.ReduceProdGrad``, which multiplies the other factors
without dividing by a zero.

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["ReduceSum"].forward(np.ones((2, 3), np.float32), np.array([1])).ravel()
    array([3., 3.], dtype=float32)
"""

from __future__ import annotations

import math

import numpy as np
from onnx import helper

from dfdl.errors import ModelError, ShapeError, UnsupportedOpError
from dfdl.ops.common import letters, normalize_axis
from dfdl.ops.registry import DFDL_DOMAIN, TensorType, TileContext, TileSpec, defvjp, register


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


def reduce_params(data, axes=None, *, keepdims=1, noop_with_empty_axes=0) -> dict:
    """The ReduceSum/ReduceMean kernels' parameters: ``red``, the reduced axes
    (:func:`reduce_axes`; None: the identity), and ``keepdims`` as a bool.

    Example:
        >>> reduce_params(np.ones((2, 3)), np.array([-1]))
        {'red': (1,), 'keepdims': True}
    """
    return {
        "red": reduce_axes(np.ndim(data), axes, noop_with_empty_axes),
        "keepdims": bool(keepdims),
    }


@register(
    "ReduceMean",
    shape=_reduce_shape,
    tile=_reduce_tile(None),
    const_inputs=(1,),
    params=reduce_params,
)
def ReduceMean(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    """Mean over ``axes`` (all axes when empty, identity with noop_with_empty_axes)."""
    data, red, keep = _prepare(data, axes, keepdims, noop_with_empty_axes)
    if red is None:
        return data.copy()
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.mean(data, axis=red, keepdims=keep, dtype=data.dtype))


@register(
    "ReduceSum",
    shape=_reduce_shape,
    tile=_reduce_tile("sum"),
    const_inputs=(1,),
    params=reduce_params,
)
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


def _highest(dtype: np.dtype):
    """The identity of min: +inf, the largest integer, or True."""
    if dtype == np.bool_:
        return True
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).max
    return np.inf


def _typed_shape(op: str, kinds: str):
    """The reduction shape rule, refusing dtypes whose kind is not in ``kinds``."""

    def rule(inputs, consts, **attrs):
        if inputs[0].dtype.kind not in kinds:
            raise UnsupportedOpError(f"{op}: dtype {inputs[0].dtype} is not supported", op_type=op)
        return _reduce_shape(inputs, consts, **attrs)

    return rule


def _over(data, axes, noop_with_empty_axes) -> tuple[np.ndarray, tuple[int, ...]]:
    """``data`` as an array and its reduced axes; ``()`` reduces over no axis (noop)."""
    data = np.asarray(data)
    red = reduce_axes(data.ndim, axes, noop_with_empty_axes)
    return data, (() if red is None else red)


def _acc(dtype: np.dtype) -> np.dtype:
    """The accumulation dtype: float32 for float16, the dtype itself otherwise."""
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def _empty(data: np.ndarray, red: tuple[int, ...]) -> bool:
    return any(data.shape[a] == 0 for a in red)


@register(
    "ReduceMin",
    shape=_typed_shape("ReduceMin", "biuf"),
    tile=_reduce_tile("min"),
    const_inputs=(1,),
)
def ReduceMin(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    """Min over ``axes``; an empty reduction gives +inf, the largest integer or True."""
    data, red, keep = _prepare(data, axes, keepdims, noop_with_empty_axes)
    if red is None:
        return data.copy()
    if _empty(data, red):
        shape = _reduced_shape(data.shape, red, keep)
        return np.full(shape, _highest(data.dtype), dtype=data.dtype)
    return np.asarray(np.min(data, axis=red, keepdims=keep))


@register(
    "ReduceProd",
    shape=_typed_shape("ReduceProd", "iuf"),
    tile=_reduce_tile(None),
    const_inputs=(1,),
)
def ReduceProd(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    """Product over ``axes`` (1 over an empty set), in the data's dtype."""
    data, red = _over(data, axes, noop_with_empty_axes)
    return np.asarray(np.prod(data, axis=red, keepdims=bool(keepdims), dtype=data.dtype))


@register(
    "ReduceL1",
    shape=_typed_shape("ReduceL1", "iuf"),
    tile=_reduce_tile("sum"),
    const_inputs=(1,),
)
def ReduceL1(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    """Sum of absolute values over ``axes`` (0 over an empty set)."""
    data, red = _over(data, axes, noop_with_empty_axes)
    acc = _acc(data.dtype)
    s = np.sum(np.abs(data), axis=red, keepdims=bool(keepdims), dtype=acc)
    return np.asarray(s).astype(data.dtype, copy=False)


@register(
    "ReduceSumSquare",
    shape=_typed_shape("ReduceSumSquare", "iuf"),
    tile=_reduce_tile("sum"),
    const_inputs=(1,),
)
def ReduceSumSquare(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    """Sum of squares over ``axes`` (0 over an empty set)."""
    data, red = _over(data, axes, noop_with_empty_axes)
    x = data.astype(_acc(data.dtype), copy=False)
    s = np.sum(x * x, axis=red, keepdims=bool(keepdims), dtype=x.dtype)
    return np.asarray(s).astype(data.dtype, copy=False)


@register(
    "ReduceL2",
    shape=_typed_shape("ReduceL2", "iuf"),
    tile=_reduce_tile(None),
    const_inputs=(1,),
)
def ReduceL2(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    """Square root of the sum of squares over ``axes``; integers are truncated back."""
    data, red = _over(data, axes, noop_with_empty_axes)
    keep = bool(keepdims)
    if data.dtype.kind in "iu":
        # as the reference: squares in the dtype, summed in numpy's default integer
        s = np.sqrt(np.sum(np.square(data), axis=red, keepdims=keep))
        return np.asarray(s).astype(data.dtype)
    x = data.astype(_acc(data.dtype), copy=False)
    s = np.sqrt(np.sum(x * x, axis=red, keepdims=keep, dtype=x.dtype))
    return np.asarray(s).astype(data.dtype, copy=False)


@register(
    "ReduceLogSum",
    shape=_typed_shape("ReduceLogSum", "f"),
    tile=_reduce_tile(None),
    const_inputs=(1,),
)
def ReduceLogSum(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    """Log of the sum over ``axes`` (-inf over an empty set)."""
    data, red = _over(data, axes, noop_with_empty_axes)
    s = np.sum(data, axis=red, keepdims=bool(keepdims), dtype=_acc(data.dtype))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.log(s)).astype(data.dtype, copy=False)


@register(
    "ReduceLogSumExp",
    shape=_typed_shape("ReduceLogSumExp", "f"),
    tile=_reduce_tile(None),
    const_inputs=(1,),
)
def ReduceLogSumExp(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    """``log(sum(exp(x)))`` over ``axes``, shifted by the maximum so no exp overflows;
    -inf over an empty set."""
    data, red = _over(data, axes, noop_with_empty_axes)
    keep = bool(keepdims)
    if _empty(data, red):
        return np.full(_reduced_shape(data.shape, red, keep), -np.inf, dtype=data.dtype)
    x = data.astype(_acc(data.dtype), copy=False)
    m = np.max(x, axis=red, keepdims=True)
    # rows of infinities (or NaN) shift by 0: exp(-inf) = 0, exp(inf) = inf
    m = np.where(np.isfinite(m), m, 0).astype(x.dtype, copy=False)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.log(np.sum(np.exp(x - m), axis=red, keepdims=True)) + m
    if not keep:
        y = np.squeeze(y, axis=red)
    return np.asarray(y).astype(data.dtype, copy=False)


# ------------------------------------------------------------ dfdl.ReduceProdGrad


def _prod_grad_axes(axes, rank: int) -> tuple[int, ...]:
    red = reduce_axes(rank, axes, 1)
    return () if red is None else red


def _prod_grad_shape(inputs, consts, *, axes=()):
    dY, X = inputs
    red = _prod_grad_axes(axes, X.rank)
    want = _reduced_shape(X.shape, red, 1)
    if dY.shape != want:
        raise ShapeError(
            f"dfdl.ReduceProdGrad: dY must have shape {want}, got {dY.shape}", name="dY"
        )
    return [X]


def _prod_grad_tile(ctx: TileContext) -> TileSpec:
    X = ctx.inputs[1]
    red = _prod_grad_axes(ctx.attrs.get("axes", ()), X.rank)
    x = "".join("." if i in red else ch for i, ch in enumerate(letters(X.rank)))
    return TileSpec(inputs=(x, x), outputs=(x,))


@register(
    "ReduceProdGrad",
    domain=DFDL_DOMAIN,
    shape=_prod_grad_shape,
    tile=_prod_grad_tile,
    differentiable=False,
)
def ReduceProdGrad(dY, X, *, axes=()):
    """dX of ``ReduceProd(X, axes, keepdims=1)`` given dY: dY times the product of the
    other factors of each element's group, in float64 (exact where a factor is 0)."""
    red = _prod_grad_axes(axes, X.ndim)
    x = np.asarray(X, dtype=np.float64)
    zero = x == 0
    nonzero = np.where(zero, 1.0, x)
    p = np.prod(nonzero, axis=red, keepdims=True)
    zeros = np.sum(zero, axis=red, keepdims=True)
    # no zero: p / x; one zero: the product of the rest at the zero, 0 elsewhere
    others = np.where(zeros == 0, p / nonzero, np.where(zero & (zeros == 1), p, 0.0))
    return (np.asarray(dY, dtype=np.float64) * others).astype(X.dtype)


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


@defvjp("ReduceMin")
@defvjp("ReduceMax")
def _extremum_vjp(b, node, dys):
    """dY goes to the maxima (minima), shared evenly among ties (torch's amax convention)."""
    x, red = _vjp_axes(b, node)
    if red is None:
        return [dys[0], None]
    y = _keepdims_grad(b, node, node.outputs[0], x, red)
    hit = b.op("Equal", [node.inputs[0], y])
    mask = b.op("Cast", [hit], {"to": int(helper.np_dtype_to_tensor_dtype(x.dtype))})
    count = b.op("ReduceSum", [mask, b.const(list(red), np.int64, "axes")], {"keepdims": 1})
    share = b.op("Div", [_keepdims_grad(b, node, dys[0], x, red), count])
    return [b.op("Mul", [mask, share]), None]


def _dy_keep(b, node, dys) -> tuple[str, str, TensorType, tuple[int, ...] | None]:
    """(dY in the keepdims shape, data name, data type, reduced axes or None for noop)."""
    x, red = _vjp_axes(b, node)
    dy = dys[0] if red is None else _keepdims_grad(b, node, dys[0], x, red)
    return dy, node.inputs[0], x, red


def _y_keep(b, node, x: TensorType, red) -> str:
    """The node's output in the keepdims shape."""
    return node.outputs[0] if red is None else _keepdims_grad(b, node, node.outputs[0], x, red)


@defvjp("ReduceL1")
def _reduce_l1_vjp(b, node, dys):
    dy, X, _, _ = _dy_keep(b, node, dys)
    return [b.op("Mul", [b.op("Sign", [X]), dy]), None]


@defvjp("ReduceSumSquare")
def _reduce_sum_square_vjp(b, node, dys):
    dy, X, x, _ = _dy_keep(b, node, dys)
    return [b.op("Mul", [X, b.op("Mul", [dy, b.const(2.0, x.dtype, "two")])]), None]


@defvjp("ReduceL2")
def _reduce_l2_vjp(b, node, dys):
    """dY * x / y; 0 where the norm is 0 (the subgradient torch picks)."""
    dy, X, x, red = _dy_keep(b, node, dys)
    y = _y_keep(b, node, x, red)
    zero = b.op("Equal", [y, b.const(0.0, x.dtype, "zero")])
    safe = b.op("Where", [zero, b.const(1.0, x.dtype, "one"), y])
    return [b.op("Mul", [X, b.op("Div", [dy, safe])]), None]


@defvjp("ReduceLogSumExp")
def _reduce_log_sum_exp_vjp(b, node, dys):
    """dY * softmax(x) over the reduced axes: exp(x - y)."""
    dy, X, x, red = _dy_keep(b, node, dys)
    y = _y_keep(b, node, x, red)
    return [b.op("Mul", [dy, b.op("Exp", [b.op("Sub", [X, y])])]), None]


@defvjp("ReduceLogSum")
def _reduce_log_sum_vjp(b, node, dys):
    """dY / sum(x), the sum recomputed exactly rather than as exp(y)."""
    dy, X, x, red = _dy_keep(b, node, dys)
    if red is None:
        return [b.op("Div", [dy, X]), None]
    axes = b.const(list(red), np.int64, "axes")
    g = b.op("Div", [dy, b.op("ReduceSum", [X, axes], {"keepdims": 1})])
    return [_expand_to(b, g, x), None]


@defvjp("ReduceProd")
def _reduce_prod_vjp(b, node, dys):
    dy, X, _, red = _dy_keep(b, node, dys)
    if red is None:
        return [dy, None]
    return [b.op("ReduceProdGrad", [dy, X], {"axes": list(red)}, domain=DFDL_DOMAIN), None]


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
