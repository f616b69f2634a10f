"""Layout ops: Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Concat, Split, Slice,
Expand, Gather, Tile, DepthToSpace, SpaceToDepth, and the backward ops ``dfdl.SliceGrad``
and ``dfdl.GatherGrad``.

These move or select elements without arithmetic. An axis is tiled (gets a letter)
only where the op maps the elements of each tile to one tile of the output on its
own; axes that are cut, joined, sliced or indexed are never split ("."). Tile also
splits a repeated axis of size 1 (each tile repeats the element as often as it is
long); SpaceToDepth's output rows and columns, and DepthToSpace's output channels in
CRD mode, read the input slab they come from (a window).

VJPs move ``dY`` back: the inverse reshape/transpose, Split for Concat and Concat for
Split, a scatter into zeros for Slice (SliceGrad) and a scatter-add for Gather
(GatherGrad, whose index axes are contracted so batch tiles give partial gradients).
Expand returns ``dY`` as is: the autodiff driver sums it down to the input's shape.
Tile sums ``dY`` over the repeats (Reshape, ReduceSum); DepthToSpace and SpaceToDepth
are each other's gradient in the same mode.

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["Transpose"].forward(np.zeros((2, 3)), perm=[1, 0]).shape
    (3, 2)
"""

from __future__ import annotations

import math

import numpy as np

from dfdl.errors import ModelError, ShapeError
from dfdl.ops.common import letters, normalize_axis
from dfdl.ops.registry import DFDL_DOMAIN, TensorType, TileContext, TileSpec, defvjp, register


def _ints(x) -> list[int]:
    """A constant 1-D (or scalar) integer input as a list of python ints."""
    return [int(v) for v in np.asarray(x).reshape(-1)]


def _axis(axis: int, rank: int, op: str) -> int:
    if not -rank <= axis < rank:
        raise ModelError(f"{op}: axis {axis} is out of range for rank {rank}")
    return normalize_axis(axis, rank)


def _axes(axes, rank: int, op: str) -> list[int]:
    """Normalized axes; duplicates are an error."""
    out = [_axis(a, rank, op) for a in _ints(axes)]
    if len(set(out)) != len(out):
        raise ModelError(f"{op}: repeated axis in {_ints(axes)}")
    return out


def _region_shape(region) -> np.ndarray:
    return np.array([s.stop - s.start for s in region], dtype=np.int64)


def _set_shape_input(attrs, consts, out_regions):
    """``adjust`` for Reshape/Expand: the shape input becomes the tile's output shape."""
    consts = dict(consts)
    consts[1] = _region_shape(out_regions[0])
    return attrs, consts


# ---------------------------------------------------------------- Reshape / Flatten


def reshape_target(in_shape: tuple[int, ...], shape, allowzero: int = 0) -> tuple[int, ...]:
    """Resolve an ONNX Reshape ``shape`` (0 = copy unless allowzero, -1 = inferred)."""
    dims, unknown = [], None
    for i, s in enumerate(_ints(shape)):
        if s == 0 and not allowzero:
            if i >= len(in_shape):
                raise ShapeError(f"Reshape: 0 at position {i} has no input dim to copy")
            s = in_shape[i]
        elif s == -1:
            if unknown is not None:
                raise ShapeError("Reshape: more than one -1 in shape")
            unknown, s = i, 1
        elif s < 0:
            raise ShapeError(f"Reshape: invalid dimension {s}")
        dims.append(s)
    total = math.prod(in_shape)
    if unknown is not None:
        known = math.prod(dims)
        if known == 0 or total % known:
            raise ShapeError(f"Reshape: cannot infer -1 reshaping {in_shape} to {_ints(shape)}")
        dims[unknown] = total // known
    if math.prod(dims) != total:
        raise ShapeError(f"Reshape: cannot reshape {tuple(in_shape)} to {tuple(dims)}")
    return tuple(dims)


def _reshape_shape(inputs, consts, *, allowzero=0, **attrs):
    data = inputs[0]
    return [TensorType(reshape_target(data.shape, consts[1], allowzero), data.dtype)]


def common_ends(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int]:
    """Lengths of the equal leading and trailing dims of two shapes (not overlapping)."""
    p = 0
    while p < min(len(a), len(b)) and a[p] == b[p]:
        p += 1
    s = 0
    while s < min(len(a), len(b)) - p and a[-1 - s] == b[-1 - s]:
        s += 1
    return p, s


def _reshape_tile(ctx: TileContext) -> TileSpec:
    a, b = ctx.inputs[0].shape, ctx.outputs[0].shape
    # equal leading/trailing dims are untouched by the reshape of the middle block
    p, s = common_ends(a, b)
    lead, trail = letters(p), letters(s, offset=p)
    spec_in = lead + "." * (len(a) - p - s) + trail
    spec_out = lead + "." * (len(b) - p - s) + trail
    return TileSpec(inputs=(spec_in, None), outputs=(spec_out,), adjust=_set_shape_input)


def reshape_params(data, shape, *, allowzero=0) -> dict:
    """The Reshape kernels' parameters: ``target``, the output shape.

    Example:
        >>> reshape_params(np.ones((2, 3)), np.array([-1]))
        {'target': (6,)}
    """
    return {"target": reshape_target(data.shape, shape, allowzero)}


@register(
    "Reshape",
    shape=_reshape_shape,
    tile=_reshape_tile,
    const_inputs=(1,),
    params=reshape_params,
)
def Reshape(data, shape, *, allowzero=0):
    """Reshape to ``shape`` (0 copies the input dim unless allowzero, -1 is inferred)."""
    data = np.asarray(data)
    return data.reshape(reshape_target(data.shape, shape, allowzero))


def _flatten_axis(axis: int, rank: int) -> int:
    if not -rank <= axis <= rank:
        raise ModelError(f"Flatten: axis {axis} is out of range for rank {rank}")
    return normalize_axis(axis, rank)


def _flatten_dims(shape: tuple[int, ...], axis: int) -> tuple[int, int]:
    ax = _flatten_axis(axis, len(shape))
    return math.prod(shape[:ax]), math.prod(shape[ax:])


def _flatten_shape(inputs, consts, *, axis=1, **attrs):
    data = inputs[0]
    return [TensorType(_flatten_dims(data.shape, axis), data.dtype)]


def _flatten_tile(ctx: TileContext) -> TileSpec:
    shape = ctx.inputs[0].shape
    r = len(shape)
    ax = _flatten_axis(ctx.attrs.get("axis", 1), r)
    spec_in, spec_out = ["."] * r, [".", "."]
    # axis 0 maps to output row alone when the other leading dims are all 1
    if ax >= 1 and math.prod(shape[1:ax]) == 1:
        spec_in[0] = spec_out[0] = "a"
    # likewise the last axis maps to output column alone
    if r >= 1 and ax <= r - 1 and math.prod(shape[ax : r - 1]) == 1 and spec_in[r - 1] == ".":
        spec_in[r - 1] = spec_out[1] = "b"
    return TileSpec(inputs=("".join(spec_in),), outputs=("".join(spec_out),))


def flatten_params(input, *, axis=1) -> dict:
    """The Flatten kernels' parameters: ``target``, the 2-D output shape.

    Example:
        >>> flatten_params(np.ones((2, 3, 4)))
        {'target': (2, 12)}
    """
    return {"target": _flatten_dims(np.shape(input), axis)}


@register("Flatten", shape=_flatten_shape, tile=_flatten_tile, params=flatten_params)
def Flatten(input, *, axis=1):
    """Flatten to 2-D: dims before ``axis`` form the rows, the rest the columns."""
    input = np.asarray(input)
    return input.reshape(_flatten_dims(input.shape, axis))


# ---------------------------------------------------------------- Transpose


def _perm(perm, rank: int) -> list[int]:
    p = list(range(rank))[::-1] if perm is None else _ints(perm)
    if sorted(normalize_axis(i, rank) for i in p) != list(range(rank)):
        raise ModelError(f"Transpose: perm {p} is not a permutation of {rank} axes")
    return [normalize_axis(i, rank) for i in p]


def _transpose_shape(inputs, consts, *, perm=None, **attrs):
    data = inputs[0]
    p = _perm(perm, data.rank)
    return [TensorType(tuple(data.shape[i] for i in p), data.dtype)]


def _transpose_tile(ctx: TileContext) -> TileSpec:
    names = letters(ctx.inputs[0].rank)
    p = _perm(ctx.attrs.get("perm"), len(names))
    return TileSpec(inputs=(names,), outputs=("".join(names[i] for i in p),))


def transpose_params(data, *, perm=None) -> dict:
    """The Transpose kernels' parameters: ``perm``, the permutation of the tile's axes.

    Example:
        >>> transpose_params(np.ones((2, 3)))
        {'perm': (1, 0)}
    """
    return {"perm": tuple(_perm(perm, np.ndim(data)))}


@register("Transpose", shape=_transpose_shape, tile=_transpose_tile, params=transpose_params)
def Transpose(data, *, perm=None):
    """Permute axes (reverse them by default)."""
    data = np.asarray(data)
    return np.transpose(data, _perm(perm, data.ndim))


# ---------------------------------------------------------------- Squeeze / Unsqueeze


def _squeeze_axes(shape: tuple[int, ...], axes) -> list[int]:
    if axes is None or np.asarray(axes).size == 0:
        return [i for i, d in enumerate(shape) if d == 1]
    out = _axes(axes, len(shape), "Squeeze")
    for a in out:
        if shape[a] != 1:
            raise ShapeError(f"Squeeze: axis {a} of shape {shape} is not 1")
    return sorted(out)


def _squeeze_shape(inputs, consts, **attrs):
    data = inputs[0]
    axes = _squeeze_axes(data.shape, consts[1] if len(consts) > 1 else None)
    return [TensorType(tuple(d for i, d in enumerate(data.shape) if i not in axes), data.dtype)]


def _squeeze_tile(ctx: TileContext) -> TileSpec:
    shape = ctx.inputs[0].shape
    given = ctx.consts[1] if len(ctx.consts) > 1 else None
    axes = _squeeze_axes(shape, given)
    names = letters(len(shape))
    if given is None or np.asarray(given).size == 0:
        # without explicit axes a tile would also drop kept axes that happen to be 1 wide
        names = "." * len(shape)
    spec_in = "".join("." if i in axes else ch for i, ch in enumerate(names))
    extra = (None,) * (len(ctx.inputs) - 1)
    spec_out = "".join(ch for i, ch in enumerate(names) if i not in axes)
    return TileSpec(inputs=(spec_in, *extra), outputs=(spec_out,))


@register("Squeeze", shape=_squeeze_shape, tile=_squeeze_tile, const_inputs=(1,))
def Squeeze(data, axes=None):
    """Remove size-1 ``axes`` (every size-1 axis when absent)."""
    data = np.asarray(data)
    return np.squeeze(data, axis=tuple(_squeeze_axes(data.shape, axes)))


def _unsqueeze_axes(rank: int, axes) -> list[int]:
    return sorted(_axes(axes, rank + len(_ints(axes)), "Unsqueeze"))


def _unsqueeze_dims(shape: tuple[int, ...], axes) -> tuple[int, ...]:
    new = _unsqueeze_axes(len(shape), axes)
    it = iter(shape)
    return tuple(1 if i in new else next(it) for i in range(len(shape) + len(new)))


def _unsqueeze_shape(inputs, consts, **attrs):
    data = inputs[0]
    return [TensorType(_unsqueeze_dims(data.shape, consts[1]), data.dtype)]


def _unsqueeze_tile(ctx: TileContext) -> TileSpec:
    rank = ctx.inputs[0].rank
    new = _unsqueeze_axes(rank, ctx.consts[1])
    it = iter(letters(rank))
    spec_out = "".join("." if i in new else next(it) for i in range(rank + len(new)))
    return TileSpec(inputs=(letters(rank), None), outputs=(spec_out,))


@register("Unsqueeze", shape=_unsqueeze_shape, tile=_unsqueeze_tile, const_inputs=(1,))
def Unsqueeze(data, axes):
    """Insert size-1 axes at ``axes`` (positions in the output)."""
    data = np.asarray(data)
    return data.reshape(_unsqueeze_dims(data.shape, axes))


# ---------------------------------------------------------------- Concat / Split


def _concat_shape(inputs, consts, *, axis=None, **attrs):
    ts = [t for t in inputs if t is not None]
    if axis is None:
        raise ModelError("Concat: attribute 'axis' is required")
    if not ts:
        raise ModelError("Concat: needs at least one input")
    rank = ts[0].rank
    ax = _axis(axis, rank, "Concat")
    for t in ts:
        other = t.shape[:ax] + t.shape[ax + 1 :]
        if t.rank != rank or other != ts[0].shape[:ax] + ts[0].shape[ax + 1 :]:
            raise ShapeError(f"Concat: shapes {[t.shape for t in ts]} differ off axis {ax}")
    shape = list(ts[0].shape)
    shape[ax] = sum(t.shape[ax] for t in ts)
    return [TensorType(tuple(shape), ts[0].dtype)]


def _concat_tile(ctx: TileContext) -> TileSpec:
    rank = ctx.outputs[0].rank
    ax = _axis(ctx.attrs["axis"], rank, "Concat")
    names = letters(rank)
    spec = names[:ax] + "." + names[ax + 1 :]
    return TileSpec(inputs=tuple(spec for _ in ctx.inputs), outputs=(spec,))


def concat_params(*inputs, axis=None) -> dict:
    """The Concat kernels' parameters: ``axis``, non-negative.

    Example:
        >>> concat_params(np.ones((2, 3)), np.ones((2, 1)), axis=-1)
        {'axis': 1}
    """
    if axis is None:
        raise ModelError("Concat: attribute 'axis' is required")
    return {"axis": _axis(axis, np.ndim(inputs[0]), "Concat")}


@register("Concat", shape=_concat_shape, tile=_concat_tile, params=concat_params)
def Concat(*inputs, axis=None):
    """Join ``inputs`` along ``axis``."""
    if axis is None:
        raise ModelError("Concat: attribute 'axis' is required")
    arrays = [np.asarray(x) for x in inputs]
    return np.concatenate(arrays, axis=_axis(axis, arrays[0].ndim, "Concat"))


def split_sizes(dim: int, split, num_outputs) -> list[int]:
    """Output sizes of Split: the ``split`` input or ``num_outputs`` parts (last smaller)."""
    if split is not None and num_outputs is not None:
        raise ModelError("Split: give either the split input or num_outputs, not both")
    if split is not None:
        sizes = _ints(split)
        if sum(sizes) != dim or min(sizes, default=0) < 0:
            raise ShapeError(f"Split: sizes {sizes} do not add up to {dim}")
        return sizes
    if num_outputs is None or num_outputs < 1:
        raise ModelError("Split: needs the split input or num_outputs >= 1")
    chunk = -(-dim // num_outputs)
    last = dim - chunk * (num_outputs - 1)
    if last < 0:
        raise ShapeError(f"Split: cannot split {dim} into {num_outputs} parts of {chunk}")
    return [chunk] * (num_outputs - 1) + [last]


def _split_shape(inputs, consts, *, axis=0, num_outputs=None, **attrs):
    data = inputs[0]
    ax = _axis(axis, data.rank, "Split")
    split = consts[1] if len(consts) > 1 else None
    out = []
    for size in split_sizes(data.shape[ax], split, num_outputs):
        shape = list(data.shape)
        shape[ax] = size
        out.append(TensorType(tuple(shape), data.dtype))
    return out


def _split_tile(ctx: TileContext) -> TileSpec:
    rank = ctx.inputs[0].rank
    ax = _axis(ctx.attrs.get("axis", 0), rank, "Split")
    names = letters(rank)
    spec = names[:ax] + "." + names[ax + 1 :]
    extra = (None,) * (len(ctx.inputs) - 1)
    return TileSpec(inputs=(spec, *extra), outputs=tuple(spec for _ in ctx.outputs))


def split_params(input, split=None, *, axis=0, num_outputs=None) -> dict:
    """The Split kernels' parameters: ``axis``, non-negative, and ``cuts``, the
    positions along it where the outputs start (after the first).

    Example:
        >>> split_params(np.ones((2, 6)), np.array([1, 2, 3]), axis=1)
        {'axis': 1, 'cuts': (1, 3)}
    """
    ax = _axis(axis, np.ndim(input), "Split")
    sizes = split_sizes(np.shape(input)[ax], split, num_outputs)
    return {"axis": ax, "cuts": tuple(int(v) for v in np.cumsum(sizes)[:-1])}


@register("Split", shape=_split_shape, tile=_split_tile, const_inputs=(1,), params=split_params)
def Split(input, split=None, *, axis=0, num_outputs=None):
    """Cut ``input`` along ``axis`` into the given sizes (or ``num_outputs`` parts)."""
    input = np.asarray(input)
    ax = _axis(axis, input.ndim, "Split")
    sizes = split_sizes(input.shape[ax], split, num_outputs)
    return tuple(np.split(input, np.cumsum(sizes)[:-1], axis=ax))


# ---------------------------------------------------------------- Slice


def slice_params(shape: tuple[int, ...], starts, ends, axes=None, steps=None) -> list[slice]:
    """One python slice per axis with ONNX Slice clamping (negative steps included)."""
    starts, ends = _ints(starts), _ints(ends)
    n = len(starts)
    axes = list(range(n)) if axes is None else _axes(axes, len(shape), "Slice")
    steps = [1] * n if steps is None else _ints(steps)
    if not len(ends) == len(axes) == len(steps) == n:
        raise ModelError("Slice: starts, ends, axes and steps must have the same length")
    out = [slice(None)] * len(shape)
    for start, end, ax, step in zip(starts, ends, axes, steps, strict=True):
        dim = shape[ax]
        if step == 0:
            raise ModelError("Slice: step 0")
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        # end == -1 with a negative step means "through index 0": python spells it None
        out[ax] = slice(start, None if end < 0 else end, step)
    return out


def _slice_shape(inputs, consts, **attrs):
    data = inputs[0]
    sl = slice_params(data.shape, *consts[1:5])
    shape = tuple(len(range(*s.indices(d))) for s, d in zip(sl, data.shape, strict=True))
    return [TensorType(shape, data.dtype)]


def _slice_tile(ctx: TileContext) -> TileSpec:
    shape = ctx.inputs[0].shape
    sl = slice_params(shape, *ctx.consts[1:5])
    names = letters(len(shape))
    # an axis the slice keeps whole stays whole on every tile (ends clamp to the tile)
    whole = [s.indices(d) == (0, d, 1) for s, d in zip(sl, shape, strict=True)]
    spec = "".join(ch if w else "." for ch, w in zip(names, whole, strict=True))
    extra = (None,) * (len(ctx.inputs) - 1)
    return TileSpec(inputs=(spec, *extra), outputs=(spec,))


def slice_index_params(data, starts, ends, axes=None, steps=None) -> dict:
    """The Slice kernels' parameters: ``index``, the tuple of slices to take.

    Example:
        >>> slice_index_params(np.ones((4,)), np.array([1]), np.array([3]))
        {'index': (slice(1, 3, 1),)}
    """
    return {"index": tuple(slice_params(data.shape, starts, ends, axes, steps))}


@register(
    "Slice",
    shape=_slice_shape,
    tile=_slice_tile,
    const_inputs=(1, 2, 3, 4),
    params=slice_index_params,
)
def Slice(data, starts, ends, axes=None, steps=None):
    """Take ``data[starts:ends:steps]`` on ``axes`` (ONNX clamping rules)."""
    data = np.asarray(data)
    return data[tuple(slice_params(data.shape, starts, ends, axes, steps))]


# ---------------------------------------------------------------- Expand


def _expand_dims(in_shape: tuple[int, ...], shape) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(tuple(in_shape), tuple(_ints(shape))))
    except ValueError as e:
        raise ShapeError(f"Expand: cannot broadcast {in_shape} to {_ints(shape)}") from e


def _expand_shape(inputs, consts, **attrs):
    data = inputs[0]
    return [TensorType(_expand_dims(data.shape, consts[1]), data.dtype)]


def _expand_tile(ctx: TileContext) -> TileSpec:
    rank = ctx.outputs[0].rank
    names = letters(rank)
    r_in = ctx.inputs[0].rank
    # input right-aligned; its size-1 axes are broadcast by the tiler
    spec_in = names[rank - r_in :] if r_in else ""
    return TileSpec(inputs=(spec_in, None), outputs=(names,), adjust=_set_shape_input)


def expand_params(input, shape) -> dict:
    """The Expand kernels' parameters: ``target``, the broadcast shape.

    Example:
        >>> expand_params(np.ones((1, 3)), np.array([2, 1]))
        {'target': (2, 3)}
    """
    return {"target": _expand_dims(input.shape, shape)}


@register("Expand", shape=_expand_shape, tile=_expand_tile, const_inputs=(1,), params=expand_params)
def Expand(input, shape):
    """Broadcast ``input`` against ``shape`` (either side may have 1s)."""
    input = np.asarray(input)
    return np.broadcast_to(input, _expand_dims(input.shape, shape)).copy()


# ---------------------------------------------------------------- Gather


def _gather_shape(inputs, consts, *, axis=0, **attrs):
    data, idx = inputs[0], inputs[1]
    ax = _axis(axis, data.rank, "Gather")
    shape = data.shape[:ax] + idx.shape + data.shape[ax + 1 :]
    return [TensorType(shape, data.dtype)]


def _gather_tile(ctx: TileContext) -> TileSpec:
    data, idx = ctx.inputs[0], ctx.inputs[1]
    ax = _axis(ctx.attrs.get("axis", 0), data.rank, "Gather")
    names, inames = letters(data.rank), letters(idx.rank, offset=data.rank)
    spec_data = names[:ax] + "." + names[ax + 1 :]
    return TileSpec(inputs=(spec_data, inames), outputs=(names[:ax] + inames + names[ax + 1 :],))


def gather_params(data, indices, *, axis=0) -> dict:
    """The Gather kernels' parameters: ``axis`` made non-negative.

    Example:
        >>> gather_params(np.ones((2, 3)), np.zeros(1, np.int64), axis=-1)
        {'axis': 1}
    """
    return {"axis": _axis(axis, np.ndim(data), "Gather")}


@register("Gather", shape=_gather_shape, tile=_gather_tile, params=gather_params)
def Gather(data, indices, *, axis=0):
    """Pick entries of ``data`` along ``axis`` at ``indices`` (negative counts from the end)."""
    data, indices = np.asarray(data), np.asarray(indices)
    ax = _axis(axis, data.ndim, "Gather")
    n = data.shape[ax]
    if indices.size and (indices.min() < -n or indices.max() >= n):
        raise IndexError(f"Gather: index out of range [-{n}, {n}) on axis {ax}")
    return np.asarray(np.take(data, indices.astype(np.int64, copy=False), axis=ax))


# ---------------------------------------------------------------- Tile


def _repeats(shape: tuple[int, ...], repeats) -> list[int]:
    r = _ints(repeats)
    if len(r) != len(shape):
        raise ShapeError(f"Tile: {len(r)} repeats for an input of rank {len(shape)}")
    if any(n < 0 for n in r):
        raise ShapeError(f"Tile: negative repeats {r}")
    return r


def _tile_shape(inputs, consts, **attrs):
    data = inputs[0]
    r = _repeats(data.shape, consts[1])
    return [TensorType(tuple(d * n for d, n in zip(data.shape, r, strict=True)), data.dtype)]


def _tile_tile(ctx: TileContext) -> TileSpec:
    shape = ctx.inputs[0].shape
    r = _repeats(shape, ctx.consts[1])
    names = letters(len(shape))
    # an axis repeated once maps tile to tile; a size-1 axis repeated is a broadcast one
    # (each tile repeats its one element as often as the tile is long); other repeated
    # axes are whole
    tiled = [n == 1 or d == 1 for d, n in zip(shape, r, strict=True)]
    spec = "".join(ch if t else "." for ch, t in zip(names, tiled, strict=True))

    def adjust(attrs, consts, out_regions):
        region = out_regions[0]
        reps = [s.stop - s.start if d == 1 else n for s, d, n in zip(region, shape, r, strict=True)]
        return attrs, {**consts, 1: np.array(reps, np.int64)}

    return TileSpec(inputs=(spec, None), outputs=(spec,), adjust=adjust)


@register("Tile", shape=_tile_shape, tile=_tile_tile, const_inputs=(1,))
def Tile(input, repeats):
    """Repeat ``input`` ``repeats[i]`` times along each axis ``i`` (numpy.tile)."""
    input = np.asarray(input)
    return np.tile(input, _repeats(input.shape, repeats))


# ---------------------------------------------------------------- DepthToSpace / SpaceToDepth

_BLOCK_MODES = ("DCR", "CRD")


def _block(op: str, shape: tuple[int, ...], blocksize, mode: str) -> int:
    """The checked blocksize of a DepthToSpace/SpaceToDepth on an input of ``shape``."""
    if mode not in _BLOCK_MODES:
        raise ModelError(f"{op}: mode {mode!r} is not one of {', '.join(_BLOCK_MODES)}")
    if blocksize is None or int(blocksize) < 1:
        raise ModelError(f"{op}: attribute 'blocksize' must be a positive integer")
    if len(shape) != 4:
        raise ShapeError(f"{op}: input must be 4-D (N, C, H, W), got shape {shape}")
    bs = int(blocksize)
    if op == "DepthToSpace" and shape[1] % (bs * bs):
        raise ShapeError(f"DepthToSpace: channels {shape[1]} are not a multiple of {bs}^2")
    if op == "SpaceToDepth" and (shape[2] % bs or shape[3] % bs):
        raise ShapeError(f"SpaceToDepth: H, W {shape[2:]} are not multiples of {bs}")
    return bs


def _depth_to_space_shape(inputs, consts, *, blocksize=None, mode="DCR", **attrs):
    x = inputs[0]
    bs = _block("DepthToSpace", x.shape, blocksize, mode)
    n, c, h, w = x.shape
    return [TensorType((n, c // (bs * bs), h * bs, w * bs), x.dtype)]


def _depth_to_space_tile(ctx: TileContext) -> TileSpec:
    bs = _block(
        "DepthToSpace",
        ctx.inputs[0].shape,
        ctx.attrs.get("blocksize"),
        ctx.attrs.get("mode", "DCR"),
    )
    if ctx.attrs.get("mode", "DCR") == "DCR":
        # output channel c comes from the strided input channels (i * bs + j) * C' + c
        return TileSpec(inputs=("n...",), outputs=("n...",))
    # CRD: output channels [lo, hi) come from input channels [lo * bs^2, hi * bs^2); an
    # output row tile need not start on a block, so the spatial axes are whole
    b2 = bs * bs
    return TileSpec(
        inputs=("nc..",), outputs=("nc..",), windows={(0, 1): lambda lo, hi: (lo * b2, hi * b2)}
    )


@register("DepthToSpace", shape=_depth_to_space_shape, tile=_depth_to_space_tile)
def DepthToSpace(input, *, blocksize=None, mode="DCR"):
    """Move channel blocks into ``blocksize`` x ``blocksize`` spatial blocks (DCR: depth,
    column, row order of the channels; CRD: column, row, depth)."""
    input = np.asarray(input)
    bs = _block("DepthToSpace", input.shape, blocksize, mode)
    n, c, h, w = input.shape
    if mode == "DCR":
        tmp = input.reshape(n, bs, bs, c // (bs * bs), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        tmp = input.reshape(n, c // (bs * bs), bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    return tmp.reshape(n, c // (bs * bs), h * bs, w * bs)


def _space_to_depth_shape(inputs, consts, *, blocksize=None, mode="DCR", **attrs):
    x = inputs[0]
    bs = _block("SpaceToDepth", x.shape, blocksize, mode)
    n, c, h, w = x.shape
    return [TensorType((n, c * bs * bs, h // bs, w // bs), x.dtype)]


def _space_to_depth_tile(ctx: TileContext) -> TileSpec:
    bs = _block(
        "SpaceToDepth",
        ctx.inputs[0].shape,
        ctx.attrs.get("blocksize"),
        ctx.attrs.get("mode", "DCR"),
    )

    def window(lo: int, hi: int) -> tuple[int, int]:
        return lo * bs, hi * bs

    # output rows [lo, hi) are the input rows [lo * bs, hi * bs); output channels mix
    # every input channel with the block offsets, so the channel axis is whole
    return TileSpec(inputs=("n.hw",), outputs=("n.hw",), windows={(0, 2): window, (0, 3): window})


@register("SpaceToDepth", shape=_space_to_depth_shape, tile=_space_to_depth_tile)
def SpaceToDepth(input, *, blocksize=None, mode="DCR"):
    """Move ``blocksize`` x ``blocksize`` spatial blocks into channels (the inverse of
    DepthToSpace in the same mode)."""
    input = np.asarray(input)
    bs = _block("SpaceToDepth", input.shape, blocksize, mode)
    n, c, h, w = input.shape
    tmp = input.reshape(n, c, h // bs, bs, w // bs, bs)
    tmp = tmp.transpose((0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4))
    return tmp.reshape(n, c * bs * bs, h // bs, w // bs)


# ---------------------------------------------------------------- backward ops


def _slice_grad_shape(inputs, consts, *, shape, **attrs):
    dy = inputs[0]
    shape = tuple(_ints(shape))
    sl = slice_params(shape, *consts[1:5])
    want = tuple(len(range(*s.indices(d))) for s, d in zip(sl, shape, strict=True))
    if dy.shape != want:
        raise ShapeError(f"SliceGrad: dY shape {dy.shape} != slice shape {want} of {shape}")
    return [TensorType(shape, dy.dtype)]


def _set_shape_attr(name: str):
    """``adjust`` for the scatter ops: attribute ``name`` becomes the tile's output shape."""

    def adjust(attrs, consts, out_regions):
        return {**attrs, name: [int(d) for d in _region_shape(out_regions[0])]}, consts

    return adjust


def _slice_grad_tile(ctx: TileContext) -> TileSpec:
    shape = tuple(_ints(ctx.attrs["shape"]))
    sl = slice_params(shape, *ctx.consts[1:5])
    names = letters(len(shape))
    # as the forward: an axis the slice keeps whole maps tile to tile (ends clamp)
    whole = [s.indices(d) == (0, d, 1) for s, d in zip(sl, shape, strict=True)]
    spec = "".join(ch if w else "." for ch, w in zip(names, whole, strict=True))
    extra = (None,) * (len(ctx.inputs) - 1)
    return TileSpec(inputs=(spec, *extra), outputs=(spec,), adjust=_set_shape_attr("shape"))


def slice_grad_params(dY, starts, ends, axes=None, steps=None, *, shape) -> dict:
    """The SliceGrad kernels' parameters: ``full``, the input's shape, and ``index``, the
    slices the forward took.

    Example:
        >>> slice_grad_params(np.ones(2), np.array([1]), np.array([3]), shape=[4])
        {'full': (4,), 'index': (slice(1, 3, 1),)}
    """
    full = tuple(_ints(shape))
    return {"full": full, "index": tuple(slice_params(full, starts, ends, axes, steps))}


@register(
    "SliceGrad",
    domain=DFDL_DOMAIN,
    shape=_slice_grad_shape,
    tile=_slice_grad_tile,
    const_inputs=(1, 2, 3, 4),
    differentiable=False,
    params=slice_grad_params,
)
def SliceGrad(dY, starts, ends, axes=None, steps=None, *, shape):
    """Gradient of Slice: ``dY`` written at the sliced positions of zeros of ``shape``."""
    dY = np.asarray(dY)
    shape = tuple(_ints(shape))
    out = np.zeros(shape, dtype=dY.dtype)
    out[tuple(slice_params(shape, starts, ends, axes, steps))] = dY
    return out


def _gather_grad_shape(inputs, consts, *, axis=0, data_shape, **attrs):
    dy, idx = inputs[0], inputs[1]
    shape = tuple(_ints(data_shape))
    ax = _axis(axis, len(shape), "GatherGrad")
    want = shape[:ax] + idx.shape + shape[ax + 1 :]
    if dy.shape != want:
        raise ShapeError(f"GatherGrad: dY shape {dy.shape} != gathered shape {want}")
    return [TensorType(shape, dy.dtype)]


def _gather_grad_tile(ctx: TileContext) -> TileSpec:
    rank, idx = len(_ints(ctx.attrs["data_shape"])), ctx.inputs[1]
    ax = _axis(ctx.attrs.get("axis", 0), rank, "GatherGrad")
    names, inames = letters(rank), letters(idx.rank, offset=rank)
    # index axes are contracted: each index tile scatters a partial gradient, summed
    return TileSpec(
        inputs=(names[:ax] + inames + names[ax + 1 :], inames),
        outputs=(names[:ax] + "." + names[ax + 1 :],),
        reduce={ch: "sum" for ch in inames},
        adjust=_set_shape_attr("data_shape"),
    )


def gather_grad_params(dY, indices, *, axis=0, data_shape) -> dict:
    """The GatherGrad kernels' parameters: ``data_shape`` as a tuple and ``axis``
    normalized against it.

    Example:
        >>> gather_grad_params(np.ones((2, 3)), np.zeros(2, np.int64), axis=-2, data_shape=[5, 3])
        {'axis': 0, 'data_shape': (5, 3)}
    """
    shape = tuple(_ints(data_shape))
    return {"axis": _axis(axis, len(shape), "GatherGrad"), "data_shape": shape}


@register(
    "GatherGrad",
    domain=DFDL_DOMAIN,
    shape=_gather_grad_shape,
    tile=_gather_grad_tile,
    params=gather_grad_params,
    differentiable=False,
)
def GatherGrad(dY, indices, *, axis=0, data_shape):
    """Gradient of Gather: ``dY`` summed into zeros of ``data_shape`` at ``indices``."""
    dY, indices = np.asarray(dY), np.asarray(indices).astype(np.int64)
    shape = tuple(_ints(data_shape))
    ax = _axis(axis, len(shape), "GatherGrad")
    n = shape[ax]
    if indices.size and (indices.min() < -n or indices.max() >= n):
        raise IndexError(f"GatherGrad: index out of range [-{n}, {n}) on axis {ax}")
    out = np.zeros(shape, dtype=dY.dtype)
    # np.add.at accumulates repeated indices (plain fancy assignment would keep one)
    pre = (slice(None),) * ax
    np.add.at(out, (*pre, np.where(indices < 0, indices + n, indices)), dY)
    return out


# ---------------------------------------------------------------- VJP rules


def _const(b, name: str):
    return b.graph.initializers.get(name) if name else None


def _reshape_back(b, node, dy: str) -> str:
    """``dy`` reshaped to the shape of the node's first input."""
    shape = b.const(b.type(node.inputs[0]).shape, np.int64, "shape")
    # allowzero: a 0 in the target is a real zero-sized dim, not "copy"
    return b.op("Reshape", [dy, shape], {"allowzero": 1})


@defvjp("Reshape")
def _reshape_vjp(b, node, dys):
    return [_reshape_back(b, node, dys[0]), None]


@defvjp("Flatten")
def _flatten_vjp(b, node, dys):
    return [_reshape_back(b, node, dys[0])]


@defvjp("Squeeze")
def _squeeze_vjp(b, node, dys):
    return [_reshape_back(b, node, dys[0])] + [None] * (len(node.inputs) - 1)


@defvjp("Unsqueeze")
def _unsqueeze_vjp(b, node, dys):
    return [_reshape_back(b, node, dys[0]), None]


@defvjp("Transpose")
def _transpose_vjp(b, node, dys):
    p = _perm(node.attrs.get("perm"), b.type(node.inputs[0]).rank)
    return [b.op("Transpose", [dys[0]], {"perm": [int(i) for i in np.argsort(p)]})]


@defvjp("Concat")
def _concat_vjp(b, node, dys):
    if len(node.inputs) == 1:
        return [dys[0]]
    ax = _axis(node.attrs["axis"], b.type(node.inputs[0]).rank, "Concat")
    sizes = [b.type(i).shape[ax] for i in node.inputs]
    split = b.const(sizes, np.int64, "split")
    return b.op("Split", [dys[0], split], {"axis": ax}, n_outputs=len(sizes))


@defvjp("Split")
def _split_vjp(b, node, dys):
    x = b.type(node.inputs[0])
    ax = _axis(node.attrs.get("axis", 0), x.rank, "Split")
    sizes = split_sizes(
        x.shape[ax],
        _const(b, node.inputs[1] if len(node.inputs) > 1 else ""),
        node.attrs.get("num_outputs"),
    )
    parts = []
    for k, size in enumerate(sizes):
        dy = dys[k] if k < len(dys) else None
        if dy is None:  # an output without gradient contributes zeros
            shape = list(x.shape)
            shape[ax] = size
            zero = b.const(np.zeros((), x.dtype), hint="zero")
            dy = b.op("Expand", [zero, b.const(shape, np.int64, "shape")])
        parts.append(dy)
    dx = parts[0] if len(parts) == 1 else b.op("Concat", parts, {"axis": ax})
    return [dx] + [None] * (len(node.inputs) - 1)


@defvjp("Slice")
def _slice_vjp(b, node, dys):
    shape = [int(d) for d in b.type(node.inputs[0]).shape]
    dx = b.op("SliceGrad", [dys[0], *node.inputs[1:]], {"shape": shape}, domain=DFDL_DOMAIN)
    return [dx] + [None] * (len(node.inputs) - 1)


@defvjp("Expand")
def _expand_vjp(b, node, dys):
    return [dys[0], None]


@defvjp("Gather")
def _gather_vjp(b, node, dys):
    x = b.type(node.inputs[0])
    attrs = {
        "axis": _axis(node.attrs.get("axis", 0), x.rank, "Gather"),
        "data_shape": [int(d) for d in x.shape],
    }
    dx = b.op("GatherGrad", [dys[0], node.inputs[1]], attrs, domain=DFDL_DOMAIN)
    return [dx, None]


@defvjp("Tile")
def _tile_vjp(b, node, dys):
    x = b.type(node.inputs[0])
    r = _repeats(x.shape, _const(b, node.inputs[1]))
    if all(n == 1 for n in r):
        return [dys[0], None]
    # output axis a of size r*d is (r, d) in numpy.tile's order: sum over the r axes
    split, axes = [], []
    for d, n in zip(x.shape, r, strict=True):
        if n != 1 and d != 1:
            axes.append(len(split))
            split += [n, d]
        else:
            if n != 1:
                axes.append(len(split))
            split.append(n * d)
    dy = dys[0]
    if len(split) != x.rank:
        dy = b.op("Reshape", [dy, b.const(split, np.int64, "shape")], {"allowzero": 1})
    summed = b.op("ReduceSum", [dy, b.const(axes, np.int64, "axes")], {"keepdims": 1})
    return [_reshape_back(b, node, summed), None]


@defvjp("DepthToSpace")
def _depth_to_space_vjp(b, node, dys):
    return [b.op("SpaceToDepth", [dys[0]], dict(node.attrs))]


@defvjp("SpaceToDepth")
def _space_to_depth_vjp(b, node, dys):
    return [b.op("DepthToSpace", [dys[0]], dict(node.attrs))]
