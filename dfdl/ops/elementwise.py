"""Elementwise ops: arithmetic, unary math, activations, comparisons, Where, Clip, Cast.

Every op here computes each output element from the elements at the same (broadcast)
position of its inputs, so every output axis can be tiled (``common.elementwise_tile``);
size-1 input axes are broadcast by the tiler. Outputs keep ONNX dtypes exactly: results
are cast back to the input dtype wherever numpy would promote.

Most of the ops are one numpy function of their inputs: each is a row of :data:`TABLE`
(its name, numpy function, accepted dtype kinds and gradient), and one loop registers
them all. The gradient column is written as arithmetic on graph values, like tinygrad's
gradient table: ``lambda dy, x, y: dy * y`` is Exp's. The ops the table cannot hold
follow it, each with its own rules: Pow (mixed dtypes), LeakyRelu and Gelu (attributes),
Clip and Where (optional or condition inputs), Cast and CastLike (output dtypes), and
the fused activation gradients of the ``dfdl`` domain (``dfdl.ReluGrad``...). Their CPU
kernels are in :mod:`dfdl.ops.cpu.elementwise`; the ``params`` rules here resolve the
attributes those kernels take.

Gradients follow torch: kinks take the one-sided value torch uses, and integer inputs get
no gradient.

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["Div"].forward(np.array([-7, 7], np.int32), np.array([2, 2], np.int32))
    array([-3,  3], dtype=int32)
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import erf, erfc

from dfdl.errors import ShapeError, UnsupportedOpError
from dfdl.ops.common import (
    broadcast_bool,
    broadcast_shape,
    broadcast_types,
    elementwise_tile,
    same_shape,
)
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
        if not present:
            raise ShapeError(f"{op} needs at least one input", given=[])
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


#: numpy dtype kinds an op accepts: floats; floats and signed integers; any number
FLOAT, SIGNED, NUMERIC = "f", "fi", "fiu"


# ------------------------------------------------------------------ gradient helpers


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


class Value:
    """A graph value in a gradient expression of :data:`TABLE`: arithmetic on it appends
    the node to the backward graph (``*`` Mul, ``/`` Div, unary ``-`` Neg) and gives the
    node's output, so a gradient reads like the math and emits its nodes in reading order.

    Example:
        Abs's gradient (a Sign node, then a Mul node):

        >>> dy * x.sign()  # doctest: +SKIP
    """

    __slots__ = ("b", "name")

    def __init__(self, b, name: str):
        self.b = b
        self.name = name

    def _op(self, op_type: str, *others: Value, domain: str = "") -> Value:
        names = [self.name, *(o.name for o in others)]
        return Value(self.b, self.b.op(op_type, names, domain=domain))

    def __mul__(self, other: Value) -> Value:
        return self._op("Mul", other)

    def __truediv__(self, other: Value) -> Value:
        return self._op("Div", other)

    def __add__(self, other: Value) -> Value:
        return self._op("Add", other)

    def __neg__(self) -> Value:
        return self._op("Neg")

    def abs(self) -> Value:
        """|self| (an Abs node)."""
        return self._op("Abs")

    def sigmoid(self) -> Value:
        """1 / (1 + e ** -self) (a Sigmoid node)."""
        return self._op("Sigmoid")

    def equal(self, other: Value) -> Value:
        """Whether self == other, elementwise (an Equal node: a bool value)."""
        return self._op("Equal", other)

    def where(self, a: Value, b: Value) -> Value:
        """``a`` where this bool value is true, else ``b`` (a Where node)."""
        return self._op("Where", a, b)

    def exp(self) -> Value:
        """e ** self (an Exp node)."""
        return self._op("Exp")

    def sign(self) -> Value:
        """-1, 0 or 1 by the sign of self (a Sign node)."""
        return self._op("Sign")

    def const(self, value: float, hint: str) -> Value:
        """A scalar constant of this value's dtype (``hint`` names it)."""
        return Value(self.b, _const(self.b, value, self.name, hint))

    def dfdl(self, op_type: str, *others: Value) -> Value:
        """The ``dfdl``-domain op ``op_type`` of this value and ``others``."""
        return self._op(op_type, *others, domain="dfdl")


# -------------------------------------------------------------- the elementwise table


@dataclass(frozen=True, eq=False)
class Elementwise:
    """One row of :data:`TABLE`, and the numpy forward of its op.

    Attributes:
        name: the ONNX op type.
        fn: the numpy function of the inputs.
        kinds: the numpy dtype kinds input 0 may have (None: any); every input has its
            dtype.
        grad: ``grad(dy, *inputs, y)``: the gradient of each input (a tuple, or one
            :class:`Value` for a one-input op) from the output's gradient ``dy``, the
            inputs and the output ``y``; None: the op has no gradient.
        quiet: the floating-point errors ``fn`` gives on purpose (``np.errstate`` names).
        dtype: the output dtype (None: input 0's).
    """

    name: str
    fn: Callable[..., np.ndarray]
    kinds: str | None
    grad: Callable[..., Value | tuple[Value, ...]] | None
    quiet: str = ""
    dtype: type | None = None

    def __call__(self, *inputs: np.ndarray) -> np.ndarray:
        dtype = inputs[0].dtype if self.dtype is None else self.dtype
        with np.errstate(**dict.fromkeys(self.quiet.split(), "ignore")):
            return _arr(self.fn(*inputs), dtype)

    def __reduce__(self):
        # tasks carry their forward to the workers: by name, not by its lambdas
        return _row, (self.name,)


def _row(name: str) -> Elementwise:
    """The row of :data:`TABLE` named ``name``."""
    return next(row for row in TABLE if row.name == name)


def _divide(A, B):
    """A / B; integer division truncates toward zero like C (numpy's floors)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if A.dtype.kind not in "iu":
            return np.divide(A, B)
        q = np.floor_divide(A, B)
        # floor and trunc differ when the division is inexact and the signs differ
        inexact = np.remainder(A, B) != 0
        return q + (inexact & ((A < 0) ^ (B < 0)))


def _relu(X):
    """max(X, 0) (NaN stays NaN)."""
    return np.maximum(X, 0)


def _sigmoid(X):
    """1 / (1 + exp(-X)), computed without overflow for large |X|."""
    e = np.exp(-np.abs(X))  # in (0, 1]: never overflows
    with np.errstate(invalid="ignore"):
        return np.where(X >= 0, 1 / (1 + e), e / (1 + e))


def _wide(X: np.ndarray) -> np.ndarray:
    """X, in float32 if it is float16 (so that a formula rounds once, at the end)."""
    return X.astype(np.float32) if X.dtype == np.float16 else X


def _softplus(X):
    """log(1 + exp(X)), as max(X, 0) + log1p(exp(-|X|)): no overflow for large X."""
    return np.logaddexp(0, _wide(X))


def _softsign(X):
    """X / (1 + |X|)."""
    return X / (1 + np.abs(X))


def _mish(X):
    """X * tanh(softplus(X))."""
    x = _wide(X)
    return x * np.tanh(np.logaddexp(0, x))


def _hard_swish(X):
    """X * HardSigmoid(X) with alpha = 1/6, beta = 1/2, written as torch's kernel computes
    it (x * clamp(x + 3, 0, 6) / 6), so training rounds as torch does."""
    x = _wide(X)
    return x * np.clip(x + 3, 0, 6) / 6


def _fold(ufunc: np.ufunc) -> Callable[..., np.ndarray]:
    """The variadic op of a binary ufunc: ``ufunc`` applied left to right."""

    def fn(*xs):
        return functools.reduce(ufunc, xs)

    return fn


def _mean(*xs):
    """The sum of the inputs (left to right, in their dtype) over their count."""
    return functools.reduce(np.add, xs) / len(xs)


def _softsign_grad(dy, x, y):
    """dy / (1 + |x|) ** 2."""
    d = x.abs() + x.const(1, "one")
    return dy / (d * d)


def _extreme_grad(dy, *xs_y):
    """Max's and Min's gradient: each input holding the output's value at a position gets
    an equal share of dy there (torch.amax's rule over the stacked inputs; for two inputs
    it is torch.maximum's: dy / 2 each at a tie), the other inputs get 0."""
    *xs, y = xs_y
    if len(xs) == 1:
        return (dy,)
    one, zero = dy.const(1, "one"), dy.const(0, "zero")
    hits = [x.equal(y).where(one, zero) for x in xs]
    share = dy / functools.reduce(operator.add, hits)
    return tuple(share * h for h in hits)


# fmt: off
#: The ops that are one numpy function of their inputs. Gradients: ``dy`` is the output's
#: gradient, then come the inputs and the output ``y``.
TABLE: tuple[Elementwise, ...] = (
    # arithmetic, with broadcasting (integers wrap around)
    Elementwise("Add",        np.add,         NUMERIC, lambda dy, a, b, y: (dy, dy)),
    Elementwise("Sub",        np.subtract,    NUMERIC, lambda dy, a, b, y: (dy, -dy)),
    Elementwise("Mul",        np.multiply,    NUMERIC, lambda dy, a, b, y: (dy * b, dy * a)),
    # d(a / b) / db = -(a / b) / b: the output times the first gradient, negated
    Elementwise("Div",        _divide,        NUMERIC, lambda dy, a, b, y: (g := dy / b, -(g * y))),
    # variadic (one or more inputs, broadcast together): Sum and Mean spread dy to every
    # input; Max and Min give it to the inputs that hold the extreme (ties share it)
    Elementwise("Sum",        _fold(np.add),  FLOAT,   lambda dy, *xs_y: (dy,) * (len(xs_y) - 1)),
    Elementwise("Mean",       _mean,          FLOAT,   lambda dy, *xs_y:
                (dy / dy.const(len(xs_y) - 1, "count"),) * (len(xs_y) - 1)),
    Elementwise("Max",        _fold(np.maximum), NUMERIC, _extreme_grad),
    Elementwise("Min",        _fold(np.minimum), NUMERIC, _extreme_grad),
    # unary math
    Elementwise("Sqrt",       np.sqrt,        FLOAT,   lambda dy, x, y:
                dy * dy.const(0.5, "half") / y, quiet="invalid"),  # NaN below 0
    Elementwise("Reciprocal", np.reciprocal,  FLOAT,   lambda dy, x, y: -(dy * (y * y)),
                quiet="divide"),
    Elementwise("Neg",        np.negative,    SIGNED,  lambda dy, x, y: -dy),
    Elementwise("Abs",        np.abs,         NUMERIC, lambda dy, x, y: dy * x.sign()),
    # -1, 0 or 1 (NaN stays NaN); its derivative is 0 almost everywhere
    Elementwise("Sign",       np.sign,        NUMERIC, None),
    # rounding to integral values (Round: halves to even): no gradient, as Sign
    Elementwise("Floor",      np.floor,       FLOAT,   None),
    Elementwise("Ceil",       np.ceil,        FLOAT,   None),
    Elementwise("Round",      np.round,       FLOAT,   None),
    Elementwise("Exp",        np.exp,         FLOAT,   lambda dy, x, y: dy * y, quiet="over"),
    Elementwise("Log",        np.log,         FLOAT,   lambda dy, x, y: dy / x,
                quiet="divide invalid"),  # -inf at 0, NaN below
    Elementwise("Erf",        erf,            FLOAT,   lambda dy, x, y:
                dy * (x.const(2 / math.sqrt(math.pi), "two_over_sqrt_pi") * (-(x * x)).exp())),
    # activations; Relu's output is > 0 exactly where its input is: only the output is kept
    Elementwise("Relu",       _relu,          SIGNED,  lambda dy, x, y: dy.dfdl("ReluGrad", y)),
    Elementwise("Sigmoid",    _sigmoid,       FLOAT,   lambda dy, x, y: dy.dfdl("SigmoidGrad", y)),
    Elementwise("Tanh",       np.tanh,        FLOAT,   lambda dy, x, y: dy.dfdl("TanhGrad", y)),
    Elementwise("Softplus",   _softplus,      FLOAT,   lambda dy, x, y: dy * x.sigmoid()),
    Elementwise("Softsign",   _softsign,      FLOAT,   _softsign_grad, quiet="invalid"),
    # -inf * 0 gives NaN at -inf, as in torch
    Elementwise("Mish",       _mish,          FLOAT,   lambda dy, x, y: dy.dfdl("MishGrad", x),
                quiet="invalid"),
    Elementwise("HardSwish",  _hard_swish,    FLOAT,   lambda dy, x, y:
                dy.dfdl("HardSwishGrad", x), quiet="invalid"),
    # comparisons and logic: bool outputs, no gradient
    Elementwise("Equal",      np.equal,       None,    None, dtype=np.bool_),
    Elementwise("Less",       np.less,        NUMERIC, None, dtype=np.bool_),
    Elementwise("Greater",    np.greater,     NUMERIC, None, dtype=np.bool_),
    Elementwise("LessOrEqual",    np.less_equal,    NUMERIC, None, dtype=np.bool_),
    Elementwise("GreaterOrEqual", np.greater_equal, NUMERIC, None, dtype=np.bool_),
    Elementwise("IsNaN",      np.isnan,       FLOAT,   None, dtype=np.bool_),
    Elementwise("Not",        np.logical_not, "b",     None, dtype=np.bool_),
    Elementwise("And",        np.logical_and, "b",     None, dtype=np.bool_),
    Elementwise("Or",         np.logical_or,  "b",     None, dtype=np.bool_),
    Elementwise("Xor",        np.logical_xor, "b",     None, dtype=np.bool_),
    # the input itself (tiles are never written in place, so no copy is needed)
    Elementwise("Identity",   np.asarray,     None,    lambda dy, x, y: dy),
)
# fmt: on


def _table_vjp(grad: Callable) -> Callable:
    """The VJP rule (:func:`dfdl.ops.registry.defvjp`) of a row's gradient expression."""

    def vjp(b, node, dys):
        if not _f(b, node.inputs[0]):  # integer inputs get no gradient
            return [None] * len(node.inputs)
        grads = grad(*(Value(b, v) for v in (dys[0], *node.inputs, node.outputs[0])))
        return [g.name for g in (grads if isinstance(grads, tuple) else (grads,))]

    return vjp


for _op in TABLE:
    register(
        _op.name,
        # the broadcast shape of one input is its shape
        shape=_checked(
            broadcast_shape if _op.dtype is None else broadcast_bool, _op.name, _op.kinds
        ),
        tile=elementwise_tile,
        differentiable=_op.grad is not None,
        vjp=None if _op.grad is None else _table_vjp(_op.grad),
    )(_op)


# ------------------------------------------------------------------------------- Pow


@register(
    "Pow", shape=_checked(broadcast_shape, "Pow", NUMERIC, same_dtype=False), tile=elementwise_tile
)
def Pow(X, Y):
    """X ** Y with the dtype of X (the exponent may have another numeric dtype)."""
    with np.errstate(all="ignore"):
        if X.dtype.kind in "iu" and Y.dtype.kind in "iu" and np.any(Y < 0):
            # numpy refuses negative integer powers; ONNX runtimes go through double
            return _arr(np.trunc(np.power(X.astype(np.float64), Y)), X.dtype)
        return _arr(np.power(X, Y), X.dtype)


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


# ------------------------------------------------------------------ LeakyRelu, Gelu


def _leaky_relu_shape(inputs, consts, *, alpha=0.01):
    return _checked(same_shape, "LeakyRelu", FLOAT)(inputs, consts)


def leaky_relu_params(X, *, alpha=0.01) -> dict:
    """The LeakyRelu kernels' parameters: ``alpha`` as a float.

    Example:
        >>> leaky_relu_params(np.ones(3, np.float32))
        {'alpha': 0.01}
    """
    return {"alpha": float(alpha)}


@register("LeakyRelu", shape=_leaky_relu_shape, tile=elementwise_tile, params=leaky_relu_params)
def LeakyRelu(X, *, alpha=0.01):
    """X for X >= 0, alpha * X below."""
    return _arr(np.where(X < 0, X * X.dtype.type(alpha), X), X.dtype)


@defvjp("LeakyRelu")
def _leaky_relu_vjp(b, node, dys):
    alpha = float(node.attrs.get("alpha", 0.01))
    # with alpha > 0 the output has the input's sign, so it can stand for the input
    saved = node.outputs[0] if alpha > 0 else node.inputs[0]
    return [b.op("ReluGrad", [dys[0], saved], {"alpha": alpha}, domain="dfdl")]


def _check_approximate(approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise UnsupportedOpError(
            f"Gelu approximate={approximate!r} is not supported (use 'none' or 'tanh')",
            op_type="Gelu",
        )


def _gelu_shape(inputs, consts, *, approximate="none"):
    _check_approximate(approximate)
    return _checked(same_shape, "Gelu", FLOAT)(inputs, consts)


def gelu_params(*inputs, approximate="none") -> dict:
    """The Gelu and ``dfdl.GeluGrad`` kernels' parameters: ``tanh``, whether the tanh
    approximation is asked for.

    Example:
        >>> gelu_params(np.ones(3, np.float32), approximate="tanh")
        {'tanh': True}
    """
    return {"tanh": approximate == "tanh"}


@register("Gelu", shape=_gelu_shape, tile=elementwise_tile, params=gelu_params)
def Gelu(X, *, approximate="none"):
    """x * Phi(x), exactly via erf or with the tanh approximation."""
    _check_approximate(approximate)
    # float16 would lose most digits in the cubic term: compute it in float32
    x = X.astype(np.float32) if X.dtype == np.float16 else X
    with np.errstate(invalid="ignore", over="ignore"):  # x**3 may overflow; -inf gives NaN
        if approximate == "tanh":
            # 0.5 * (1 + tanh(u)) == sigmoid(2u), which does not cancel for u << 0
            u = (2 * _SQRT_2_OVER_PI) * (x + 0.044715 * x * x * x)
            return _arr(x * _sigmoid(u), X.dtype)
        # 1 + erf(-t) == erfc(t), which does not cancel for x << 0
        return _arr(0.5 * x * erfc(-x * _INV_SQRT2), X.dtype)


@defvjp("Gelu")
def _gelu_vjp(b, node, dys):
    approximate = node.attrs.get("approximate", "none")
    return [b.op("GeluGrad", [dys[0], node.inputs[0]], {"approximate": approximate}, domain="dfdl")]


# ------------------------------------- HardSigmoid, Elu, Selu, Celu, ThresholdedRelu


def hard_sigmoid_params(*inputs, alpha=0.2, beta=0.5) -> dict:
    """The HardSigmoid and ``dfdl.HardSigmoidGrad`` kernels' parameters: ``alpha`` and
    ``beta`` as floats.

    Example:
        >>> hard_sigmoid_params(np.ones(3, np.float32), alpha=0.25)
        {'alpha': 0.25, 'beta': 0.5}
    """
    return {"alpha": float(alpha), "beta": float(beta)}


@register(
    "HardSigmoid",
    shape=_checked(same_shape, "HardSigmoid", FLOAT),
    tile=elementwise_tile,
    params=hard_sigmoid_params,
)
def HardSigmoid(X, *, alpha=0.2, beta=0.5):
    """max(0, min(1, alpha * X + beta)), in X's dtype."""
    t = X.dtype.type
    return _arr(np.clip(X * t(alpha) + t(beta), 0, 1), X.dtype)


@defvjp("HardSigmoid")
def _hard_sigmoid_vjp(b, node, dys):
    attrs = hard_sigmoid_params(**node.attrs)
    return [b.op("HardSigmoidGrad", [dys[0], node.inputs[0]], attrs, domain="dfdl")]


def _alpha_nonzero(op: str):
    """The shape rule of a float unary op whose ``alpha`` divides (Celu)."""
    check = _checked(same_shape, op, FLOAT)

    def shape(inputs, consts, *, alpha=1.0):
        if alpha == 0:
            raise UnsupportedOpError(f"{op} needs a nonzero alpha", op_type=op)
        return check(inputs, consts)

    return shape


def _elu(X, alpha: float, scale: float):
    """scale * X above 0, scale * alpha * (exp(X) - 1) at and below (expm1: exact near 0),
    with float16 computed in float32."""
    x = _wide(X)
    t = x.dtype.type
    neg = t(alpha) * np.expm1(np.minimum(x, 0))  # exp of the negative part only: no overflow
    return _arr(t(scale) * np.where(x > 0, x, neg), X.dtype)


@register("Elu", shape=_checked(same_shape, "Elu", FLOAT), tile=elementwise_tile)
def Elu(X, *, alpha=1.0):
    """X for X > 0, alpha * (exp(X) - 1) below."""
    return _elu(X, alpha, 1.0)


#: Selu's default attributes (the spec's float32 values)
_SELU_ALPHA, _SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875


@register("Selu", shape=_checked(same_shape, "Selu", FLOAT), tile=elementwise_tile)
def Selu(X, *, alpha=_SELU_ALPHA, gamma=_SELU_GAMMA):
    """gamma * X for X > 0, gamma * alpha * (exp(X) - 1) below."""
    return _elu(X, alpha, gamma)


@register("Celu", shape=_alpha_nonzero("Celu"), tile=elementwise_tile)
def Celu(X, *, alpha=1.0):
    """max(0, X) + min(0, alpha * (exp(X / alpha) - 1))."""
    x = _wide(X)
    t = x.dtype.type
    with np.errstate(over="ignore"):  # a negative alpha makes X / alpha large
        neg = t(alpha) * np.expm1(np.minimum(x, 0) / t(alpha))
    return _arr(np.where(x > 0, x, neg), X.dtype)


def _elu_grad(b, node, dys, alpha: float, scale: float = 1.0, input_scale: float = 1.0):
    """The ``dfdl.EluGrad`` node of an ELU-family node (torch's elu_backward)."""
    attrs = {"alpha": alpha, "scale": scale, "input_scale": input_scale}
    return [b.op("EluGrad", [dys[0], node.inputs[0]], attrs, domain="dfdl")]


@defvjp("Elu")
def _elu_vjp(b, node, dys):
    return _elu_grad(b, node, dys, float(node.attrs.get("alpha", 1.0)))


@defvjp("Selu")
def _selu_vjp(b, node, dys):
    alpha = float(node.attrs.get("alpha", _SELU_ALPHA))
    return _elu_grad(b, node, dys, alpha, scale=float(node.attrs.get("gamma", _SELU_GAMMA)))


@defvjp("Celu")
def _celu_vjp(b, node, dys):
    alpha = float(node.attrs.get("alpha", 1.0))
    return _elu_grad(b, node, dys, alpha, input_scale=1.0 / alpha)


@register(
    "ThresholdedRelu", shape=_checked(same_shape, "ThresholdedRelu", FLOAT), tile=elementwise_tile
)
def ThresholdedRelu(X, *, alpha=1.0):
    """X for X > alpha, else 0."""
    return _arr(np.where(X > X.dtype.type(alpha), X, 0), X.dtype)


@defvjp("ThresholdedRelu")
def _thresholded_relu_vjp(b, node, dys):
    alpha = float(node.attrs.get("alpha", 1.0))
    x, dy = node.inputs[0], dys[0]
    if alpha >= 0:
        # the output is > 0 exactly where X > alpha: ReluGrad of the output, as for Relu
        return [b.op("ReluGrad", [dy, node.outputs[0]], domain="dfdl")]
    above = b.op("Greater", [x, _const(b, alpha, x, "alpha")])
    return [b.op("Where", [above, dy, _const(b, 0, x, "zero")])]


@register("Shrink", shape=_checked(same_shape, "Shrink", FLOAT), tile=elementwise_tile)
def Shrink(input, *, bias=0.0, lambd=0.5):
    """input - bias where input > lambd, input + bias where input < -lambd, else 0."""
    t = input.dtype.type
    out = np.where(input > t(lambd), input - t(bias), 0)
    out = np.where(input < -t(lambd), input + t(bias), out)
    return _arr(out, input.dtype)


@defvjp("Shrink")
def _shrink_vjp(b, node, dys):
    lambd = float(node.attrs.get("lambd", 0.5))
    x, dy = node.inputs[0], dys[0]
    outside = b.op("Greater", [b.op("Abs", [x]), _const(b, lambd, x, "lambd")])
    return [b.op("Where", [outside, dy, _const(b, 0, x, "zero")])]


# ------------------------------------------------------------------------------ PRelu

#: the dtypes PRelu-16 allows that numpy holds
_PRELU_TYPES = frozenset(
    np.dtype(t)
    for t in (np.float16, np.float32, np.float64, np.int32, np.int64, np.uint32, np.uint64)
)


def _prelu_shape(inputs, consts, **attrs):
    x, slope = inputs
    if x.dtype not in _PRELU_TYPES:
        raise ShapeError(f"PRelu does not accept {x.dtype} inputs", name="X")
    if slope.dtype != x.dtype:
        raise ShapeError(
            f"PRelu needs a slope of X's dtype {x.dtype}, got {slope.dtype}", name="slope"
        )
    try:
        out = broadcast_types(x, slope)
    except ValueError:
        out = None
    if out != x.shape:
        raise ShapeError(
            f"PRelu: slope shape {slope.shape} does not broadcast to X's shape {x.shape} "
            "(unidirectional broadcasting)",
            name="slope",
            expected=x.shape,
            given=slope.shape,
        )
    return [x]


@register("PRelu", shape=_prelu_shape, tile=elementwise_tile)
def PRelu(X, slope):
    """X for X >= 0, slope * X below (slope broadcasts to X)."""
    return _arr(np.where(X < 0, X * slope, X), X.dtype)


@defvjp("PRelu")
def _prelu_vjp(b, node, dys):
    x, slope = node.inputs
    dy = dys[0]
    if not _f(b, x):
        return [None, None]
    # torch: X gets dy above 0 and slope * dy at and below; the slope gets X * dy below
    zero = _const(b, 0, x, "zero")
    above = b.op("Greater", [x, zero])
    gx = b.op("Where", [above, dy, b.op("Mul", [dy, slope])])
    gslope = b.op("Where", [above, zero, b.op("Mul", [dy, x])])
    return [gx, gslope]


# ------------------------------------------------------------------------ IsInf, Mod


@register(
    "IsInf",
    shape=_checked(broadcast_bool, "IsInf", FLOAT),
    tile=elementwise_tile,
    differentiable=False,
)
def IsInf(X, *, detect_negative=1, detect_positive=1):
    """Whether X is infinite, counting -inf only if ``detect_negative``, +inf only if
    ``detect_positive``."""
    inf = np.isinf(X)
    if not detect_negative:
        inf &= X > 0
    if not detect_positive:
        inf &= X < 0
    return inf


def _mod_shape(inputs, consts, *, fmod=0):
    if fmod not in (0, 1):
        raise UnsupportedOpError(f"Mod needs fmod 0 or 1, got {fmod}", op_type="Mod")
    return _checked(broadcast_shape, "Mod", NUMERIC)(inputs, consts)


@register("Mod", shape=_mod_shape, tile=elementwise_tile)
def Mod(A, B, *, fmod=0):
    """A - floor(A / B) * B (the sign of B; Python's %), or with ``fmod=1`` A - trunc(A / B)
    * B (the sign of A; C's fmod). numpy's remainder and fmod give exactly the spec's
    special values (NaN for infinite A or zero float B...); an integer B of 0 gives 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return _arr(np.fmod(A, B) if fmod else np.remainder(A, B), A.dtype)


@defvjp("Mod")
def _mod_vjp(b, node, dys):
    a, bb = node.inputs
    dy = dys[0]
    if not _f(b, a):
        return [None, None]
    # torch: A gets dy; B gets -dy times the quotient A / B rounded as the op rounds it
    q = b.op("Div", [a, bb])
    if node.attrs.get("fmod", 0):
        below = b.op("Less", [q, _const(b, 0, a, "zero")])
        q = b.op("Where", [below, b.op("Ceil", [q]), b.op("Floor", [q])])
    else:
        q = b.op("Floor", [q])
    return [dy, b.op("Neg", [b.op("Mul", [dy, q])])]


# -------------------------------------------------------------------- Clip, Where


def _whole_params_tile(first: int):
    """Elementwise tiling of inputs ``< first``; later inputs (Clip's bounds, CastLike's
    dtype example) are passed whole, since only their value or dtype matters."""

    def tile(ctx: TileContext) -> TileSpec:
        spec = elementwise_tile(ctx)
        ins = spec.inputs[:first] + (None,) * (len(ctx.inputs) - first)
        return TileSpec(inputs=ins, outputs=spec.outputs)

    return tile


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


@register("Clip", shape=_clip_shape, tile=_whole_params_tile(1))
def Clip(input, min=None, max=None):
    """input limited to [min, max]; an absent bound is no bound; min > max gives max."""
    out = input
    if min is not None:
        out = np.maximum(out, np.asarray(min).reshape(()))
    if max is not None:
        out = np.minimum(out, np.asarray(max).reshape(()))
    return _arr(out, input.dtype)


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


@register("Where", shape=_where_shape, tile=elementwise_tile)
def Where(condition, X, Y):
    """X where condition is true, else Y (all three broadcast)."""
    return _arr(np.where(condition, X, Y), X.dtype)


@defvjp("Where")
def _where_vjp(b, node, dys):
    cond, x, y = node.inputs
    if not _f(b, x):
        return [None, None, None]
    zero = _const(b, 0, x, "zero")
    return [None, b.op("Where", [cond, dys[0], zero]), b.op("Where", [cond, zero, dys[0]])]


# ----------------------------------------------------------------- Cast, CastLike


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


@register("Cast", shape=_cast_shape, tile=elementwise_tile)
def Cast(input, *, to, saturate=1, round_mode="up"):
    """input converted to ONNX type ``to``; float -> int truncates toward zero.

    ``saturate`` and ``round_mode`` only concern float8 targets, which dfdl does not
    support; they are accepted and ignored.
    """
    dtype = _numpy_dtype(to, "Cast")
    with np.errstate(invalid="ignore", over="ignore"):  # out-of-range casts are UB in ONNX
        return _arr(input, dtype)


@defvjp("Cast")
def _cast_vjp(b, node, dys):
    x = node.inputs[0]
    if dys[0] is None or not _f(b, x):  # to or from a non-float type: no gradient
        return [None]
    return [_cast(b, dys[0], b.type(x).dtype)]


@register("CastLike", shape=_cast_like_shape, tile=_whole_params_tile(1))
def CastLike(input, target_type, *, saturate=1, round_mode="up"):
    """input converted to the dtype of ``target_type`` (whose values are unused)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return _arr(input, target_type.dtype)


@defvjp("CastLike")
def _cast_like_vjp(b, node, dys):
    x = node.inputs[0]
    if dys[0] is None or not _f(b, x):
        return [None, None]
    # a Cast, not CastLike(dy, x): CastLike's tiles get the whole target_type tensor
    return [_cast(b, dys[0], b.type(x).dtype), None]


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


def relu_grad_params(dY, X, *, alpha=0.0) -> dict:
    """The ``dfdl.ReluGrad`` kernels' parameters: ``alpha`` as a float.

    Example:
        >>> relu_grad_params(np.ones(3), np.ones(3), alpha=0.2)
        {'alpha': 0.2}
    """
    return {"alpha": float(alpha)}


@register(
    "ReluGrad",
    domain="dfdl",
    shape=_grad_shape("ReluGrad"),
    tile=elementwise_tile,
    differentiable=False,
    params=relu_grad_params,
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
    differentiable=False,
    params=gelu_params,
)
def GeluGrad(dY, X, *, approximate="none"):
    """dY * d Gelu(X) / dX for either approximation, from the Gelu's input X."""
    _check_approximate(approximate)
    # float16 as in the forward: compute in float32
    x = X.astype(np.float32) if X.dtype == np.float16 else X
    with np.errstate(over="ignore", invalid="ignore"):
        if approximate == "tanh":
            u = (2 * _SQRT_2_OVER_PI) * (x + 0.044715 * x * x * x)
            s = _sigmoid(u)  # 0.5 * (1 + tanh(u / 2)), and d tanh = 4 s (1 - s)
            du = (2 * _SQRT_2_OVER_PI) * (1 + (3 * 0.044715) * x * x)
            d = s + x * s * (1 - s) * du
        else:  # Phi(x) + x * phi(x)
            d = 0.5 * erfc(-x * _INV_SQRT2) + x * (np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi))
    return _arr(dY * d.astype(dY.dtype, copy=False), dY.dtype)


@register(
    "HardSwishGrad",
    domain="dfdl",
    shape=_grad_shape("HardSwishGrad"),
    tile=elementwise_tile,
    differentiable=False,
)
def HardSwishGrad(dY, X):
    """dY * d HardSwish(X) / dX as torch's hardswish_backward: 0 at and below -3, dY at
    and above 3, dY * (X / 3 + 1/2) between; from the HardSwish's input X."""
    t = dY.dtype.type
    mid = dY * (X / t(3) + t(0.5))
    return _arr(np.where(X <= -3, t(0), np.where(X < 3, mid, dY)), dY.dtype)


@register(
    "HardSigmoidGrad",
    domain="dfdl",
    shape=_grad_shape("HardSigmoidGrad"),
    tile=elementwise_tile,
    differentiable=False,
    params=hard_sigmoid_params,
)
def HardSigmoidGrad(dY, X, *, alpha=0.2, beta=0.5):
    """dY * alpha where 0 < alpha * X + beta < 1 (torch's hardsigmoid_backward: 0 at the
    kinks), else 0; from the HardSigmoid's input X."""
    t = dY.dtype.type
    v = X * t(alpha) + t(beta)
    return _arr(np.where((v > 0) & (v < 1), dY * t(alpha), t(0)), dY.dtype)


@register(
    "EluGrad",
    domain="dfdl",
    shape=_grad_shape("EluGrad"),
    tile=elementwise_tile,
    differentiable=False,
)
def EluGrad(dY, X, *, alpha=1.0, scale=1.0, input_scale=1.0):
    """The gradient of torch's ELU family, ``scale * X`` above 0 and ``scale * alpha *
    (exp(X * input_scale) - 1)`` at and below (Elu; Selu: scale = gamma; Celu:
    input_scale = 1 / alpha): dY * scale above 0, dY * scale * alpha * input_scale *
    exp(X * input_scale) at and below; from the op's input X, float16 in float32."""
    x, dy = _wide(X), _wide(dY)
    t = x.dtype.type
    with np.errstate(over="ignore"):
        slope = t(scale * alpha * input_scale) * np.exp(np.minimum(x, 0) * t(input_scale))
    return _arr(dy * np.where(x > 0, t(scale), slope), dY.dtype)


@register(
    "MishGrad",
    domain="dfdl",
    shape=_grad_shape("MishGrad"),
    tile=elementwise_tile,
    differentiable=False,
)
def MishGrad(dY, X):
    """dY * (t + X * sigmoid(X) * (1 - t**2)) with t = tanh(softplus(X)) (torch's
    mish_backward), from the Mish's input X; float16 in float32."""
    x, dy = _wide(X), _wide(dY)
    t = np.tanh(np.logaddexp(0, x))
    with np.errstate(invalid="ignore"):  # inf * 0 at X = +-inf
        return _arr(dy * (t + x * _sigmoid(x) * (1 - t * t)), dY.dtype)


def clip_grad_params(dY, X, min=None, max=None) -> dict:
    """The ``dfdl.ClipGrad`` kernels' parameters: the bounds ``lo`` and ``hi`` as floats,
    infinite where a bound is absent.

    Example:
        >>> clip_grad_params(np.ones(3), np.ones(3), None, np.array(0.5))
        {'lo': -inf, 'hi': 0.5}
    """
    return {
        "lo": -math.inf if min is None else float(np.asarray(min).reshape(())),
        "hi": math.inf if max is None else float(np.asarray(max).reshape(())),
    }


@register(
    "ClipGrad",
    domain="dfdl",
    shape=_grad_shape("ClipGrad"),
    tile=_whole_params_tile(2),
    differentiable=False,
    params=clip_grad_params,
)
def ClipGrad(dY, X, min=None, max=None):
    """dY where min <= X <= max (bounds inclusive, as torch.clamp), else 0."""
    keep = np.ones(X.shape, np.bool_)
    if min is not None:
        keep &= X >= np.asarray(min).reshape(())
    if max is not None:
        keep &= X <= np.asarray(max).reshape(())
    return _arr(np.where(keep, dY, 0), dY.dtype)
