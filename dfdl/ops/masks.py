"""Ops of the mask, position and label code around models: Trilu (causal masks), CumSum
(position ids) and OneHot (labels).

Their parameters (Trilu's ``k``, CumSum's ``axis``, OneHot's ``depth`` and ``values``)
are plan-time constants. On constant inputs (a causal mask built from a static sequence
length, position ids of a fixed mask) they fold at plan time like any node whose inputs
are all known (:func:`dfdl.ir.bind.bind`); on runtime inputs they run as tiled tasks.

Tiling never changes the math: every batch axis is tiled. Trilu also tiles its two
matrix axes when ``k`` is given: a tile whose rows start at ``i0`` and columns at ``j0``
is the Trilu of the tile with diagonal ``k + i0 - j0``. CumSum's scanned axis and
OneHot's one-hot axis are whole on every tile.

VJPs: Trilu masks ``dY`` with the same triangle; CumSum's gradient is the cumulative sum
of ``dY`` in the other direction (``reverse`` flipped, ``exclusive`` kept). OneHot has no
gradient (its output depends on integer indices and constants only).

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["CumSum"].forward(np.array([1, 2, 3]), np.array(0), exclusive=1)
    array([0, 1, 3])
"""

from __future__ import annotations

import numpy as np

from dfdl.errors import ModelError, ShapeError
from dfdl.ops.common import letters, normalize_axis
from dfdl.ops.registry import TensorType, TileContext, TileSpec, defvjp, register


def _scalar(x, op: str, what: str) -> int:
    """A constant scalar (or one-element) input as a python int."""
    v = np.asarray(x)
    if v.size != 1:
        raise ShapeError(f"{op}: {what} must be a scalar, got shape {v.shape}")
    return int(v.reshape(()))


def _axis(axis: int, rank: int, op: str) -> int:
    if not -rank <= axis < rank:
        raise ModelError(f"{op}: axis {axis} is out of range for rank {rank}")
    return normalize_axis(axis, rank)


# ---------------------------------------------------------------- Trilu


def _trilu_shape(inputs, consts, *, upper=1, **attrs):
    x = inputs[0]
    if x.rank < 2:
        raise ShapeError(f"Trilu: input must have rank >= 2, got shape {x.shape}")
    if len(consts) > 1 and consts[1] is not None:
        _scalar(consts[1], "Trilu", "k")
    return [x]


def _trilu_tile(ctx: TileContext) -> TileSpec:
    rank = ctx.inputs[0].rank
    names = letters(rank)
    if len(ctx.inputs) < 2 or ctx.inputs[1] is None:
        # without a k input a tile cannot be given its own diagonal: whole matrices
        return TileSpec(inputs=(names[:-2] + "..",), outputs=(names[:-2] + "..",))
    k = _scalar(ctx.consts[1], "Trilu", "k")

    def adjust(attrs, consts, out_regions):
        rows, cols = out_regions[0][-2], out_regions[0][-1]
        # element (i, j) is kept by j - i against k: in tile coordinates k + i0 - j0
        return attrs, {**consts, 1: np.array(k + rows.start - cols.start, np.int64)}

    return TileSpec(inputs=(names, None), outputs=(names,), adjust=adjust)


@register("Trilu", shape=_trilu_shape, tile=_trilu_tile, const_inputs=(1,))
def Trilu(input, k=None, *, upper=1):
    """The upper (``upper=1``) or lower triangle of the last two axes, from diagonal
    ``k`` (0: the main diagonal; positive: above it); zeros elsewhere."""
    input = np.asarray(input)
    if input.ndim < 2:
        raise ShapeError(f"Trilu: input must have rank >= 2, got shape {input.shape}")
    k = 0 if k is None else _scalar(k, "Trilu", "k")
    out = np.triu(input, k) if upper else np.tril(input, k)
    return out.astype(input.dtype, copy=False)


@defvjp("Trilu")
def _trilu_vjp(b, node, dys):
    return [b.op("Trilu", [dys[0], *node.inputs[1:]], dict(node.attrs))] + [None] * (
        len(node.inputs) - 1
    )


# ---------------------------------------------------------------- CumSum


def _cumsum_shape(inputs, consts, *, exclusive=0, reverse=0, **attrs):
    x = inputs[0]
    if x.dtype.kind not in "iuf":
        raise ShapeError(f"CumSum: dtype {x.dtype} is not a number type")
    _axis(_scalar(consts[1], "CumSum", "axis"), x.rank, "CumSum")
    return [x]


def _cumsum_tile(ctx: TileContext) -> TileSpec:
    rank = ctx.inputs[0].rank
    ax = _axis(_scalar(ctx.consts[1], "CumSum", "axis"), rank, "CumSum")
    names = letters(rank)
    spec = names[:ax] + "." + names[ax + 1 :]  # a scan: the whole axis on every tile
    return TileSpec(inputs=(spec, None), outputs=(spec,))


@register("CumSum", shape=_cumsum_shape, tile=_cumsum_tile, const_inputs=(1,))
def CumSum(x, axis, *, exclusive=0, reverse=0):
    """Cumulative sum along ``axis`` (``exclusive``: without the element itself;
    ``reverse``: from the end), in the input's dtype."""
    x = np.asarray(x)
    ax = _axis(_scalar(axis, "CumSum", "axis"), x.ndim, "CumSum")
    flip = (slice(None),) * ax + (slice(None, None, -1),)
    if reverse:
        x = x[flip]
    if exclusive:
        out = np.zeros_like(x)
        head = (slice(None),) * ax + (slice(0, -1),)
        tail = (slice(None),) * ax + (slice(1, None),)
        np.cumsum(x[head], axis=ax, dtype=x.dtype, out=out[tail])
    else:
        out = np.cumsum(x, axis=ax, dtype=x.dtype)
    return np.ascontiguousarray(out[flip]) if reverse else out


@defvjp("CumSum")
def _cumsum_vjp(b, node, dys):
    # y_j = sum over i <= j of x_i, so dx_i = sum over j >= i of dy_j: the other direction
    attrs = {**node.attrs, "reverse": 1 - int(node.attrs.get("reverse", 0))}
    return [b.op("CumSum", [dys[0], node.inputs[1]], attrs), None]


# ---------------------------------------------------------------- OneHot


def _depth(depth) -> int:
    v = np.asarray(depth)
    if v.size != 1:
        raise ShapeError(f"OneHot: depth must be a scalar, got shape {v.shape}")
    d = int(v.reshape(()))
    if d < 1:
        raise ShapeError(f"OneHot: depth must be positive, got {d}")
    return d


def _values(values) -> np.ndarray:
    v = np.asarray(values)
    if v.size != 2:
        raise ShapeError(f"OneHot: values must hold [off_value, on_value], got shape {v.shape}")
    return v.reshape(2)


def _onehot_axis(axis: int, rank: int) -> int:
    if not -(rank + 1) <= axis <= rank:
        raise ModelError(f"OneHot: axis {axis} is out of range for output rank {rank + 1}")
    return normalize_axis(axis, rank + 1)


def _onehot_shape(inputs, consts, *, axis=-1, **attrs):
    idx = inputs[0]
    ax = _onehot_axis(axis, idx.rank)
    depth = _depth(consts[1])
    values = _values(consts[2])
    return [TensorType(idx.shape[:ax] + (depth,) + idx.shape[ax:], values.dtype)]


def _onehot_tile(ctx: TileContext) -> TileSpec:
    rank = ctx.inputs[0].rank
    ax = _onehot_axis(ctx.attrs.get("axis", -1), rank)
    names = letters(rank)
    return TileSpec(inputs=(names, None, None), outputs=(names[:ax] + "." + names[ax:],))


@register(
    "OneHot", shape=_onehot_shape, tile=_onehot_tile, const_inputs=(1, 2), differentiable=False
)
def OneHot(indices, depth, values, *, axis=-1):
    """``values[1]`` where the new ``axis`` equals ``indices`` (negative ones count from
    ``depth``), ``values[0]`` elsewhere, also for indices outside ``[-depth, depth)``."""
    indices = np.asarray(indices)
    ax = _onehot_axis(axis, indices.ndim)
    n = _depth(depth)
    off, on = _values(values)
    idx = np.where(indices < 0, indices + n, indices)
    idx = np.expand_dims(idx, ax)
    pos = np.arange(n).reshape((n,) + (1,) * (indices.ndim - ax))
    return np.where(idx == pos, on, off).astype(np.asarray(values).dtype, copy=False)
