"""Elementwise ops: arithmetic, unary math, activations, comparisons, Where, Clip, Cast.

Every op here computes each output element from the elements at the same (broadcast)
position of its inputs, so every output axis can be tiled (``common.elementwise_tile``);
size-1 input axes are broadcast by the tiler. Outputs keep ONNX dtypes exactly: results
are cast back to the input dtype wherever numpy would promote.

Example:
    >>> Div(np.array([-7, 7], np.int32), np.array([2, 2], np.int32))
    array([-3,  3], dtype=int32)
"""

from __future__ import annotations

import math

import numpy as np
import scipy.special

from dfdl.errors import ShapeError, UnsupportedOpError
from dfdl.ops.common import (
    broadcast_bool,
    broadcast_shape,
    broadcast_types,
    elementwise_tile,
    same_shape,
)
from dfdl.ops.cpu import elementwise as cpu
from dfdl.ops.registry import TensorType, TileContext, TileSpec, register

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)

#: ONNX TensorProto.DataType -> numpy dtype, for the types numpy has natively
ONNX_TO_NUMPY = {
    1: np.float32,
    2: np.uint8,
    3: np.int8,
    4: np.uint16,
    5: np.int16,
    6: np.int32,
    7: np.int64,
    9: np.bool_,
    10: np.float16,
    11: np.float64,
    12: np.uint32,
    13: np.uint64,
}
#: names of the ONNX types dfdl cannot hold in a numpy array (for error messages)
_UNSUPPORTED_TYPES = {
    8: "string",
    14: "complex64",
    15: "complex128",
    16: "bfloat16",
    17: "float8e4m3fn",
    18: "float8e4m3fnuz",
    19: "float8e5m2",
    20: "float8e5m2fnuz",
    21: "uint4",
    22: "int4",
    23: "float4e2m1",
    24: "float8e8m0",
    25: "uint2",
    26: "int2",
    27: "float6e2m3",
    28: "float6e3m2",
}
_NUMPY_TYPES = frozenset(np.dtype(t) for t in ONNX_TO_NUMPY.values())


def _arr(x, dtype) -> np.ndarray:
    """``x`` as an ndarray of ``dtype`` (numpy returns scalars for 0-d results)."""
    return np.asarray(x).astype(dtype, copy=False)


# --------------------------------------------------------------------------- shape rules


def _checked(rule, op: str, kinds: str | None = None, same_dtype: bool = True):
    """Wrap a common shape rule with dtype checks and ShapeError for bad broadcasts.

    Args:
        rule: the shape rule to call (``same_shape``, ``broadcast_shape``...).
        op: op type, for messages.
        kinds: allowed numpy dtype kinds of input 0 (``"f"`` for float-only ops).
        same_dtype: whether all present inputs must share input 0's dtype.
    """

    def shape(inputs, consts, **attrs):
        present = [t for t in inputs if t is not None]
        dtype = present[0].dtype
        if kinds is not None and dtype.kind not in kinds:
            raise ShapeError(f"{op} does not accept {dtype} inputs", name="input 0")
        if same_dtype and any(t.dtype != dtype for t in present):
            got = [str(t.dtype) for t in present]
            raise ShapeError(f"{op} needs inputs of one dtype, got {got}", given=got)
        try:
            return rule(inputs, consts, **attrs)
        except ValueError as e:
            shapes = [t.shape for t in present]
            raise ShapeError(f"{op}: input shapes {shapes} do not broadcast", given=shapes) from e

    return shape


_FLOAT, _SIGNED, _NUMERIC = "f", "fi", "fiu"


def _where_shape(inputs, consts, **attrs):
    cond, x, y = inputs
    if cond.dtype != np.bool_:
        raise ShapeError(f"Where needs a bool condition, got {cond.dtype}", name="condition")
    if x.dtype != y.dtype:
        raise ShapeError(f"Where needs X and Y of one dtype, got {x.dtype} and {y.dtype}")
    try:
        return [TensorType(broadcast_types(cond, x, y), x.dtype)]
    except ValueError as e:
        shapes = [cond.shape, x.shape, y.shape]
        raise ShapeError(f"Where: shapes {shapes} do not broadcast", given=shapes) from e


def _clip_shape(inputs, consts, **attrs):
    x = inputs[0]
    for name, t in zip(("min", "max"), inputs[1:], strict=False):
        if t is None:
            continue
        if t.dtype != x.dtype:
            raise ShapeError(f"Clip {name} must be {x.dtype}, got {t.dtype}", name=name)
        if int(np.prod(t.shape)) != 1:
            raise ShapeError(f"Clip {name} must be a scalar, got shape {t.shape}", name=name)
    return [x]


def _numpy_dtype(to: int, op: str) -> np.dtype:
    """The numpy dtype of ONNX type ``to``, or UnsupportedOpError."""
    if to in ONNX_TO_NUMPY:
        return np.dtype(ONNX_TO_NUMPY[to])
    name = _UNSUPPORTED_TYPES.get(to, f"type {to}")
    raise UnsupportedOpError(
        f"{op} to {name} is not supported (dfdl holds numpy-native dtypes only)", op_type=op
    )


def _check_source(t: TensorType, op: str) -> None:
    if t.dtype not in _NUMPY_TYPES:
        raise UnsupportedOpError(f"{op} from {t.dtype} is not supported", op_type=op)


def _cast_shape(inputs, consts, *, to, saturate=1, round_mode="up"):
    _check_source(inputs[0], "Cast")
    return [TensorType(inputs[0].shape, _numpy_dtype(to, "Cast"))]


def _cast_like_shape(inputs, consts, *, saturate=1, round_mode="up"):
    _check_source(inputs[0], "CastLike")
    if inputs[1].dtype not in _NUMPY_TYPES:
        raise UnsupportedOpError(
            f"CastLike to {inputs[1].dtype} is not supported", op_type="CastLike"
        )
    return [TensorType(inputs[0].shape, inputs[1].dtype)]


def _check_approximate(approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise UnsupportedOpError(
            f"Gelu approximate={approximate!r} is not supported (use 'none' or 'tanh')",
            op_type="Gelu",
        )


def _gelu_shape(inputs, consts, *, approximate="none"):
    _check_approximate(approximate)
    return _checked(same_shape, "Gelu", _FLOAT)(inputs, consts)


def _leaky_relu_shape(inputs, consts, *, alpha=0.01):
    return _checked(same_shape, "LeakyRelu", _FLOAT)(inputs, consts)


# ---------------------------------------------------------------------------- tile rules


def _whole_params_tile(first: int):
    """Elementwise tiling of inputs ``< first``; later inputs (Clip's bounds, CastLike's
    dtype example) are passed whole, since only their value or dtype matters."""

    def tile(ctx: TileContext) -> TileSpec:
        spec = elementwise_tile(ctx)
        ins = spec.inputs[:first] + (None,) * (len(ctx.inputs) - first)
        return TileSpec(inputs=ins, outputs=spec.outputs)

    return tile


def _unary(op: str, kinds: str | None = _FLOAT):
    return _checked(same_shape, op, kinds)


# ------------------------------------------------------------------------ binary arithmetic


@register(
    "Add",
    shape=_checked(broadcast_shape, "Add", _NUMERIC),
    tile=elementwise_tile,
    kernels={"cpu": cpu.add},
)
def Add(A, B):
    """A + B with broadcasting (integers wrap around)."""
    return _arr(np.add(A, B), A.dtype)


@register(
    "Sub",
    shape=_checked(broadcast_shape, "Sub", _NUMERIC),
    tile=elementwise_tile,
    kernels={"cpu": cpu.sub},
)
def Sub(A, B):
    """A - B with broadcasting."""
    return _arr(np.subtract(A, B), A.dtype)


@register(
    "Mul",
    shape=_checked(broadcast_shape, "Mul", _NUMERIC),
    tile=elementwise_tile,
    kernels={"cpu": cpu.mul},
)
def Mul(A, B):
    """A * B with broadcasting."""
    return _arr(np.multiply(A, B), A.dtype)


@register(
    "Div",
    shape=_checked(broadcast_shape, "Div", _NUMERIC),
    tile=elementwise_tile,
    kernels={"cpu": cpu.div},
)
def Div(A, B):
    """A / B; integer division truncates toward zero like C (numpy's floors)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if A.dtype.kind not in "iu":
            return _arr(np.divide(A, B), A.dtype)
        q = np.floor_divide(A, B)
        # floor and trunc differ when the division is inexact and the signs differ
        inexact = np.remainder(A, B) != 0
        return _arr(q + (inexact & ((A < 0) ^ (B < 0))), A.dtype)


@register(
    "Pow", shape=_checked(broadcast_shape, "Pow", _NUMERIC, same_dtype=False), tile=elementwise_tile
)
def Pow(X, Y):
    """X ** Y with the dtype of X (the exponent may have another numeric dtype)."""
    with np.errstate(all="ignore"):
        if X.dtype.kind in "iu" and Y.dtype.kind in "iu" and np.any(Y < 0):
            # numpy refuses negative integer powers; ONNX runtimes go through double
            return _arr(np.trunc(np.power(X.astype(np.float64), Y)), X.dtype)
        return _arr(np.power(X, Y), X.dtype)


# ------------------------------------------------------------------------------ unary math


@register("Sqrt", shape=_unary("Sqrt"), tile=elementwise_tile, kernels={"cpu": cpu.sqrt})
def Sqrt(X):
    """Square root (NaN for negative inputs)."""
    with np.errstate(invalid="ignore"):
        return _arr(np.sqrt(X), X.dtype)


@register("Reciprocal", shape=_unary("Reciprocal"), tile=elementwise_tile)
def Reciprocal(X):
    """1 / X."""
    with np.errstate(divide="ignore"):
        return _arr(np.reciprocal(X), X.dtype)


@register("Neg", shape=_unary("Neg", _SIGNED), tile=elementwise_tile)
def Neg(X):
    """-X."""
    return _arr(np.negative(X), X.dtype)


@register("Abs", shape=_unary("Abs", _NUMERIC), tile=elementwise_tile)
def Abs(X):
    """|X|."""
    return _arr(np.abs(X), X.dtype)


@register("Exp", shape=_unary("Exp"), tile=elementwise_tile)
def Exp(input):
    """e ** input."""
    with np.errstate(over="ignore"):
        return _arr(np.exp(input), input.dtype)


@register("Log", shape=_unary("Log"), tile=elementwise_tile)
def Log(input):
    """Natural logarithm (-inf at 0, NaN below)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return _arr(np.log(input), input.dtype)


@register("Erf", shape=_unary("Erf"), tile=elementwise_tile, kernels={"cpu": cpu.erf})
def Erf(input):
    """The Gauss error function."""
    return _arr(scipy.special.erf(input), input.dtype)


# ------------------------------------------------------------------------------ activations


@register("Relu", shape=_unary("Relu", _SIGNED), tile=elementwise_tile, kernels={"cpu": cpu.relu})
def Relu(X):
    """max(X, 0) (NaN stays NaN)."""
    return _arr(np.maximum(X, 0), X.dtype)


@register(
    "LeakyRelu", shape=_leaky_relu_shape, tile=elementwise_tile, kernels={"cpu": cpu.leaky_relu}
)
def LeakyRelu(X, *, alpha=0.01):
    """X for X >= 0, alpha * X below."""
    return _arr(np.where(X < 0, X * X.dtype.type(alpha), X), X.dtype)


@register("Sigmoid", shape=_unary("Sigmoid"), tile=elementwise_tile, kernels={"cpu": cpu.sigmoid})
def Sigmoid(X):
    """1 / (1 + exp(-X)), computed without overflow for large |X|."""
    e = np.exp(-np.abs(X))  # in (0, 1]: never overflows
    with np.errstate(invalid="ignore"):
        return _arr(np.where(X >= 0, 1 / (1 + e), e / (1 + e)), X.dtype)


@register("Tanh", shape=_unary("Tanh"), tile=elementwise_tile)
def Tanh(input):
    """Hyperbolic tangent."""
    return _arr(np.tanh(input), input.dtype)


@register("Gelu", shape=_gelu_shape, tile=elementwise_tile, kernels={"cpu": cpu.gelu})
def Gelu(X, *, approximate="none"):
    """x * Phi(x), exactly via erf or with the tanh approximation."""
    _check_approximate(approximate)
    # float16 would lose most digits in the cubic term: compute it in float32
    x = X.astype(np.float32) if X.dtype == np.float16 else X
    with np.errstate(invalid="ignore", over="ignore"):  # x**3 may overflow; -inf gives NaN
        if approximate == "tanh":
            # 0.5 * (1 + tanh(u)) == sigmoid(2u), which does not cancel for u << 0
            u = (2 * _SQRT_2_OVER_PI) * (x + 0.044715 * x * x * x)
            return _arr(x * Sigmoid(u), X.dtype)
        # 1 + erf(-t) == erfc(t), which does not cancel for x << 0
        return _arr(0.5 * x * scipy.special.erfc(-x * _INV_SQRT2), X.dtype)


@register("Clip", shape=_clip_shape, tile=_whole_params_tile(1))
def Clip(input, min=None, max=None):
    """input limited to [min, max]; an absent bound is no bound; min > max gives max."""
    out = input
    if min is not None:
        out = np.maximum(out, np.asarray(min).reshape(()))
    if max is not None:
        out = np.minimum(out, np.asarray(max).reshape(()))
    return _arr(out, input.dtype)


# ------------------------------------------------------------------------------ selection


@register("Where", shape=_where_shape, tile=elementwise_tile)
def Where(condition, X, Y):
    """X where condition is true, else Y (all three broadcast)."""
    return _arr(np.where(condition, X, Y), X.dtype)


# ----------------------------------------------------------------------------- comparisons


@register(
    "Equal", shape=_checked(broadcast_bool, "Equal"), tile=elementwise_tile, differentiable=False
)
def Equal(A, B):
    """A == B (bool)."""
    return _arr(np.equal(A, B), np.bool_)


@register(
    "Less",
    shape=_checked(broadcast_bool, "Less", _NUMERIC),
    tile=elementwise_tile,
    differentiable=False,
)
def Less(A, B):
    """A < B (bool)."""
    return _arr(np.less(A, B), np.bool_)


@register(
    "Greater",
    shape=_checked(broadcast_bool, "Greater", _NUMERIC),
    tile=elementwise_tile,
    differentiable=False,
)
def Greater(A, B):
    """A > B (bool)."""
    return _arr(np.greater(A, B), np.bool_)


@register("Not", shape=_unary("Not", "b"), tile=elementwise_tile, differentiable=False)
def Not(X):
    """Logical not of a bool tensor."""
    return _arr(np.logical_not(X), np.bool_)


# ---------------------------------------------------------------------------- type changes


@register("Identity", shape=same_shape, tile=elementwise_tile)
def Identity(input):
    """The input itself (tiles are never written in place, so no copy is needed)."""
    return np.asarray(input)


@register("Cast", shape=_cast_shape, tile=elementwise_tile)
def Cast(input, *, to, saturate=1, round_mode="up"):
    """input converted to ONNX type ``to``; float -> int truncates toward zero.

    ``saturate`` and ``round_mode`` only concern float8 targets, which dfdl does not
    support; they are accepted and ignored.
    """
    dtype = _numpy_dtype(to, "Cast")
    with np.errstate(invalid="ignore", over="ignore"):  # out-of-range casts are UB in ONNX
        return _arr(input, dtype)


@register("CastLike", shape=_cast_like_shape, tile=_whole_params_tile(1))
def CastLike(input, target_type, *, saturate=1, round_mode="up"):
    """input converted to the dtype of ``target_type`` (whose values are unused)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return _arr(input, target_type.dtype)
