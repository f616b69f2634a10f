"""Indexing ops: GatherElements, GatherND, ScatterElements, ScatterND, and their backward
ops ``dfdl.GatherElementsGrad``, ``dfdl.GatherNDGrad``, ``dfdl.ScatterElementsGrad`` and
``dfdl.ScatterNDGrad``.

ONNX semantics at the latest opset: indices are int32 or int64 tensors (runtime inputs
or constants), negative indices count from the end of their axis, and an index out of
range raises ``IndexError``. GatherElements and ScatterElements accept indices smaller
than ``data`` on the axes other than ``axis`` (as onnxruntime and torch do): they then
address the leading corner of ``data``. The scatters' ``reduction`` is one of
none/add/mul/max/min; with ``none``, duplicate indices leave one of their updates
(ONNX leaves which one undefined).

Tiling never changes the math: an indexed axis is whole (".") on every tile, axes
where ``data`` and the indices agree element for element (GatherElements' other axes
where the sizes match, GatherND's batch and trailing axes, ScatterND's trailing axes)
are tiled, and the gather gradients contract the index axes, so each index tile adds
a partial gradient.

VJPs: a gather's ``data`` gets a scatter-add (``GatherElementsGrad``, ``GatherNDGrad``);
a scatter's ``updates`` get a gather of ``dY`` and its ``data`` gets ``dY`` (add) or
``dY`` with the written positions zeroed (none); mul/max/min go through
``ScatterElementsGrad``/``ScatterNDGrad`` (mul: the product of the other factors, taken
without division; max/min: ``dY`` shared evenly between the tied winners, as torch's
``scatter_reduce`` does). Indices get no gradient.

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["GatherElements"].forward(np.array([[1, 2], [3, 4]]), np.array([[1], [0]]),
    ...                                    axis=1)
    array([[2],
           [3]])
"""

from __future__ import annotations

import math

import numpy as np

from dfdl.errors import ModelError, ShapeError
from dfdl.ops.common import letters, normalize_axis
from dfdl.ops.registry import DFDL_DOMAIN, TensorType, TileContext, TileSpec, defvjp, register

#: the ``reduction`` values of ScatterElements/ScatterND and the ufuncs that apply them
_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
REDUCTIONS = ("none", *_REDUCE)


# ---------------------------------------------------------------- shared checks


def _axis(axis: int, rank: int, op: str) -> int:
    if not -rank <= axis < rank:
        raise ModelError(f"{op}: axis {axis} is out of range for rank {rank}")
    return normalize_axis(axis, rank)


def _ints(x) -> list[int]:
    return [int(v) for v in np.asarray(x).reshape(-1)]


def _check_index_dtype(dtype, op: str) -> None:
    # ONNX: GatherND and ScatterND (and so their gradients) index with int64 only
    allowed = ("int64",) if op.startswith(("GatherND", "ScatterND")) else ("int32", "int64")
    if np.dtype(dtype).name not in allowed:
        raise ModelError(f"{op}: indices must be {' or '.join(allowed)}, not {np.dtype(dtype)}")


def _reduction(reduction: str, op: str) -> str:
    if reduction not in REDUCTIONS:
        raise ModelError(f"{op}: reduction {reduction!r} is not one of {list(REDUCTIONS)}")
    return reduction


def _wrapped(indices, sizes, op: str) -> np.ndarray:
    """int64 indices with negatives wrapped; ``sizes`` broadcasts against the last axis
    (one size per index component) or is one int. Out of range raises IndexError."""
    idx = np.asarray(indices)
    _check_index_dtype(idx.dtype, op)
    idx = idx.astype(np.int64, copy=False)
    n = np.asarray(sizes, dtype=np.int64)
    if idx.size and (np.any(idx < -n) or np.any(idx >= n)):
        bad = idx[(idx < -n) | (idx >= n)][0]
        raise IndexError(f"{op}: index {int(bad)} is out of range for axis size(s) {_ints(n)}")
    return np.where(idx < 0, idx + n, idx)


def _check_const_indices(consts, sizes, op: str) -> None:
    """Indices known at plan time (input 1) are range-checked there, not in a task."""
    idx = consts[1] if len(consts) > 1 else None
    if idx is not None:
        try:
            _wrapped(idx, sizes, op)
        except IndexError as e:
            raise ShapeError(str(e)) from e


# ---------------------------------------------------------------- GatherElements / ScatterElements


def _check_elements(data: tuple, indices: tuple, ax: int, op: str) -> None:
    """Same rank; off ``axis`` the indices may not reach past ``data``."""
    if len(indices) != len(data):
        raise ShapeError(f"{op}: indices rank {len(indices)} != data rank {len(data)}")
    for d, (n, i) in enumerate(zip(data, indices, strict=True)):
        if d != ax and i > n:
            raise ShapeError(
                f"{op}: indices shape {list(indices)} exceeds data shape {list(data)} on axis {d}"
            )


def _element_index(idx: np.ndarray, ax: int) -> tuple:
    """The fancy index of every element of ``idx``: its own position off ``ax``, its
    value on ``ax``."""
    grid = list(np.indices(idx.shape, sparse=True))
    grid[ax] = idx
    return tuple(grid)


def _elements_tile_chars(data: tuple, indices: tuple, ax: int) -> str:
    """One char per axis: a letter off ``ax`` where data and indices agree, "." elsewhere."""
    names = letters(len(data))
    return "".join(names[d] if d != ax and data[d] == indices[d] else "." for d in range(len(data)))


def _gather_elements_shape(inputs, consts, *, axis=0, **attrs):
    data, idx = inputs[0], inputs[1]
    if data.rank < 1:
        raise ShapeError("GatherElements: data must have rank >= 1")
    _check_index_dtype(idx.dtype, "GatherElements")
    ax = _axis(axis, data.rank, "GatherElements")
    _check_elements(data.shape, idx.shape, ax, "GatherElements")
    _check_const_indices(consts, data.shape[ax], "GatherElements")
    return [TensorType(idx.shape, data.dtype)]


def _gather_elements_tile(ctx: TileContext) -> TileSpec:
    data, idx = ctx.inputs[0].shape, ctx.inputs[1].shape
    ax = _axis(ctx.attrs.get("axis", 0), len(data), "GatherElements")
    spec = _elements_tile_chars(data, idx, ax)
    # the output's axis ``ax`` follows the indices' (data's is read whole)
    spec_idx = spec[:ax] + letters(1, offset=len(data)) + spec[ax + 1 :]
    return TileSpec(inputs=(spec, spec_idx), outputs=(spec_idx,))


@register("GatherElements", shape=_gather_elements_shape, tile=_gather_elements_tile)
def GatherElements(data, indices, *, axis=0):
    """``out[i][j][k] = data[i][indices[i][j][k]][k]`` (for axis 1), shaped like ``indices``."""
    data = np.asarray(data)
    indices = np.asarray(indices)
    ax = _axis(axis, data.ndim, "GatherElements")
    _check_elements(data.shape, indices.shape, ax, "GatherElements")
    idx = _wrapped(indices, data.shape[ax], "GatherElements")
    corner = tuple(slice(None) if d == ax else slice(0, s) for d, s in enumerate(idx.shape))
    return np.take_along_axis(data[corner], idx, axis=ax)


def _scatter_elements_shape(inputs, consts, *, axis=0, reduction="none", **attrs):
    data, idx, upd = inputs[0], inputs[1], inputs[2]
    op = "ScatterElements"
    if data.rank < 1:
        raise ShapeError(f"{op}: data must have rank >= 1")
    _check_index_dtype(idx.dtype, op)
    _reduction(reduction, op)
    ax = _axis(axis, data.rank, op)
    if upd.shape != idx.shape:
        raise ShapeError(f"{op}: updates shape {list(upd.shape)} != indices {list(idx.shape)}")
    if upd.dtype != data.dtype:
        raise ShapeError(f"{op}: updates dtype {upd.dtype} != data dtype {data.dtype}")
    _check_elements(data.shape, idx.shape, ax, op)
    _check_const_indices(consts, data.shape[ax], op)
    return [data]


def _scatter_elements_spec(ctx: TileContext, data_at: int) -> str:
    """The one spec of data, indices, updates and output: ``axis`` whole everywhere."""
    data, idx = ctx.inputs[data_at].shape, ctx.inputs[data_at + 1].shape
    ax = _axis(ctx.attrs.get("axis", 0), len(data), "ScatterElements")
    return _elements_tile_chars(data, idx, ax)


def _scatter_elements_tile(ctx: TileContext) -> TileSpec:
    spec = _scatter_elements_spec(ctx, 0)
    return TileSpec(inputs=(spec, spec, spec), outputs=(spec,))


@register("ScatterElements", shape=_scatter_elements_shape, tile=_scatter_elements_tile)
def ScatterElements(data, indices, updates, *, axis=0, reduction="none"):
    """A copy of ``data`` with ``updates`` written (or reduced) at ``indices`` along
    ``axis``: ``out[i][indices[i][j][k]][k] (op)= updates[i][j][k]`` (for axis 1)."""
    data, updates = np.asarray(data), np.asarray(updates)
    indices = np.asarray(indices)
    ax = _axis(axis, data.ndim, "ScatterElements")
    _check_elements(data.shape, indices.shape, ax, "ScatterElements")
    reduction = _reduction(reduction, "ScatterElements")
    where = _element_index(_wrapped(indices, data.shape[ax], "ScatterElements"), ax)
    out = data.copy()
    if reduction == "none":
        out[where] = updates
    else:
        # ufunc.at applies repeated indices one after another, in index order
        _REDUCE[reduction].at(out, where, updates)
    return out


# ---------------------------------------------------------------- GatherND / ScatterND


def _gather_nd_dims(data: tuple, indices: tuple, batch_dims: int) -> int:
    """Check GatherND's shapes; returns ``k``, the length of one index tuple."""
    r, q, b = len(data), len(indices), int(batch_dims)
    if r < 1 or q < 1:
        raise ShapeError(f"GatherND: data and indices need rank >= 1 (got {r} and {q})")
    if not 0 <= b < min(r, q):
        raise ShapeError(f"GatherND: batch_dims {b} must be in [0, {min(r, q)})")
    if tuple(indices[:b]) != tuple(data[:b]):
        raise ShapeError(
            f"GatherND: the {b} batch dims of indices {list(indices)} and data {list(data)} differ"
        )
    k = indices[-1]
    if not 1 <= k <= r - b:
        raise ShapeError(
            f"GatherND: indices' last dim {k} must be in [1, {r - b}] for data {list(data)} "
            f"and batch_dims {b}"
        )
    return k


def _gather_nd_shape(inputs, consts, *, batch_dims=0, **attrs):
    data, idx = inputs[0], inputs[1]
    _check_index_dtype(idx.dtype, "GatherND")
    k = _gather_nd_dims(data.shape, idx.shape, batch_dims)
    _check_const_indices(consts, data.shape[batch_dims : batch_dims + k], "GatherND")
    return [TensorType(idx.shape[:-1] + data.shape[batch_dims + k :], data.dtype)]


def _gather_nd_specs(data: tuple, indices: tuple, b: int) -> tuple[str, str, str]:
    """Specs of (data, indices, gathered): batch and trailing axes tiled, index tuples and
    the indexed data axes whole; the indices' middle axes get their own letters."""
    k = indices[-1]
    names = letters(len(data))
    mid = letters(len(indices) - 1 - b, offset=len(data))
    spec_data = names[:b] + "." * k + names[b + k :]
    spec_idx = names[:b] + mid + "."
    spec_out = names[:b] + mid + names[b + k :]
    return spec_data, spec_idx, spec_out


def _gather_nd_tile(ctx: TileContext) -> TileSpec:
    data, idx = ctx.inputs[0].shape, ctx.inputs[1].shape
    b = int(ctx.attrs.get("batch_dims", 0))
    spec_data, spec_idx, spec_out = _gather_nd_specs(data, idx, b)
    return TileSpec(inputs=(spec_data, spec_idx), outputs=(spec_out,))


def _nd_rows(indices, data_shape: tuple, b: int, op: str) -> tuple[np.ndarray, int]:
    """Each index tuple as a row number of ``data`` viewed ``(batch, rows, trailing)``:
    an int64 array ``(batch, tuples per batch)``, and ``k``."""
    idx = np.asarray(indices)
    k = idx.shape[-1]
    batch = math.prod(data_shape[:b])
    per = math.prod(idx.shape[b:-1])
    lead = data_shape[b : b + k]
    idx = _wrapped(idx, lead, op).reshape(batch, per, k)
    rows = np.zeros((batch, per), dtype=np.int64)
    for j, n in enumerate(lead):  # row-major position of the tuple among data's rows
        rows = rows * n + idx[..., j]
    return rows, k


@register("GatherND", shape=_gather_nd_shape, tile=_gather_nd_tile)
def GatherND(data, indices, *, batch_dims=0):
    """Slices of ``data`` at index tuples (the last axis of ``indices``); the first
    ``batch_dims`` axes of both are matched, not indexed."""
    data, indices = np.asarray(data), np.asarray(indices)
    b = int(batch_dims)
    _gather_nd_dims(data.shape, indices.shape, b)
    rows, k = _nd_rows(indices, data.shape, b, "GatherND")
    batch, tail = rows.shape[0], data.shape[b + k :]
    flat = data.reshape(batch, math.prod(data.shape[b : b + k]), math.prod(tail))
    out = flat[np.arange(batch)[:, None], rows]
    return out.reshape(indices.shape[:-1] + tail)


def _scatter_nd_dims(data: tuple, indices: tuple, updates: tuple) -> int:
    """Check ScatterND's shapes; returns ``k``, the length of one index tuple."""
    if len(data) < 1 or len(indices) < 1:
        raise ShapeError("ScatterND: data and indices need rank >= 1")
    k = indices[-1]
    if k > len(data):
        raise ShapeError(f"ScatterND: indices' last dim {k} exceeds data rank {len(data)}")
    want = tuple(indices[:-1]) + tuple(data[k:])
    if tuple(updates) != want:
        raise ShapeError(
            f"ScatterND: updates shape {list(updates)} != {list(want)} "
            f"(indices {list(indices)}, data {list(data)})"
        )
    return k


def _scatter_nd_shape(inputs, consts, *, reduction="none", **attrs):
    data, idx, upd = inputs[0], inputs[1], inputs[2]
    _check_index_dtype(idx.dtype, "ScatterND")
    _reduction(reduction, "ScatterND")
    if upd.dtype != data.dtype:
        raise ShapeError(f"ScatterND: updates dtype {upd.dtype} != data dtype {data.dtype}")
    k = _scatter_nd_dims(data.shape, idx.shape, upd.shape)
    _check_const_indices(consts, data.shape[:k], "ScatterND")
    return [data]


def _scatter_nd_specs(data: tuple, indices: tuple) -> tuple[str, str, str]:
    """Specs of (data, indices, updates): only data's trailing (sliced) axes are tiled."""
    k = indices[-1]
    names = letters(len(data))
    tail = names[k:]
    return "." * k + tail, "." * len(indices), "." * (len(indices) - 1) + tail


def _scatter_nd_tile(ctx: TileContext) -> TileSpec:
    spec_data, spec_idx, spec_upd = _scatter_nd_specs(ctx.inputs[0].shape, ctx.inputs[1].shape)
    return TileSpec(inputs=(spec_data, spec_idx, spec_upd), outputs=(spec_data,))


def _nd_views(data: np.ndarray, indices, updates, op: str):
    """``(rows, data as (rows of data, trailing), updates as (tuples, trailing))``."""
    idx = np.asarray(indices)
    k = idx.shape[-1]
    rows, _ = _nd_rows(idx, data.shape, 0, op)
    tail = math.prod(data.shape[k:])
    d2 = data.reshape(math.prod(data.shape[:k]), tail)
    return rows.reshape(-1), d2, np.asarray(updates).reshape(rows.size, tail)


@register("ScatterND", shape=_scatter_nd_shape, tile=_scatter_nd_tile)
def ScatterND(data, indices, updates, *, reduction="none"):
    """A copy of ``data`` with ``updates`` written (or reduced) at index tuples:
    ``out[indices[i]] (op)= updates[i]`` for every tuple position ``i``."""
    data, indices = np.asarray(data), np.asarray(indices)
    _scatter_nd_dims(data.shape, indices.shape, np.shape(updates))
    reduction = _reduction(reduction, "ScatterND")
    out = data.copy()
    rows, o2, u2 = _nd_views(out, indices, updates, "ScatterND")
    if reduction == "none":
        o2[rows] = u2
    else:
        _REDUCE[reduction].at(o2, rows, u2)
    return out


# ---------------------------------------------------------------- gather gradients


def _adjust_data_shape(attrs, consts, out_regions):
    """``adjust`` of the gather gradients: ``data_shape`` becomes the tile's output shape."""
    return {**attrs, "data_shape": [s.stop - s.start for s in out_regions[0]]}, consts


def _gather_elements_grad_shape(inputs, consts, *, axis=0, data_shape, **attrs):
    dy, idx = inputs[0], inputs[1]
    shape = tuple(_ints(data_shape))
    ax = _axis(axis, len(shape), "GatherElementsGrad")
    _check_index_dtype(idx.dtype, "GatherElementsGrad")
    _check_elements(shape, idx.shape, ax, "GatherElementsGrad")
    if dy.shape != idx.shape:
        raise ShapeError(f"GatherElementsGrad: dY shape {dy.shape} != indices {idx.shape}")
    return [TensorType(shape, dy.dtype)]


def _gather_elements_grad_tile(ctx: TileContext) -> TileSpec:
    shape = tuple(_ints(ctx.attrs["data_shape"]))
    idx = ctx.inputs[1].shape
    ax = _axis(ctx.attrs.get("axis", 0), len(shape), "GatherElementsGrad")
    spec = _elements_tile_chars(shape, idx, ax)
    # the indices' axis ``ax`` is contracted: each tile scatters a partial gradient
    contracted = letters(1, offset=len(shape))
    spec_idx = spec[:ax] + contracted + spec[ax + 1 :]
    return TileSpec(
        inputs=(spec_idx, spec_idx),
        outputs=(spec,),
        reduce={contracted: "sum"},
        adjust=_adjust_data_shape,
    )


@register(
    "GatherElementsGrad",
    domain=DFDL_DOMAIN,
    shape=_gather_elements_grad_shape,
    tile=_gather_elements_grad_tile,
    differentiable=False,
)
def GatherElementsGrad(dY, indices, *, axis=0, data_shape):
    """Gradient of GatherElements: ``dY`` summed into zeros of ``data_shape`` at the
    positions GatherElements read."""
    dY = np.asarray(dY)
    shape = tuple(_ints(data_shape))
    ax = _axis(axis, len(shape), "GatherElementsGrad")
    _check_elements(shape, np.shape(indices), ax, "GatherElementsGrad")
    out = np.zeros(shape, dtype=dY.dtype)
    # np.add.at accumulates repeated indices (plain fancy assignment would keep one)
    np.add.at(out, _element_index(_wrapped(indices, shape[ax], "GatherElementsGrad"), ax), dY)
    return out


def _gather_nd_grad_shape(inputs, consts, *, batch_dims=0, data_shape, **attrs):
    dy, idx = inputs[0], inputs[1]
    shape = tuple(_ints(data_shape))
    _check_index_dtype(idx.dtype, "GatherNDGrad")
    k = _gather_nd_dims(shape, idx.shape, batch_dims)
    want = idx.shape[:-1] + shape[batch_dims + k :]
    if dy.shape != want:
        raise ShapeError(f"GatherNDGrad: dY shape {dy.shape} != gathered shape {want}")
    return [TensorType(shape, dy.dtype)]


def _gather_nd_grad_tile(ctx: TileContext) -> TileSpec:
    shape = tuple(_ints(ctx.attrs["data_shape"]))
    idx = ctx.inputs[1].shape
    b = int(ctx.attrs.get("batch_dims", 0))
    spec_data, spec_idx, spec_out = _gather_nd_specs(shape, idx, b)
    # the indices' middle letters are contracted: each tile scatters a partial gradient
    mid = letters(len(idx) - 1 - b, offset=len(shape))
    return TileSpec(
        inputs=(spec_out, spec_idx),
        outputs=(spec_data,),
        reduce={ch: "sum" for ch in mid},
        adjust=_adjust_data_shape,
    )


@register(
    "GatherNDGrad",
    domain=DFDL_DOMAIN,
    shape=_gather_nd_grad_shape,
    tile=_gather_nd_grad_tile,
    differentiable=False,
)
def GatherNDGrad(dY, indices, *, batch_dims=0, data_shape):
    """Gradient of GatherND: ``dY`` summed into zeros of ``data_shape`` at the slices
    GatherND read."""
    dY, indices = np.asarray(dY), np.asarray(indices)
    shape, b = tuple(_ints(data_shape)), int(batch_dims)
    _gather_nd_dims(shape, indices.shape, b)
    rows, k = _nd_rows(indices, shape, b, "GatherNDGrad")
    batch, tail = rows.shape[0], math.prod(shape[b + k :])
    out = np.zeros(shape, dtype=dY.dtype)
    flat = out.reshape(batch, math.prod(shape[b : b + k]), tail)
    np.add.at(flat, (np.arange(batch)[:, None], rows), dY.reshape(*rows.shape, tail))
    return out


# ---------------------------------------------------------------- scatter gradients


def _others_product(target: np.ndarray, u: np.ndarray) -> np.ndarray:
    """For each row ``u[i]``, the product of the rows ``u[j]`` with ``target[j] ==
    target[i]``, ``j != i`` (ones where none), without division (exact at zeros)."""
    out = np.ones_like(u)
    order = np.argsort(target, kind="stable")
    sorted_t = target[order]
    starts = np.flatnonzero(np.r_[True, sorted_t[1:] != sorted_t[:-1]])
    ends = np.r_[starts[1:], len(sorted_t)]
    for s, e in zip(starts, ends):
        if e - s < 2:
            continue
        members = order[s:e]
        g = u[members]
        one = np.ones_like(g[:1])
        before = np.concatenate([one, np.cumprod(g[:-1], axis=0)])
        after = np.concatenate([np.cumprod(g[::-1][:-1], axis=0)[::-1], one])
        out[members] = before * after
    return out


def _scatter_grads(dy2, d2, rows, u2, reduction: str):
    """``(dData, dUpdates)`` of a mul/max/min scatter in row form: data and ``dY`` as
    ``(targets, width)``, updates ``u2`` as ``(len(rows), width)`` reduced into row
    ``rows[i]``."""
    if reduction == "mul":
        factor = np.ones_like(d2)
        np.multiply.at(factor, rows, u2)
        return dy2 * factor, dy2[rows] * d2[rows] * _others_product(rows, u2)
    out = d2.copy()
    _REDUCE[reduction].at(out, rows, u2)
    hit_d, hit_u = d2 == out, u2 == out[rows]
    ties = hit_d.astype(dy2.dtype)
    np.add.at(ties, rows, hit_u.astype(dy2.dtype))
    share = dy2 / np.maximum(ties, 1)
    zero = np.zeros((), dy2.dtype)
    return np.where(hit_d, share, zero), np.where(hit_u, share[rows], zero)


def _grad_reduction(reduction: str, op: str) -> str:
    if reduction not in ("mul", "max", "min"):
        raise ModelError(f"{op}: reduction must be mul, max or min, not {reduction!r}")
    return reduction


def _scatter_elements_grad_shape(inputs, consts, *, axis=0, reduction, **attrs):
    dy, data, idx, upd = inputs
    op = "ScatterElementsGrad"
    _grad_reduction(reduction, op)
    _scatter_elements_shape([data, idx, upd], consts[1:], axis=axis, reduction=reduction)
    if dy.shape != data.shape:
        raise ShapeError(f"{op}: dY shape {dy.shape} != data shape {data.shape}")
    return [TensorType(data.shape, dy.dtype), TensorType(upd.shape, dy.dtype)]


def _scatter_elements_grad_tile(ctx: TileContext) -> TileSpec:
    spec = _scatter_elements_spec(ctx, 1)
    return TileSpec(inputs=(spec, spec, spec, spec), outputs=(spec, spec))


@register(
    "ScatterElementsGrad",
    domain=DFDL_DOMAIN,
    shape=_scatter_elements_grad_shape,
    tile=_scatter_elements_grad_tile,
    differentiable=False,
)
def ScatterElementsGrad(dY, data, indices, updates, *, axis=0, reduction):
    """Gradients ``(dData, dUpdates)`` of ScatterElements with reduction mul, max or min."""
    dY, data, updates = np.asarray(dY), np.asarray(data), np.asarray(updates)
    op = "ScatterElementsGrad"
    ax = _axis(axis, data.ndim, op)
    _check_elements(data.shape, np.shape(indices), ax, op)
    where = _element_index(_wrapped(indices, data.shape[ax], op), ax)
    # every element of data is one target row of width 1
    rows = np.ravel_multi_index(np.broadcast_arrays(*where), data.shape).reshape(-1)
    dd, du = _scatter_grads(
        dY.reshape(-1, 1),
        data.reshape(-1, 1),
        rows,
        updates.reshape(-1, 1),
        _grad_reduction(reduction, op),
    )
    return dd.reshape(data.shape), du.reshape(updates.shape)


def _scatter_nd_grad_shape(inputs, consts, *, reduction, **attrs):
    dy, data, idx, upd = inputs
    _grad_reduction(reduction, "ScatterNDGrad")
    _scatter_nd_shape([data, idx, upd], consts[1:], reduction=reduction)
    if dy.shape != data.shape:
        raise ShapeError(f"ScatterNDGrad: dY shape {dy.shape} != data shape {data.shape}")
    return [TensorType(data.shape, dy.dtype), TensorType(upd.shape, dy.dtype)]


def _scatter_nd_grad_tile(ctx: TileContext) -> TileSpec:
    spec_data, spec_idx, spec_upd = _scatter_nd_specs(ctx.inputs[1].shape, ctx.inputs[2].shape)
    return TileSpec(
        inputs=(spec_data, spec_data, spec_idx, spec_upd), outputs=(spec_data, spec_upd)
    )


@register(
    "ScatterNDGrad",
    domain=DFDL_DOMAIN,
    shape=_scatter_nd_grad_shape,
    tile=_scatter_nd_grad_tile,
    differentiable=False,
)
def ScatterNDGrad(dY, data, indices, updates, *, reduction):
    """Gradients ``(dData, dUpdates)`` of ScatterND with reduction mul, max or min."""
    dY, data, indices = np.asarray(dY), np.asarray(data), np.asarray(indices)
    _scatter_nd_dims(data.shape, indices.shape, np.shape(updates))
    rows, d2, u2 = _nd_views(data, indices, updates, "ScatterNDGrad")
    dd, du = _scatter_grads(
        dY.reshape(d2.shape), d2, rows, u2, _grad_reduction(reduction, "ScatterNDGrad")
    )
    return dd.reshape(data.shape), du.reshape(np.shape(updates))


# ---------------------------------------------------------------- VJP rules


def _zeros(b, t: TensorType) -> str:
    """A runtime tensor of zeros of type ``t``."""
    zero = b.const(np.zeros((), t.dtype), hint="zero")
    return b.op("Expand", [zero, b.const(list(t.shape), np.int64, "shape")])


@defvjp("GatherElements")
def _gather_elements_vjp(b, node, dys):
    x = b.type(node.inputs[0])
    attrs = {
        "axis": _axis(node.attrs.get("axis", 0), x.rank, "GatherElements"),
        "data_shape": [int(d) for d in x.shape],
    }
    dx = b.op("GatherElementsGrad", [dys[0], node.inputs[1]], attrs, domain=DFDL_DOMAIN)
    return [dx, None]


@defvjp("GatherND")
def _gather_nd_vjp(b, node, dys):
    x = b.type(node.inputs[0])
    attrs = {
        "batch_dims": int(node.attrs.get("batch_dims", 0)),
        "data_shape": [int(d) for d in x.shape],
    }
    dx = b.op("GatherNDGrad", [dys[0], node.inputs[1]], attrs, domain=DFDL_DOMAIN)
    return [dx, None]


@defvjp("ScatterElements")
def _scatter_elements_vjp(b, node, dys):
    data, idx, upd = node.inputs[:3]
    ax = _axis(node.attrs.get("axis", 0), b.type(data).rank, "ScatterElements")
    reduction = node.attrs.get("reduction", "none")
    if reduction in ("none", "add"):
        du = b.op("GatherElements", [dys[0], idx], {"axis": ax})
        if reduction == "add":
            return [dys[0], None, du]
        # written positions took the update's value: no gradient reaches data there
        dd = b.op("ScatterElements", [dys[0], idx, _zeros(b, b.type(upd))], {"axis": ax})
        return [dd, None, du]
    attrs = {"axis": ax, "reduction": reduction}
    dd, du = b.op(
        "ScatterElementsGrad", [dys[0], data, idx, upd], attrs, domain=DFDL_DOMAIN, n_outputs=2
    )
    return [dd, None, du]


@defvjp("ScatterND")
def _scatter_nd_vjp(b, node, dys):
    data, idx, upd = node.inputs[:3]
    reduction = node.attrs.get("reduction", "none")
    if reduction in ("none", "add"):
        du = b.op("GatherND", [dys[0], idx])
        if reduction == "add":
            return [dys[0], None, du]
        dd = b.op("ScatterND", [dys[0], idx, _zeros(b, b.type(upd))])
        return [dd, None, du]
    dd, du = b.op(
        "ScatterNDGrad",
        [dys[0], data, idx, upd],
        {"reduction": reduction},
        domain=DFDL_DOMAIN,
        n_outputs=2,
    )
    return [dd, None, du]
