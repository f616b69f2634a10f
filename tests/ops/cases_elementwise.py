"""OpCases for the elementwise family (dfdl/ops/elementwise.py)."""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from tests.ops.case import OpCase, rand

F16, F32, F64 = np.float16, np.float32, np.float64


def _ints(*shape, dtype=np.int32, low=-9, high=10, seed=0, nonzero=False):
    x = np.random.default_rng(seed + sum(shape)).integers(low, high, size=shape).astype(dtype)
    if nonzero:
        x[x == 0] = 3
    return x


def _bools(*shape, seed=0):
    return np.random.default_rng(seed + 7 * len(shape)).random(shape) < 0.5


def _scalar(v, dtype=F32):
    return np.array(v, dtype=dtype)


def _arith(op: str) -> list[OpCase]:
    """Broadcasting and dtype cases shared by Add, Sub, Mul."""
    return [
        OpCase(op, [rand(5, 7), rand(5, 7, seed=1)], id="f32_same"),
        OpCase(op, [rand(5, 1, 4), rand(7, 4, seed=1)], id="f32_bcast"),
        OpCase(op, [rand(3, 5, 7, dtype=F64), _scalar(1.5, F64)], id="f64_scalar"),
        OpCase(op, [_scalar(0.5), rand(5, 7)], id="scalar_first"),
        OpCase(op, [_ints(5, 7), _ints(7, seed=1)], id="i32_bcast"),
        OpCase(op, [_ints(3, 5, dtype=np.int64), _ints(3, 1, dtype=np.int64, seed=2)], id="i64"),
        OpCase(
            op,
            [
                _ints(5, 7, dtype=np.uint8, low=0, high=200),
                _ints(5, 7, dtype=np.uint8, low=0, high=200, seed=3),
            ],
            id="u8_wrap",
        ),
    ]


def _unary(op: str, low=-3.0, high=3.0, **kw) -> list[OpCase]:
    """float32/float64 cases of a float unary op at 1-D, 2-D, 3-D and 0-d."""
    return [
        OpCase(op, [rand(5, 7, low=low, high=high)], id="f32_2d", **kw),
        OpCase(op, [rand(3, 5, 7, dtype=F64, low=low, high=high)], id="f64_3d", **kw),
        OpCase(op, [rand(11, low=low, high=high)], id="f32_1d", **kw),
        OpCase(op, [_scalar((low + high) / 2 + 0.25)], id="f32_0d", **kw),
    ]


def _compare(op: str) -> list[OpCase]:
    a = rand(5, 7).round(0)
    return [
        OpCase(op, [a, rand(5, 7, seed=1).round(0)], id="f32_same"),
        OpCase(op, [rand(5, 1, 4).round(0), rand(7, 4, seed=1).round(0)], id="f32_bcast"),
        OpCase(op, [_ints(5, 7, dtype=np.int64), _ints(7, dtype=np.int64, seed=1)], id="i64"),
        OpCase(op, [_ints(3, 5, 7), _scalar(2, np.int32)], id="i32_scalar"),
        OpCase(op, [rand(3, 5, dtype=F64).round(1), rand(3, 1, dtype=F64).round(1)], id="f64"),
    ]


CASES = [
    *_arith("Add"),
    *_arith("Sub"),
    *_arith("Mul"),
    # Div: C-style truncation for integers, float broadcast, division by zero
    OpCase("Div", [rand(5, 7), rand(5, 7, seed=1, low=0.5, high=3.0)], id="f32_same"),
    OpCase("Div", [rand(5, 1, 4, dtype=F64), rand(7, 4, dtype=F64, low=1, high=2)], id="f64_bcast"),
    OpCase("Div", [rand(5, 7), _scalar(0.0)], id="f32_by_zero"),
    OpCase("Div", [_ints(5, 7), _ints(7, seed=1, nonzero=True)], id="i32_trunc"),
    OpCase(
        "Div",
        [
            _ints(3, 5, dtype=np.int64, low=-100, high=100),
            _ints(3, 5, dtype=np.int64, low=-7, high=8, nonzero=True),
        ],
        id="i64_trunc",
    ),
    OpCase(
        "Div",
        [_ints(5, 7, dtype=np.uint8, low=0, high=250), _ints(5, 7, dtype=np.uint8, low=1, high=9)],
        id="u8",
    ),
    # Pow: output dtype = base dtype whatever the exponent's dtype
    OpCase("Pow", [rand(5, 7, low=0.1, high=3), rand(5, 7, seed=1)], id="f32"),
    OpCase("Pow", [rand(5, 1, 4, low=0.1, high=3), rand(7, 4, seed=1)], id="f32_bcast"),
    OpCase("Pow", [rand(5, 7), _scalar(2.0)], id="f32_square"),
    OpCase("Pow", [rand(5, 7, dtype=F64), _ints(7, dtype=np.int64, low=0, high=4)], id="f64_i64"),
    OpCase("Pow", [rand(3, 5), _ints(3, 5, low=-2, high=4)], id="f32_i32"),
    OpCase(
        "Pow",
        [_ints(5, 7, dtype=np.int64), _ints(5, 7, dtype=np.int64, low=0, high=4)],
        id="i64_i64",
    ),
    OpCase("Pow", [_ints(5, 7), rand(5, 7, low=0, high=3)], id="i32_f32"),
    OpCase(
        "Pow",
        [
            _ints(3, 4, dtype=np.int64, low=-3, high=4, nonzero=True),
            _ints(4, dtype=np.int64, low=-2, high=0),
        ],
        id="i64_negexp",
        reference=lambda x, y: [np.trunc(x.astype(F64) ** y).astype(x.dtype)],
    ),
    # unary math
    *_unary("Sqrt", low=0.0, high=9.0),
    *_unary("Reciprocal", low=0.5, high=4.0),
    *_unary("Exp"),
    *_unary("Log", low=0.01, high=20.0),
    *_unary("Tanh"),
    *_unary("Erf"),
    OpCase("Erf", [rand(5, 7, low=-6, high=6)], id="f32_wide"),
    *_unary("Neg"),
    OpCase("Neg", [_ints(5, 7)], id="i32"),
    OpCase("Neg", [_ints(3, 5, 2, dtype=np.int64)], id="i64"),
    *_unary("Abs"),
    OpCase("Abs", [_ints(5, 7, dtype=np.int8)], id="i8"),
    OpCase("Abs", [_ints(3, 5, dtype=np.int64)], id="i64"),
    # activations
    *_unary("Relu"),
    OpCase("Relu", [_ints(5, 7)], id="i32"),
    *_unary("LeakyRelu"),
    OpCase("LeakyRelu", [rand(5, 7)], {"alpha": 0.2}, id="alpha"),
    OpCase("LeakyRelu", [rand(3, 5, 7, dtype=F64)], {"alpha": 0.1}, id="alpha_f64"),
    # float16: the CPU kernel leaves it to the numpy forward, with the attribute as given
    OpCase("LeakyRelu", [rand(5, 7, dtype=F16)], {"alpha": 0.2}, id="f16", rtol=1e-3),
    *_unary("Sigmoid"),
    OpCase("Sigmoid", [rand(5, 7, low=-120, high=120)], id="f32_large"),
    OpCase("Sigmoid", [rand(5, 7, dtype=F64, low=-800, high=800)], id="f64_large"),
    *_unary("Gelu"),
    OpCase("Gelu", [rand(5, 7, low=-5, high=5)], {"approximate": "tanh"}, id="tanh"),
    OpCase("Gelu", [rand(3, 5, 7, dtype=F64)], {"approximate": "tanh"}, id="tanh_f64"),
    OpCase("Gelu", [rand(3, 5, 7, dtype=F64)], {"approximate": "none"}, id="none_f64"),
    # Clip: optional scalar bounds
    OpCase("Clip", [rand(5, 7), _scalar(-0.5), _scalar(0.7)], id="both"),
    OpCase("Clip", [rand(3, 5, 7), _scalar(-0.5)], id="min_only"),
    OpCase("Clip", [rand(3, 5, 7), None, _scalar(0.7)], id="max_only"),
    OpCase("Clip", [rand(5, 7)], id="no_bounds"),
    OpCase("Clip", [rand(5, 7), _scalar(1.0), _scalar(-1.0)], id="min_gt_max"),
    OpCase("Clip", [rand(5, 7, dtype=F64), _scalar(-1, F64), _scalar(1, F64)], id="f64"),
    OpCase("Clip", [_ints(5, 7), _scalar(-3, np.int32), _scalar(4, np.int32)], id="i32"),
    OpCase("Clip", [_ints(5, 7, dtype=np.int8), _scalar(-2, np.int8)], id="i8_min"),
    OpCase("Clip", [rand(5, 7), _scalar(-0.5), _scalar(0.7)], consts=(1, 2), id="const_bounds"),
    # Where
    OpCase("Where", [_bools(5, 7), rand(5, 7), rand(5, 7, seed=1)], id="same"),
    OpCase("Where", [_bools(5, 1, 4), rand(7, 4), _scalar(0.0)], id="bcast"),
    OpCase(
        "Where",
        [_bools(7), _ints(3, 5, 7, dtype=np.int64), _ints(5, 1, dtype=np.int64, seed=1)],
        id="i64",
    ),
    OpCase("Where", [_bools(3, 5), rand(3, 5, dtype=F64), rand(3, 5, dtype=F64)], id="f64"),
    # comparisons
    *_compare("Equal"),
    OpCase("Equal", [_bools(5, 7), _bools(7, seed=1)], id="bool"),
    *_compare("Less"),
    *_compare("Greater"),
    OpCase("Not", [_bools(5, 7)], id="2d"),
    OpCase("Not", [_bools(3, 5, 7)], id="3d"),
    # type changes
    OpCase("Identity", [rand(5, 7)], id="f32"),
    OpCase("Identity", [_ints(3, 5, 7, dtype=np.int64)], id="i64"),
    OpCase("Identity", [_bools(5, 3)], id="bool"),
    OpCase("Cast", [rand(5, 7, low=-9, high=9)], {"to": TensorProto.INT32}, id="f32_i32"),
    OpCase("Cast", [rand(5, 7)], {"to": TensorProto.DOUBLE}, id="f32_f64"),
    OpCase(
        "Cast", [rand(3, 5, 7, dtype=F64)], {"to": TensorProto.FLOAT16}, id="f64_f16", rtol=1e-3
    ),
    OpCase("Cast", [_ints(5, 7, dtype=np.int64)], {"to": TensorProto.FLOAT}, id="i64_f32"),
    OpCase("Cast", [rand(5, 7).round(0)], {"to": TensorProto.BOOL}, id="f32_bool"),
    OpCase("Cast", [_bools(5, 7)], {"to": TensorProto.FLOAT}, id="bool_f32"),
    OpCase("Cast", [_ints(5, 7, low=0, high=100)], {"to": TensorProto.UINT8}, id="i32_u8"),
    OpCase("Cast", [rand(5, 7)], {"to": TensorProto.INT64, "saturate": 0}, id="saturate0"),
    OpCase("Cast", [rand(5, 7)], {"to": TensorProto.FLOAT}, id="noop"),
    OpCase("CastLike", [rand(5, 7, low=-9, high=9), _scalar(0, np.int64)], id="f32_i64"),
    OpCase("CastLike", [rand(3, 5, 7, dtype=F64), rand(2)], id="f64_f32"),
    OpCase("CastLike", [_ints(5, 7), _scalar(0.0, F64)], consts=(1,), id="i32_f64_const"),
    OpCase("CastLike", [_bools(5, 7), rand(5, 7)], id="bool_f32"),
]


# ------------------------------------------------------------ gradients and backward ops


def _sigmoid(x):
    return 1 / (1 + np.exp(-x.astype(F64)))


def _ref_relu_grad(dy, x, alpha=0.0):
    return [
        np.array([d if v > 0 else alpha * d for d, v in zip(dy.flat, x.flat)], dy.dtype).reshape(
            dy.shape
        )
    ]


def _ref_gelu_grad(dy, x, approximate="none"):
    x64 = x.astype(F64)
    if approximate == "tanh":
        k = np.sqrt(2 / np.pi)
        t = np.tanh(k * (x64 + 0.044715 * x64**3))
        d = 0.5 * (1 + t) + 0.5 * x64 * (1 - t * t) * k * (1 + 3 * 0.044715 * x64**2)
    else:
        cdf = np.vectorize(lambda v: 0.5 * (1 + math.erf(v / math.sqrt(2))))(x64)
        d = cdf + x64 * np.exp(-x64 * x64 / 2) / np.sqrt(2 * np.pi)
    return [(dy.astype(F64) * d).astype(dy.dtype)]


def _ref_clip_grad(dy, x, lo=None, hi=None):
    keep = np.ones(x.shape, bool)
    if lo is not None:
        keep &= x >= lo
    if hi is not None:
        keep &= x <= hi
    return [np.where(keep, dy, np.zeros_like(dy))]


def _dfdl(op, inputs, reference, attrs=None, **kw):
    return OpCase(op, inputs, attrs or {}, domain="dfdl", reference=reference, **kw)


_x_ties = np.array([-1.5, 0.0, 0.5, -0.0, 2.0, -3.0, 0.0], F32)
_y_sig = _sigmoid(rand(5, 7, low=-6, high=6)).astype(F32)
_y_tanh = np.tanh(rand(3, 5, 7, dtype=F64))

CASES += [
    # Sign (the derivative of Abs)
    OpCase("Sign", [np.array([-2.5, 0.0, 3.0, -0.0, 1e-8], F32)], id="f32_zeros"),
    OpCase("Sign", [rand(3, 5, 7, dtype=F64)], id="f64_3d"),
    OpCase("Sign", [_ints(5, 7)], id="i32"),
    OpCase("Sign", [_ints(5, 7, dtype=np.uint8, low=0, high=3)], id="u8"),
    # more gradient coverage of forward ops
    OpCase("Pow", [rand(5, 7, low=0.1, high=3), _scalar(2.0)], id="f32_square_pos"),
    OpCase("Pow", [rand(5, 7), _scalar(2, np.int64)], consts=(1,), id="f32_const_i64"),
    OpCase(
        "Pow",
        [rand(3, 5, 7, dtype=F64), _ints(7, dtype=np.int64, low=-1, high=3, seed=4)],
        consts=(1,),
        id="f64_const_vec",
    ),
    OpCase("LeakyRelu", [rand(5, 7)], {"alpha": -0.3}, id="alpha_neg"),
    OpCase("Cast", [rand(3, 5, 7, dtype=F64)], {"to": TensorProto.DOUBLE}, id="f64_noop"),
    # dfdl backward ops
    _dfdl("ReluGrad", [rand(5, 7, seed=2), rand(5, 7)], _ref_relu_grad, id="f32"),
    _dfdl(
        "ReluGrad",
        [rand(3, 5, 7, dtype=F64, seed=2), rand(3, 5, 7, dtype=F64)],
        lambda dy, x: _ref_relu_grad(dy, x, 0.2),
        {"alpha": 0.2},
        id="f64_alpha",
    ),
    _dfdl(
        "ReluGrad",
        [rand(7, seed=3), _x_ties],
        lambda dy, x: _ref_relu_grad(dy, x, F32(0.1)),
        {"alpha": 0.1},
        id="ties",
    ),
    _dfdl("ReluGrad", [_scalar(0.5), _scalar(1.0)], _ref_relu_grad, id="0d"),
    _dfdl(
        "SigmoidGrad",
        [rand(5, 7, seed=2), _y_sig],
        lambda dy, y: [dy * y * (F32(1) - y)],
        id="f32",
    ),
    _dfdl(
        "SigmoidGrad",
        [rand(11, dtype=F64, seed=2), _sigmoid(rand(11, low=-9, high=9))],
        lambda dy, y: [dy * y * (1 - y)],
        id="f64",
    ),
    _dfdl(
        "TanhGrad",
        [rand(3, 5, 7, dtype=F64, seed=2), _y_tanh],
        lambda dy, y: [dy * (1 - y**2)],
        id="f64",
    ),
    _dfdl(
        "TanhGrad",
        [rand(5, 7, seed=2), np.tanh(rand(5, 7))],
        lambda dy, y: [dy * (F32(1) - y**2)],
        id="f32",
    ),
    _dfdl("GeluGrad", [rand(5, 7, seed=2), rand(5, 7, low=-6, high=6)], _ref_gelu_grad, id="f32"),
    _dfdl(
        "GeluGrad",
        [rand(3, 5, 7, dtype=F64, seed=2), rand(3, 5, 7, dtype=F64, low=-6, high=6)],
        _ref_gelu_grad,
        id="f64",
        rtol=1e-9,
        atol=1e-12,
    ),
    _dfdl(
        "GeluGrad",
        [rand(5, 7, seed=2), rand(5, 7, low=-6, high=6)],
        lambda dy, x: _ref_gelu_grad(dy, x, "tanh"),
        {"approximate": "tanh"},
        id="tanh",
    ),
    _dfdl(
        "GeluGrad",
        [rand(3, 5, 7, dtype=F64, seed=2), rand(3, 5, 7, dtype=F64, low=-6, high=6)],
        lambda dy, x: _ref_gelu_grad(dy, x, "tanh"),
        {"approximate": "tanh"},
        id="tanh_f64",
        rtol=1e-9,
        atol=1e-12,
    ),
    _dfdl(
        "GeluGrad",
        [rand(5, 7, dtype=F16, seed=2), rand(5, 7, dtype=F16)],
        _ref_gelu_grad,
        id="f16",
        rtol=2e-3,
        atol=2e-3,
    ),
    _dfdl(
        "ClipGrad",
        [rand(5, 7, seed=2), rand(5, 7).round(1), _scalar(-0.5), _scalar(0.7)],
        _ref_clip_grad,
        id="both",
    ),
    _dfdl(
        "ClipGrad",
        [rand(3, 5, 7, seed=2), rand(3, 5, 7).round(1), _scalar(-0.5)],
        _ref_clip_grad,
        id="min_only",
    ),
    _dfdl(
        "ClipGrad",
        [rand(3, 5, 7, seed=2), rand(3, 5, 7), None, _scalar(0.7)],
        _ref_clip_grad,
        id="max_only",
    ),
    _dfdl("ClipGrad", [rand(5, 7, seed=2), rand(5, 7)], _ref_clip_grad, id="no_bounds"),
    _dfdl(
        "ClipGrad",
        [rand(5, 7, seed=2), rand(5, 7), _scalar(1.0), _scalar(-1.0)],
        _ref_clip_grad,
        id="min_gt_max",
    ),
    _dfdl(
        "ClipGrad",
        [rand(5, 7, dtype=F64, seed=2), rand(5, 7, dtype=F64), _scalar(-1, F64), _scalar(1, F64)],
        _ref_clip_grad,
        id="f64",
    ),
    _dfdl(
        "ClipGrad",  # float16: the CPU kernel leaves it to the numpy forward
        [
            rand(5, 7, dtype=F16, seed=2),
            rand(5, 7, dtype=F16).round(1),
            _scalar(-0.5, F16),
            _scalar(0.7, F16),
        ],
        _ref_clip_grad,
        id="f16",
    ),
]

# Cases whose gradient finite differences cannot check (kept for the forward tests):
_NO_GRAD = {
    "Div-f32_by_zero",  # dividing by 0: inf/NaN gradients
    "Pow-f32_square",  # negative bases: the exponent's gradient x**y * log(x) is NaN
    "Cast-f64_f16",  # float16 output: differences of a rounded function are meaningless
    "Cast-noop",  # idem: the float64-perturbed input is rounded to float32 (f64_noop checks)
    "CastLike-bool_f32",  # the only float input is target_type, which carries no gradient
    "CastLike-i32_f64_const",  # idem
}
for _c in CASES:
    if _c.name() in _NO_GRAD:
        _c.no_grad = True


# ------------------------------------------ issue 38: activations, rounding, logic, variadic

_SPECIALS = [-np.inf, -3.5, -2.5, -1.5, -0.5, -0.0, 0.0, 0.5, 1.5, 2.5, 1e-8, np.inf, np.nan]


def _specials(dtype=F32):
    return np.array(_SPECIALS, dtype)


def _signed(*shape, dtype=F32, low=0.5, high=3.0, seed=0):
    """Values of magnitude in [low, high) with random signs (divisors away from 0)."""
    x = rand(*shape, dtype=dtype, low=low, high=high, seed=seed)
    return np.where(rand(*shape, seed=seed + 5) < 0, -x, x).astype(dtype)


def _f16(op, low=-3.0, high=3.0, attrs=None, **kw):
    return OpCase(op, [rand(5, 7, dtype=F16, low=low, high=high)], attrs or {}, id="f16", **kw)


def _logic(op: str) -> list[OpCase]:
    return [
        OpCase(op, [_bools(5, 7), _bools(5, 7, seed=1)], id="same"),
        OpCase(op, [_bools(3, 5, 7), _bools(7, seed=2)], id="bcast"),
        OpCase(op, [_bools(5, 1), _bools(1, 7, seed=3)], id="bcast_both"),
        OpCase(op, [_bools(5, 7), np.array(True)], id="scalar"),
    ]


def _variadic(op: str, kinds: str) -> list[OpCase]:
    """One, two, three and four inputs, broadcast every way, per dtype."""
    cases = [
        OpCase(op, [rand(5, 7)], id="one"),
        OpCase(op, [rand(5, 7), rand(5, 7, seed=1)], id="two"),
        OpCase(op, [rand(3, 5, 7), rand(5, 1, seed=1), rand(7, seed=2)], id="three_bcast"),
        OpCase(op, [rand(4, 1, dtype=F64), rand(3, 1, 6, dtype=F64, seed=1)], id="f64_bcast_both"),
        OpCase(
            op,
            [rand(3, 4, dtype=F16, seed=s) for s in range(4)],
            id="f16_four",
            rtol=1e-3,
            atol=1e-3,
        ),
        OpCase(op, [rand(5, 7), rand(5, 7, seed=1)], consts=(1,), id="const"),
    ]
    if op == "Mean":  # the ReferenceEvaluator's Mean cannot broadcast into its first input
        for c in cases:
            c.reference = _mean_ref
    if "i" in kinds:
        cases += [
            OpCase(op, [_ints(5, 7), _ints(7, seed=1), _ints(5, 1, seed=2)], id="i32"),
            OpCase(
                op, [_ints(3, 5, dtype=np.int64), _ints(3, 5, dtype=np.int64, seed=1)], id="i64"
            ),
            OpCase(
                op,
                [_ints(5, 7, dtype=np.uint8, low=0, high=200), _ints(7, dtype=np.uint8, high=200)],
                id="u8",
            ),
            OpCase(op, [_ints(5, dtype=np.int8), _ints(5, dtype=np.int8, seed=1)], id="i8"),
        ]
    return cases


def _mean_ref(*xs):
    total = xs[0].astype(F64)
    for x in xs[1:]:
        total = total + x
    return [(total / len(xs)).astype(xs[0].dtype)]


# ties: one value appears in several inputs at a position (the forward is exact there; the
# gradient's split of ties is checked against torch in tests/ops/cpu/test_elementwise.py)
_tie_a = np.array([[1.0, 2.0, -1.0], [0.0, 5.0, 3.0]], F32)
_tie_b = np.array([[1.0, 0.5, -1.0], [0.0, 5.0, 4.0]], F32)
_tie_c = np.array([1.0, 2.0, -1.0], F32)

CASES += [
    # rounding: float only; halves, signed zeros, infinities and NaN come back as the spec says
    *_unary("Floor", low=-5, high=5),
    OpCase("Floor", [_specials()], id="specials"),
    _f16("Floor", low=-9, high=9),
    *_unary("Ceil", low=-5, high=5),
    OpCase("Ceil", [_specials(F64)], id="specials_f64"),
    _f16("Ceil", low=-9, high=9),
    *_unary("Round", low=-5, high=5),
    OpCase("Round", [_specials()], id="halves_to_even"),
    OpCase("Round", [_specials(F16)], id="f16_halves"),
    OpCase("Round", [rand(3, 5, 7, dtype=F64, low=-4, high=4).round(1)], id="f64_tenths"),
    # comparisons and logic
    *_compare("LessOrEqual"),
    OpCase("LessOrEqual", [_ints(5, 7, dtype=np.uint8, high=5), _ints(7, dtype=np.uint8)], id="u8"),
    OpCase("LessOrEqual", [_specials(F16), _specials(F16)[::-1].copy()], id="f16_specials"),
    *_compare("GreaterOrEqual"),
    OpCase("GreaterOrEqual", [_ints(5, 7, dtype=np.int16), _ints(5, 1, dtype=np.int16)], id="i16"),
    OpCase("GreaterOrEqual", [_specials(), _specials()[::-1].copy()], id="specials"),
    OpCase("IsNaN", [_specials()], id="specials"),
    OpCase("IsNaN", [_specials(F16)], id="f16"),
    OpCase("IsNaN", [np.where(_bools(3, 5, 7), rand(3, 5, 7, dtype=F64), np.nan)], id="f64_3d"),
    OpCase("IsInf", [_specials()], id="specials"),
    OpCase("IsInf", [_specials(F16)], id="f16"),
    OpCase("IsInf", [_specials(F64)], {"detect_negative": 0}, id="positive_only"),
    OpCase("IsInf", [_specials()], {"detect_positive": 0}, id="negative_only"),
    OpCase("IsInf", [_specials()], {"detect_positive": 0, "detect_negative": 0}, id="neither"),
    *_logic("And"),
    *_logic("Or"),
    *_logic("Xor"),
    # Mod: Python's sign rule (of B) by default, C's (of A) with fmod=1
    OpCase("Mod", [_ints(5, 7, low=-20, high=21), _ints(5, 7, nonzero=True, seed=1)], id="i32"),
    OpCase(
        "Mod",
        [_ints(3, 5, dtype=np.int64, low=-20, high=21), _ints(5, dtype=np.int64, nonzero=True)],
        {"fmod": 1},
        id="i64_fmod_bcast",
    ),
    OpCase(
        "Mod",
        [_ints(5, 7, dtype=np.int8, low=-100, high=100), _scalar(-7, np.int8)],
        id="i8_negative_divisor",
    ),
    OpCase(
        "Mod",
        [_ints(5, 7, dtype=np.uint8, low=0, high=250), _ints(5, 7, dtype=np.uint8, low=1, high=9)],
        id="u8",
    ),
    OpCase("Mod", [_ints(5, 7), _scalar(0, np.int32)], id="i32_by_zero"),
    OpCase("Mod", [rand(5, 7, low=-6, high=6), _signed(5, 7, seed=1)], id="f32"),
    OpCase("Mod", [rand(5, 7, low=-6, high=6), _signed(5, 7, seed=1)], {"fmod": 1}, id="f32_fmod"),
    OpCase(
        "Mod",
        [rand(3, 5, 7, dtype=F64, low=-6, high=6), _signed(5, 1, dtype=F64, seed=2)],
        id="f64_bcast",
    ),
    OpCase(
        "Mod",
        [rand(3, 5, 7, dtype=F64, low=-6, high=6), _signed(7, dtype=F64, seed=3)],
        {"fmod": 1},
        id="f64_fmod_bcast",
    ),
    OpCase(
        "Mod",
        [rand(5, 7, dtype=F16, low=-6, high=6), _signed(5, 7, dtype=F16, seed=1)],
        id="f16",
        rtol=1e-3,
        atol=1e-3,
    ),
    OpCase("Mod", [_specials(), np.array(_SPECIALS[::-1], F32)], id="specials"),
    OpCase("Mod", [_specials(), np.array(_SPECIALS[::-1], F32)], {"fmod": 1}, id="specials_fmod"),
    # variadic
    *_variadic("Sum", "f"),
    *_variadic("Mean", "f"),
    OpCase(
        "Mean",
        [rand(7, seed=3), rand(3, 5, 7), rand(5, 1, seed=1)],
        id="first_smallest",
        reference=_mean_ref,
    ),
    *_variadic("Max", "fi"),
    OpCase("Max", [_tie_a, _tie_b, _tie_c], id="ties"),
    OpCase("Max", [_specials(), _specials()[::-1].copy()], id="nan"),
    *_variadic("Min", "fi"),
    OpCase("Min", [_tie_a, _tie_b, _tie_c], id="ties"),
    # activations
    *_unary("Softplus"),
    OpCase("Softplus", [rand(5, 7, low=-100, high=100)], id="f32_large"),
    _f16("Softplus", rtol=1e-3, atol=1e-3),
    # (the ReferenceEvaluator's Softsign fails on 0-d inputs)
    *_unary("Softsign", reference=lambda x: [(x / (1 + np.abs(x))).astype(x.dtype)]),
    _f16("Softsign", rtol=1e-3, atol=1e-3),
    *_unary("Mish"),
    OpCase("Mish", [rand(5, 7, low=-30, high=30)], id="f32_wide"),
    _f16("Mish", rtol=1e-3, atol=1e-3),
    *_unary("HardSwish", low=-5, high=5),
    OpCase("HardSwish", [_specials()], id="specials"),
    OpCase("HardSwish", [np.array([-3.0, 3.0, -3.0001, 2.9999], F32)], id="kinks"),
    _f16("HardSwish", low=-5, high=5, rtol=1e-3, atol=1e-3),
    *_unary("HardSigmoid", low=-4, high=4),
    OpCase(
        "HardSigmoid",
        [rand(5, 7, low=-4, high=4)],
        {"alpha": 1 / 6, "beta": 0.5},
        id="torch_attrs",
    ),
    OpCase(
        "HardSigmoid",
        [rand(3, 5, 7, dtype=F64, low=-2, high=2)],
        {"alpha": 0.5, "beta": 0.6},
        id="f64_attrs",
    ),
    OpCase("HardSigmoid", [_specials()], id="specials"),
    _f16("HardSigmoid", rtol=1e-3, atol=1e-3),
    *_unary("Elu"),
    OpCase("Elu", [rand(5, 7, low=-3, high=3)], {"alpha": 0.5}, id="alpha"),
    OpCase("Elu", [rand(5, 7, low=-100, high=100)], id="f32_large"),
    _f16("Elu", attrs={"alpha": 2.0}, rtol=1e-3, atol=1e-3),
    *_unary("Selu"),
    OpCase("Selu", [rand(3, 5, 7, dtype=F64)], {"alpha": 2.0, "gamma": 3.0}, id="f64_attrs"),
    _f16("Selu", rtol=1e-3, atol=1e-3),
    *_unary("Celu"),
    OpCase("Celu", [rand(5, 7)], {"alpha": 2.0}, id="alpha"),
    OpCase("Celu", [rand(3, 5, 7, dtype=F64)], {"alpha": 0.5}, id="f64_alpha"),
    _f16("Celu", rtol=1e-3, atol=1e-3),
    *_unary("ThresholdedRelu"),
    OpCase("ThresholdedRelu", [rand(5, 7)], {"alpha": -0.5}, id="alpha_negative"),
    OpCase("ThresholdedRelu", [rand(3, 5, 7, dtype=F64)], {"alpha": 0.0}, id="f64_alpha0"),
    _f16("ThresholdedRelu", attrs={"alpha": 0.5}),
    *_unary("Shrink"),
    OpCase("Shrink", [rand(5, 7)], {"bias": 0.25, "lambd": 0.3}, id="soft"),
    OpCase("Shrink", [rand(3, 5, 7, dtype=F64)], {"bias": 0.0, "lambd": 1.0}, id="f64_hard"),
    # PRelu: the slope broadcasts to X (unidirectionally)
    OpCase("PRelu", [rand(2, 3, 4, 5), rand(3, 1, 1, seed=1, low=0, high=0.5)], id="channel"),
    OpCase("PRelu", [rand(5, 7), rand(5, 7, seed=1)], id="same"),
    OpCase("PRelu", [rand(3, 5, 7, dtype=F64), rand(7, dtype=F64, seed=1)], id="f64_last"),
    OpCase("PRelu", [rand(5, 7), _scalar(0.25)], id="scalar"),
    OpCase("PRelu", [rand(5, 7), rand(5, 7, seed=1)], consts=(1,), id="const_slope"),
    OpCase("PRelu", [rand(5, 7, dtype=F16), rand(7, dtype=F16, seed=1)], id="f16", rtol=1e-3),
    OpCase("PRelu", [_ints(5, 7), _ints(5, 1, seed=1)], id="i32"),
    OpCase("PRelu", [_ints(3, 5, dtype=np.int64), _ints(5, dtype=np.int64, seed=1)], id="i64"),
    OpCase(
        "PRelu",
        [_ints(5, 7, dtype=np.uint32, low=0, high=9), _ints(7, dtype=np.uint32, low=0, high=3)],
        id="u32",
    ),
]


# ------------------------------------------------------- the new fused gradients (dfdl.*)


def _ref_hard_swish_grad(dy, x):
    x64, dy64 = x.astype(F64), dy.astype(F64)
    d = np.where(x64 <= -3, 0.0, np.where(x64 < 3, x64 / 3 + 0.5, 1.0))
    return [(dy64 * d).astype(dy.dtype)]


def _ref_hard_sigmoid_grad(dy, x, alpha=0.2, beta=0.5):
    t = x.dtype.type
    v = x * t(alpha) + t(beta)  # the kinks are decided in X's dtype, as the op does
    return [np.where((v > 0) & (v < 1), dy.astype(F64) * t(alpha), 0.0).astype(dy.dtype)]


def _ref_elu_grad(dy, x, alpha=1.0, scale=1.0, input_scale=1.0):
    x64 = x.astype(F64)
    d = np.where(x64 > 0, scale, scale * alpha * input_scale * np.exp(x64 * input_scale))
    return [(dy.astype(F64) * d).astype(dy.dtype)]


def _ref_mish_grad(dy, x):
    x64 = x.astype(F64)
    t = np.tanh(np.log1p(np.exp(x64)))
    s = 1 / (1 + np.exp(-x64))
    return [(dy.astype(F64) * (t + x64 * s * (1 - t * t))).astype(dy.dtype)]


_x_kinks = np.array([-3.0, 3.0, -3.0001, 2.9999, 0.0, -5.0, 5.0, np.nan], F32)

CASES += [
    _dfdl(
        "HardSwishGrad",
        [rand(5, 7, seed=2), rand(5, 7, low=-5, high=5)],
        _ref_hard_swish_grad,
        id="f32",
    ),
    _dfdl("HardSwishGrad", [rand(8, seed=3), _x_kinks], _ref_hard_swish_grad, id="kinks"),
    _dfdl(
        "HardSwishGrad",
        [rand(3, 5, 7, dtype=F64, seed=2), rand(3, 5, 7, dtype=F64, low=-5, high=5)],
        _ref_hard_swish_grad,
        id="f64",
    ),
    _dfdl(
        "HardSwishGrad",
        [rand(5, 7, dtype=F16, seed=2), rand(5, 7, dtype=F16, low=-5, high=5)],
        _ref_hard_swish_grad,
        id="f16",
        rtol=1e-3,
        atol=1e-3,
    ),
    _dfdl(
        "HardSigmoidGrad",
        [rand(5, 7, seed=2), rand(5, 7, low=-4, high=4)],
        _ref_hard_sigmoid_grad,
        id="f32",
    ),
    _dfdl(
        "HardSigmoidGrad",
        [rand(8, seed=3), _x_kinks],
        lambda dy, x: _ref_hard_sigmoid_grad(dy, x, 1 / 6, 0.5),
        {"alpha": 1 / 6, "beta": 0.5},
        id="torch_kinks",
    ),
    _dfdl(
        "HardSigmoidGrad",
        [rand(3, 5, 7, dtype=F64, seed=2), rand(3, 5, 7, dtype=F64)],
        lambda dy, x: _ref_hard_sigmoid_grad(dy, x, 0.5, 0.6),
        {"alpha": 0.5, "beta": 0.6},
        id="f64_attrs",
    ),
    _dfdl(
        "HardSigmoidGrad",
        [rand(5, 7, dtype=F16, seed=2), rand(5, 7, dtype=F16, low=-4, high=4)],
        _ref_hard_sigmoid_grad,
        id="f16",
        rtol=1e-3,
        atol=1e-3,
    ),
    _dfdl("EluGrad", [rand(5, 7, seed=2), rand(5, 7, low=-4, high=4)], _ref_elu_grad, id="f32"),
    _dfdl(
        "EluGrad",
        [rand(3, 5, 7, dtype=F64, seed=2), rand(3, 5, 7, dtype=F64, low=-4, high=4)],
        lambda dy, x: _ref_elu_grad(dy, x, 1.6732632, 1.050701),
        {"alpha": 1.6732632, "scale": 1.050701},
        id="f64_selu",
        rtol=1e-9,
    ),
    _dfdl(
        "EluGrad",
        [rand(5, 7, seed=2), rand(5, 7, low=-4, high=4)],
        lambda dy, x: _ref_elu_grad(dy, x, 2.0, 1.0, 0.5),
        {"alpha": 2.0, "input_scale": 0.5},
        id="celu",
    ),
    _dfdl(
        "EluGrad",
        [rand(5, 7, dtype=F16, seed=2), rand(5, 7, dtype=F16, low=-4, high=4)],
        _ref_elu_grad,
        id="f16",
        rtol=1e-3,
        atol=1e-3,
    ),
    _dfdl("MishGrad", [rand(5, 7, seed=2), rand(5, 7, low=-6, high=6)], _ref_mish_grad, id="f32"),
    _dfdl(
        "MishGrad",
        [rand(3, 5, 7, dtype=F64, seed=2), rand(3, 5, 7, dtype=F64, low=-6, high=6)],
        _ref_mish_grad,
        id="f64",
        rtol=1e-9,
    ),
    _dfdl(
        "MishGrad",
        [rand(5, 7, dtype=F16, seed=2), rand(5, 7, dtype=F16, low=-6, high=6)],
        _ref_mish_grad,
        id="f16",
        rtol=1e-3,
        atol=1e-3,
    ),
]

# forward-only cases of the new ops (finite differences cannot check them)
_NO_GRAD_38 = {
    "Max-ties",  # ties: max is not differentiable there (the split is checked against torch)
    "Min-ties",
    "Max-nan",  # NaN and infinities
    "Mod-specials",
    "Mod-specials_fmod",
    "HardSwish-specials",
    "HardSwish-kinks",  # kinks: one-sided derivatives differ
    "HardSigmoid-specials",
}
for _c in CASES:
    if _c.name() in _NO_GRAD_38:
        _c.no_grad = True
