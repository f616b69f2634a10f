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
from dfdl.ops.registry import TensorType, TileContext, TileSpec, defvjp, register

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
#: numpy dtype -> ONNX TensorProto.DataType (for the ``to`` of backward Casts)
NUMPY_TO_ONNX = {np.dtype(v): k for k, v in ONNX_TO_NUMPY.items()}


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


@register("Sign", shape=_unary("Sign", _NUMERIC), tile=elementwise_tile, differentiable=False)
def Sign(input):
    """-1, 0 or 1 by the sign of input (NaN stays NaN); its derivative is 0 a.e."""
    return _arr(np.sign(input), input.dtype)


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


# ------------------------------------------------------------------ backward ops (dfdl.*)
# Fused gradients of the activations: one pass over dy and a saved tensor instead of the
# 3-5 elementwise nodes (and temporaries) a composition would need on every activation.


def _grad_shape(op: str, n_tensors: int = 2):
    """Shape rule of ``op(dY, T, *scalars)``: float dY and T of one shape and dtype; the
    optional trailing inputs are scalars of that dtype."""

    def shape(inputs, consts, **attrs):
        if op == "GeluGrad":
            _check_approximate(attrs.get("approximate", "none"))
        dy, t = inputs[:2]
        if dy.dtype.kind != "f":
            raise ShapeError(f"dfdl.{op} needs float inputs, got {dy.dtype}", name="dY")
        if t.shape != dy.shape or t.dtype != dy.dtype:
            got = [(t.shape, str(t.dtype)) for t in (dy, t)]
            raise ShapeError(f"dfdl.{op} needs inputs of one shape and dtype, got {got}")
        for k, p in enumerate(inputs[n_tensors:], n_tensors):
            if p is not None and (p.dtype != dy.dtype or int(np.prod(p.shape)) != 1):
                raise ShapeError(f"dfdl.{op} input {k} must be a {dy.dtype} scalar", name=k)
        return [dy]

    return shape


@register(
    "ReluGrad",
    domain="dfdl",
    shape=_grad_shape("ReluGrad"),
    tile=elementwise_tile,
    kernels={"cpu": cpu.relu_grad},
    differentiable=False,
)
def ReluGrad(dY, X, *, alpha=0.0):
    """dY where X > 0, else alpha * dY (Relu: alpha=0; LeakyRelu: its alpha).

    ``X`` may be the activation's input or its output when the output has the sign of
    the input (Relu; LeakyRelu with alpha > 0): at 0 the gradient is alpha * dY, as in
    torch.
    """
    return _arr(np.where(X > 0, dY, dY * dY.dtype.type(alpha)), dY.dtype)


@register(
    "SigmoidGrad",
    domain="dfdl",
    shape=_grad_shape("SigmoidGrad"),
    tile=elementwise_tile,
    kernels={"cpu": cpu.sigmoid_grad},
    differentiable=False,
)
def SigmoidGrad(dY, Y):
    """dY * Y * (1 - Y), from the Sigmoid's output Y."""
    return _arr(dY * Y * (1 - Y), dY.dtype)


@register(
    "TanhGrad",
    domain="dfdl",
    shape=_grad_shape("TanhGrad"),
    tile=elementwise_tile,
    kernels={"cpu": cpu.tanh_grad},
    differentiable=False,
)
def TanhGrad(dY, Y):
    """dY * (1 - Y**2), from the Tanh's output Y."""
    return _arr(dY * (1 - Y * Y), dY.dtype)


@register(
    "GeluGrad",
    domain="dfdl",
    shape=_grad_shape("GeluGrad"),
    tile=elementwise_tile,
    kernels={"cpu": cpu.gelu_grad},
    differentiable=False,
)
def GeluGrad(dY, X, *, approximate="none"):
    """dY * d Gelu(X) / dX for either approximation, from the Gelu's input X."""
    _check_approximate(approximate)
    # float16 as in the forward: compute in float32
    x = X.astype(np.float32) if X.dtype == np.float16 else X
    with np.errstate(over="ignore", invalid="ignore"):
        if approximate == "tanh":
            u = (2 * _SQRT_2_OVER_PI) * (x + 0.044715 * x * x * x)
            s = Sigmoid(u)  # 0.5 * (1 + tanh(u / 2)), and d tanh = 4 s (1 - s)
            du = (2 * _SQRT_2_OVER_PI) * (1 + (3 * 0.044715) * x * x)
            d = s + x * s * (1 - s) * du
        else:  # Phi(x) + x * phi(x)
            d = 0.5 * scipy.special.erfc(-x * _INV_SQRT2) + x * (
                np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
            )
    return _arr(dY * d.astype(dY.dtype, copy=False), dY.dtype)


@register(
    "ClipGrad",
    domain="dfdl",
    shape=_grad_shape("ClipGrad"),
    tile=_whole_params_tile(2),
    kernels={"cpu": cpu.clip_grad},
    differentiable=False,
)
def ClipGrad(dY, X, min=None, max=None):
    """dY where min <= X <= max (bounds inclusive, as torch.clamp), else 0."""
    keep = np.ones(X.shape, np.bool_)
    if min is not None:
        keep &= X >= np.asarray(min).reshape(())
    if max is not None:
        keep &= X <= np.asarray(max).reshape(())
    return _arr(np.where(keep, dY, 0), dY.dtype)


# -------------------------------------------------------------------------- VJP rules
# Conventions follow torch: gradients of kinks take the one-sided value torch uses, and
# integer inputs get no gradient.


def _f(b, name: str | None) -> bool:
    """Whether the value ``name`` is present and floating point (can carry a gradient)."""
    return bool(name) and b.type(name).dtype.kind == "f"


def _const(b, value, like: str, hint: str) -> str:
    """A scalar constant with the dtype of the value ``like``."""
    return b.const(value, b.type(like).dtype, hint)


def _cast(b, x: str, dtype: np.dtype) -> str:
    """``x`` cast to ``dtype`` (``x`` itself when it already has it)."""
    if b.type(x).dtype == dtype:
        return x
    return b.op("Cast", [x], {"to": NUMPY_TO_ONNX[np.dtype(dtype)]})


@defvjp("Add")
def _add_vjp(b, node, dys):
    a, c = node.inputs
    return [dys[0] if _f(b, a) else None, dys[0] if _f(b, c) else None]


@defvjp("Sub")
def _sub_vjp(b, node, dys):
    a, c = node.inputs
    return [dys[0] if _f(b, a) else None, b.op("Neg", [dys[0]]) if _f(b, c) else None]


@defvjp("Mul")
def _mul_vjp(b, node, dys):
    a, c = node.inputs
    if not _f(b, a):
        return [None, None]
    return [b.op("Mul", [dys[0], c]), b.op("Mul", [dys[0], a])]


@defvjp("Div")
def _div_vjp(b, node, dys):
    a, c = node.inputs
    if not _f(b, a):
        return [None, None]
    da = b.op("Div", [dys[0], c])
    # d(a / c) / dc = -(a / c) / c: reuse the output and da = dy / c
    return [da, b.op("Neg", [b.op("Mul", [da, node.outputs[0]])])]


@defvjp("Pow")
def _pow_vjp(b, node, dys):
    x, y = node.inputs
    dy, out = dys[0], node.outputs[0]
    tx, ty = b.type(x), b.type(y)
    gx = gy = None
    if tx.dtype.kind == "f":
        # y * x**(y-1), with x**(y-1) replaced by 1 where y == 0 (so 0**0 gives 0, as torch)
        c = b.graph.initializers.get(y)
        if c is not None:
            c = np.asarray(c).astype(tx.dtype)
            e = np.where(c == 0, 0, c - 1).astype(tx.dtype)
            coef = b.const(c, hint="pow_coef")
            if np.all(e == 0):
                gx = b.op("Mul", [dy, coef])
            elif np.all(e == 1):
                gx = b.op("Mul", [dy, b.op("Mul", [coef, x])])
            else:
                power = b.op("Pow", [x, b.const(e, hint="pow_exp")])
                gx = b.op("Mul", [dy, b.op("Mul", [coef, power])])
        else:
            yf = _cast(b, y, tx.dtype)
            zero, one = _const(b, 0, x, "zero"), _const(b, 1, x, "one")
            e = b.op("Where", [b.op("Equal", [yf, zero]), zero, b.op("Sub", [yf, one])])
            gx = b.op("Mul", [dy, b.op("Mul", [yf, b.op("Pow", [x, e])])])
    if tx.dtype.kind == "f" and ty.dtype.kind == "f":
        # out * log(x); 0 where x == 0 and y >= 0 (torch), NaN for x < 0
        v = b.op("Mul", [out, b.op("Log", [x])])
        zero = _const(b, 0, x, "zero")
        at0 = b.op("Where", [b.op("Less", [y, _const(b, 0, y, "zero")]), v, zero])
        v = b.op("Where", [b.op("Equal", [x, zero]), at0, v])
        gy = _cast(b, b.op("Mul", [dy, v]), ty.dtype)
    return [gx, gy]


@defvjp("Sqrt")
def _sqrt_vjp(b, node, dys):
    half = _const(b, 0.5, dys[0], "half")
    return [b.op("Div", [b.op("Mul", [dys[0], half]), node.outputs[0]])]


@defvjp("Reciprocal")
def _reciprocal_vjp(b, node, dys):
    y = node.outputs[0]
    return [b.op("Neg", [b.op("Mul", [dys[0], b.op("Mul", [y, y])])])]


@defvjp("Neg")
def _neg_vjp(b, node, dys):
    return [b.op("Neg", [dys[0]])]


@defvjp("Abs")
def _abs_vjp(b, node, dys):
    return [b.op("Mul", [dys[0], b.op("Sign", [node.inputs[0]])])]


@defvjp("Exp")
def _exp_vjp(b, node, dys):
    return [b.op("Mul", [dys[0], node.outputs[0]])]


@defvjp("Log")
def _log_vjp(b, node, dys):
    return [b.op("Div", [dys[0], node.inputs[0]])]


@defvjp("Erf")
def _erf_vjp(b, node, dys):
    x = node.inputs[0]
    k = _const(b, 2 / math.sqrt(math.pi), x, "two_over_sqrt_pi")
    gauss = b.op("Exp", [b.op("Neg", [b.op("Mul", [x, x])])])
    return [b.op("Mul", [dys[0], b.op("Mul", [k, gauss])])]


@defvjp("Relu")
def _relu_vjp(b, node, dys):
    # the output is > 0 exactly where the input is: only the output needs to be kept
    return [b.op("ReluGrad", [dys[0], node.outputs[0]], domain="dfdl")]


@defvjp("LeakyRelu")
def _leaky_relu_vjp(b, node, dys):
    alpha = float(node.attrs.get("alpha", 0.01))
    # with alpha > 0 the output has the input's sign, so it can stand for the input
    saved = node.outputs[0] if alpha > 0 else node.inputs[0]
    return [b.op("ReluGrad", [dys[0], saved], {"alpha": alpha}, domain="dfdl")]


@defvjp("Sigmoid")
def _sigmoid_vjp(b, node, dys):
    return [b.op("SigmoidGrad", [dys[0], node.outputs[0]], domain="dfdl")]


@defvjp("Tanh")
def _tanh_vjp(b, node, dys):
    return [b.op("TanhGrad", [dys[0], node.outputs[0]], domain="dfdl")]


@defvjp("Gelu")
def _gelu_vjp(b, node, dys):
    approximate = node.attrs.get("approximate", "none")
    return [b.op("GeluGrad", [dys[0], node.inputs[0]], {"approximate": approximate}, domain="dfdl")]


@defvjp("Clip")
def _clip_vjp(b, node, dys):
    x, lo, hi = (list(node.inputs) + ["", ""])[:3]
    dy = dys[0]
    if not _f(b, x):
        return [None, None, None]
    gx = b.op("ClipGrad", [dy, x, lo or None, hi or None], domain="dfdl")
    zero = _const(b, 0, x, "zero")
    glo = ghi = None
    # torch.clamp: min gets dy where x < min < max; max where x > max, or everywhere when
    # max < min (the output is then max)
    if lo:
        glo = b.op("Where", [b.op("Less", [x, lo]), dy, zero])
        if hi:
            glo = b.op("Where", [b.op("Less", [lo, hi]), glo, zero])
    if hi:
        ghi = b.op("Where", [b.op("Greater", [x, hi]), dy, zero])
        if lo:
            ghi = b.op("Where", [b.op("Less", [hi, lo]), dy, ghi])
    return [gx, glo, ghi]


@defvjp("Where")
def _where_vjp(b, node, dys):
    cond, x, y = node.inputs
    if not _f(b, x):
        return [None, None, None]
    zero = _const(b, 0, x, "zero")
    return [None, b.op("Where", [cond, dys[0], zero]), b.op("Where", [cond, zero, dys[0]])]


@defvjp("Identity")
def _identity_vjp(b, node, dys):
    return [dys[0]]


@defvjp("Cast")
def _cast_vjp(b, node, dys):
    x = node.inputs[0]
    if dys[0] is None or not _f(b, x):  # to or from a non-float type: no gradient
        return [None]
    return [_cast(b, dys[0], b.type(x).dtype)]


@defvjp("CastLike")
def _cast_like_vjp(b, node, dys):
    x = node.inputs[0]
    if dys[0] is None or not _f(b, x):
        return [None, None]
    # a Cast, not CastLike(dy, x): CastLike's tiles get the whole target_type tensor
    return [_cast(b, dys[0], b.type(x).dtype), None]
