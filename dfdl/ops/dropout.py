"""Dropout (ONNX opset 22), its VJP rule and ``dfdl.DropoutGrad``.

The mask comes from a counter-based stream: element ``i`` (flat index in the whole
tensor) keeps its value when ``splitmix64(key + (i + 1) * golden) / 2**64 >= ratio``,
with ``key = splitmix64(seed)``. Any tile therefore draws exactly the numbers of the
whole tensor, whatever the tiling; the tile rule hands each tile its offset in the
tensor (the ``_offset`` and ``_full_shape`` attributes).

The CPU kernel (:mod:`dfdl.ops.cpu.dropout`) hashes in one numba pass; it receives the
ratio, the stream key and the global index of each row's first element from
:func:`dropout_params`.

Example:
    >>> whole = dropout_uniform(7, (4, 6))
    >>> bool((dropout_uniform(7, (2, 6), offset=(2, 0), full_shape=(4, 6)) == whole[2:]).all())
    True
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from dfdl.errors import ShapeError
from dfdl.ops.common import elementwise_tile, letters
from dfdl.ops.registry import DFDL_DOMAIN, TensorType, TileContext, TileSpec, defvjp, register

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def global_flat_index(shape, offset=None, full_shape=None) -> np.ndarray:
    """uint64 flat index in the whole tensor (``full_shape``) of each element of the
    region of ``shape`` starting at ``offset``.

    Example:
        >>> global_flat_index((1, 2), (1, 1), (2, 3))
        array([[4, 5]], dtype=uint64)
    """
    shape = tuple(shape)
    offset = tuple(offset) if offset is not None else (0,) * len(shape)
    full_shape = tuple(full_shape) if full_shape is not None else shape
    strides = np.cumprod((1,) + full_shape[::-1][:-1])[::-1] if full_shape else ()
    idx = np.zeros(shape, dtype=np.uint64)
    for a, n in enumerate(shape):
        ix = (np.arange(n, dtype=np.uint64) + np.uint64(offset[a])) * np.uint64(strides[a])
        idx += ix.reshape((n,) + (1,) * (len(shape) - a - 1))
    return idx


def dropout_key(seed) -> np.uint64:
    """The stream key of a Dropout seed: ``splitmix64(seed)``.

    Example:
        >>> bool(dropout_key(0) == dropout_key(2**64))
        True
    """
    with np.errstate(over="ignore"):
        return _splitmix64(np.uint64(int(seed) & _M64))


def dropout_uniform(seed: int, shape, offset=None, full_shape=None) -> np.ndarray:
    """Uniform [0, 1) numbers for a region of a tensor, one per element.

    Element ``i`` (flat index in the whole tensor of ``full_shape``) gets
    ``splitmix64(key + (i + 1) * golden) / 2**64`` with ``key = splitmix64(seed)``: a
    counter-based stream, so any tile computes exactly the whole tensor's numbers.

    Example:
        >>> whole = dropout_uniform(3, (4, 5))
        >>> bool((dropout_uniform(3, (2, 5), (2, 0), (4, 5)) == whole[2:]).all())
        True
    """
    idx = global_flat_index(shape, offset, full_shape)
    with np.errstate(over="ignore"):
        z = _splitmix64(dropout_key(seed) + (idx + np.uint64(1)) * np.uint64(_GOLDEN))
    # top 53 bits -> a double in [0, 1)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _ratio(ratio) -> float:
    return 0.5 if ratio is None else float(np.asarray(ratio).item())


def _training(training_mode) -> bool:
    return training_mode is not None and bool(np.asarray(training_mode).item())


def _dropout_shape(inputs, consts, *, seed=None):
    X = inputs[0]
    return [X, TensorType(X.shape, np.bool_)]


def _dropout_tile(ctx: TileContext) -> TileSpec:
    rank = ctx.inputs[0].rank
    x = letters(rank)
    full = tuple(ctx.inputs[0].shape)

    def adjust(attrs, consts, out_regions):
        # each tile hashes global element indices, so it needs its offset in the tensor
        region = out_regions[0]
        attrs = {**attrs, "_offset": tuple(s.start for s in region), "_full_shape": full}
        return attrs, consts

    ins = (x,) + tuple(None for _ in ctx.inputs[1:])
    return TileSpec(inputs=ins, outputs=(x, x)[: len(ctx.outputs)], adjust=adjust)


def dropout_params(
    data, ratio=None, training_mode=None, *, seed=None, _offset=None, _full_shape=None
) -> dict:
    """The Dropout kernels' parameters for a tile of rank >= 1: ``rate`` (the ratio, a
    float), ``key`` (the stream key of ``seed``) and ``row_base``, the global flat index
    of the first element of each row (all axes but the last, flattened).

    Example:
        >>> p = dropout_params(np.ones((2, 3)), _offset=(1, 0), _full_shape=(3, 3))
        >>> p["rate"], p["row_base"]
        (0.5, array([3, 6], dtype=uint64))
    """
    shape = data.shape
    full = shape if _full_shape is None else _full_shape
    return {
        "rate": _ratio(ratio),
        "key": dropout_key(0 if seed is None else seed),
        "row_base": global_flat_index((*shape[:-1], 1), _offset, full).reshape(-1),
    }


@register("Dropout", shape=_dropout_shape, tile=_dropout_tile, params=dropout_params)
def Dropout(data, ratio=None, training_mode=None, *, seed=None, _offset=None, _full_shape=None):
    """Dropout (opset 22); returns ``(output, mask)``.

    In training mode element ``i`` is kept when its counter-based uniform number (from
    ``seed``, default 0, and its global flat index) is ``>= ratio``; kept elements are
    scaled by ``1 / (1 - ratio)``. ``_offset``/``_full_shape`` locate a tile in the tensor.
    """
    r = _ratio(ratio)
    if not _training(training_mode) or r == 0:
        # the input itself, not a copy: tiles are never written after they are made
        return data, np.ones(data.shape, dtype=np.bool_)
    if not 0 <= r <= 1:
        raise ValueError(f"Dropout: ratio must be in [0, 1], got {r}")
    u = dropout_uniform(0 if seed is None else seed, data.shape, _offset, _full_shape)
    mask = u >= r
    if r == 1:
        return np.zeros_like(data), mask
    scale = np.asarray(1.0 / (1.0 - r), dtype=data.dtype)
    out = np.where(mask, data * scale, np.zeros((), dtype=data.dtype))
    return out.astype(data.dtype, copy=False), mask


def _dropout_grad_shape(inputs, consts):
    dY, mask = inputs[0], inputs[1]
    if mask.shape != dY.shape or mask.dtype != np.bool_:
        raise ShapeError(f"dfdl.DropoutGrad: mask must be bool of shape {dY.shape}")
    return [dY]


def dropout_grad_params(dY, mask, ratio=None, training_mode=None) -> dict:
    """The DropoutGrad kernels' parameters: ``rate`` (the ratio, a float) and
    ``training`` (whether the forward dropped anything).

    Example:
        >>> dropout_grad_params(None, None, np.float32(0.25), np.bool_(True))
        {'rate': 0.25, 'training': True}
    """
    return {"rate": _ratio(ratio), "training": _training(training_mode)}


@register(
    "DropoutGrad",
    domain=DFDL_DOMAIN,
    shape=_dropout_grad_shape,
    tile=elementwise_tile,
    differentiable=False,
    params=dropout_grad_params,
)
def DropoutGrad(dY, mask, ratio=None, training_mode=None):
    """Dropout backward from the forward's mask: ``dY * mask / (1 - ratio)`` in training."""
    r = _ratio(ratio)
    if not _training(training_mode) or r == 0:
        return dY
    if r == 1:
        return np.zeros_like(dY)
    scale = np.asarray(1.0 / (1.0 - r), dtype=dY.dtype)
    return np.where(mask, dY * scale, np.zeros((), dtype=dY.dtype)).astype(dY.dtype, copy=False)


# ============================================================================ VJP rule


def _dropout_mask(b, node) -> str:
    """The forward Dropout node's mask output, added to the node when it lacks one.

    The backward pass must see the mask of the step's seed, which the trainer sets per
    step on the forward node only: reading its mask (rather than re-running Dropout in
    the backward graph) stays right whatever the seed.
    """
    if len(node.outputs) > 1 and node.outputs[1]:
        return node.outputs[1]
    name, k = f"{node.outputs[0]}.mask", 0
    while name in b.graph.types:
        k += 1
        name = f"{node.outputs[0]}.mask_{k}"
    node.outputs = [node.outputs[0], name, *node.outputs[2:]]
    b.graph.types[name] = TensorType(b.type(node.outputs[0]).shape, np.bool_)
    return name


@defvjp("Dropout")
def _dropout_vjp(b, node, dys):
    ins = list(node.inputs) + [""] * (3 - len(node.inputs))
    _data, ratio, tm = ins
    dy = dys[0]
    n_in = len(node.inputs)
    if dy is None:
        return [None] * n_in
    tm_value = b.graph.initializers.get(tm) if tm else np.asarray(False)
    if tm_value is not None and not bool(np.asarray(tm_value).item()):
        return [dy] + [None] * (n_in - 1)  # inference: identity
    dx = b.op("DropoutGrad", [dy, _dropout_mask(b, node), ratio, tm], domain=DFDL_DOMAIN)
    if not ratio:
        return [dx] + [None] * (n_in - 1)
    # out = mask * x / (1 - ratio)  =>  d out / d ratio = out / (1 - ratio)
    rt = b.type(ratio).dtype
    one_minus = b.op("Sub", [b.const(1.0, rt, "one"), ratio])
    dratio = b.op("Div", [b.op("Mul", [dy, node.outputs[0]]), one_minus])
    if tm_value is None:  # training_mode known only at run time
        dratio = b.op("Mul", [dratio, b.op("Cast", [tm], {"to": _onnx_type(rt)})])
    return [dx, dratio, None][:n_in]


def _onnx_type(dtype) -> int:
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
