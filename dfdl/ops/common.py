"""Shape and tile rules shared by many ops (elementwise, pass-through, untiled).

The shape rules (:func:`same_shape`, :func:`broadcast_shape`, :func:`broadcast_bool`)
give an op's output types from its input types; the tile rules give every output axis
a letter (:func:`elementwise_tile`: inputs broadcast along the same letters) or none
(:func:`whole_tile`: the op runs on whole tensors). This module registers no op.

Example:
    >>> letters(3), normalize_axis(-1, 3)
    ('abc', 2)
"""

from __future__ import annotations

import string

import numpy as np

from dfdl.ops.registry import TensorType, TileContext, TileSpec

#: letters used for tile specs; "." is reserved for "never split"
LETTERS = string.ascii_lowercase


def letters(n: int, offset: int = 0) -> str:
    """``n`` distinct axis letters: ``letters(3) == "abc"``."""
    return LETTERS[offset : offset + n]


def same_shape(inputs, consts, **attrs) -> list[TensorType]:
    """Output 0 has the type of input 0 (unary elementwise ops)."""
    return [inputs[0]]


def broadcast_types(*types: TensorType | None) -> tuple[int, ...]:
    """Numpy/ONNX multidirectional broadcast of the given shapes."""
    return tuple(np.broadcast_shapes(*(t.shape for t in types if t is not None)))


def broadcast_shape(inputs, consts, **attrs) -> list[TensorType]:
    """Broadcast shape of all inputs, dtype of input 0 (Add, Mul, Pow...)."""
    return [TensorType(broadcast_types(*inputs), inputs[0].dtype)]


def broadcast_bool(inputs, consts, **attrs) -> list[TensorType]:
    """Broadcast shape, bool dtype (Equal, Less, Greater)."""
    return [TensorType(broadcast_types(*inputs), np.bool_)]


def elementwise_tile(ctx: TileContext) -> TileSpec:
    """Every output axis tiled; inputs right-aligned, size-1 axes broadcast."""
    rank = len(ctx.outputs[0].shape)
    out = letters(rank)
    ins = []
    for t in ctx.inputs:
        ins.append(None if t is None else out[rank - t.rank :] if t.rank else "")
    return TileSpec(inputs=tuple(ins), outputs=tuple(out for _ in ctx.outputs))


# TileContext.outputs is positional: an absent middle output is None there.


def whole_tile(ctx: TileContext) -> TileSpec:
    """No axis split: one task computes the whole op (the safe default)."""
    return TileSpec(
        inputs=tuple(None if t is None else "." * t.rank for t in ctx.inputs),
        outputs=tuple("" if t is None else "." * t.rank for t in ctx.outputs),
    )


def normalize_axis(axis: int, rank: int) -> int:
    """ONNX negative axis to a non-negative one."""
    return axis + rank if axis < 0 else axis
