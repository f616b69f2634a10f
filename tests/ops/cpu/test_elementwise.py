"""The elementwise CPU kernels (dfdl.ops.cpu.elementwise): which tiles they take, the
parameters their ops resolve for them, and the float32 GELU kernels (dfdl.ops.cpu.gelu_f32,
vectorizable exp/erfc) against a float64 libm reference over the whole float32 range,
across chunk boundaries, and on the special values where the float64 kernels define the
expected result. Kernels are called as tasks call them: ``REGISTRY[key].kernel("cpu")``.
Also the elementwise gradient rules against torch where a finite difference cannot
decide (kinks, ties), and the shape rules' refusals."""

from __future__ import annotations

import math
import pickle

import numba
import numpy as np
import pytest

from dfdl.errors import ShapeError, UnsupportedOpError
from dfdl.ir.bind import bind
from dfdl.ir.onnx_io import to_ir
from dfdl.ops import REGISTRY
from dfdl.ops.cpu import elementwise as E
from dfdl.ops.cpu import gelu_f32
from dfdl.ops.registry import TensorType
from dfdl.training.autodiff import gradients
from tests.ops.case import OpCase

_gelu = REGISTRY["Gelu"].kernel("cpu")
_gelu_grad = REGISTRY["dfdl.GeluGrad"].kernel("cpu")

_SPECIALS = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0, 1e30, -1e30]
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _ref_gelu(x):
    x = x.astype(np.float64)
    return 0.5 * x * _erfc(-x / math.sqrt(2))


def _ref_gelu_grad(dy, x):
    x = x.astype(np.float64)
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return dy.astype(np.float64) * (0.5 * _erfc(-x / math.sqrt(2)) + x * pdf)


def _grid(n=40_001):
    return np.linspace(-30, 30, n).astype(np.float32)


def test_gelu_f32_matches_float64_reference():
    x = _grid()
    np.testing.assert_allclose(_gelu(x), _ref_gelu(x), rtol=2e-6, atol=5e-7)


def test_gelu_grad_f32_matches_float64_reference():
    x = _grid()
    dy = np.random.default_rng(0).uniform(-3, 3, x.size).astype(np.float32)
    # float32 cancellation of Phi(x) + x phi(x) near x = -0.75 bounds the absolute error
    np.testing.assert_allclose(_gelu_grad(dy, x), _ref_gelu_grad(dy, x), rtol=2e-6, atol=1e-6)


def test_f32_kernels_are_the_ones_dispatched():
    x = _grid(1001)
    dy = np.ones_like(x)
    out = np.empty_like(x)
    gelu_f32.gelu_grad(dy, x, out)
    np.testing.assert_array_equal(_gelu_grad(dy, x), out)
    gelu_f32.gelu(x, out)
    np.testing.assert_array_equal(_gelu(x), out)


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 511, 512, 513, 1543])
def test_vector_boundaries(n):
    rng = np.random.default_rng(n)
    x = rng.normal(0, 3, (n,)).astype(np.float32)
    dy = rng.normal(0, 1, (n,)).astype(np.float32)
    np.testing.assert_allclose(_gelu(x), _ref_gelu(x), rtol=2e-6, atol=5e-7)
    np.testing.assert_allclose(_gelu_grad(dy, x), _ref_gelu_grad(dy, x), rtol=2e-6, atol=1e-6)


def test_a_value_does_not_depend_on_its_position():
    # a tile's values must not change with where it starts: the vector loop and its
    # remainder compute the same bits
    x = np.random.default_rng(5).normal(0, 4, (1000,)).astype(np.float32)
    dy = np.ones_like(x)
    for start in (1, 3, 17):
        part = x[start:].copy()
        np.testing.assert_array_equal(_gelu(part), _gelu(x)[start:])
        np.testing.assert_array_equal(_gelu_grad(dy[start:], part), _gelu_grad(dy, x)[start:])


def test_float_from_bits_reinterprets_an_int32():
    bits = np.array([0x3F800000, 0x40490FDB, 0x00000001, -0x40800000], np.int64)
    got = _from_bits(bits)
    np.testing.assert_array_equal(got, bits.astype(np.int32).view(np.float32))


@numba.njit
def _from_bits(bits):
    out = np.empty(bits.size, np.float32)
    for i in range(bits.size):
        out[i] = gelu_f32.float_from_bits(bits[i])
    return out


def test_special_values_match_the_float64_kernels():
    x = np.array(_SPECIALS, np.float32)
    ones = np.ones_like(x)
    np.testing.assert_array_equal(_gelu(x), _gelu(x.astype(np.float64)).astype(np.float32))
    np.testing.assert_array_equal(
        _gelu_grad(ones, x),
        _gelu_grad(ones.astype(np.float64), x.astype(np.float64)).astype(np.float32),
    )


def test_far_tail_is_exactly_zero():
    x = np.array([-14.0, -20.0, -1e10], np.float32)
    assert np.all(_gelu(x) == 0)
    assert np.all(_gelu_grad(np.ones_like(x), x) == 0)


# ------------------------------------------------------------------ registration, accepts

_KERNELS = {
    "Add": E.add,
    "Sub": E.sub,
    "Mul": E.mul,
    "Div": E.div,
    "Relu": E.relu,
    "LeakyRelu": E.leaky_relu,
    "Sigmoid": E.sigmoid,
    "Gelu": E.gelu,
    "Erf": E.erf,
    "Sqrt": E.sqrt,
    "dfdl.ReluGrad": E.relu_grad,
    "dfdl.SigmoidGrad": E.sigmoid_grad,
    "dfdl.TanhGrad": E.tanh_grad,
    "dfdl.GeluGrad": E.gelu_grad,
    "dfdl.ClipGrad": E.clip_grad,
    "HardSwish": E.hard_swish,
    "HardSigmoid": E.hard_sigmoid,
    "dfdl.HardSwishGrad": E.hard_swish_grad,
    "dfdl.HardSigmoidGrad": E.hard_sigmoid_grad,
}


@pytest.mark.parametrize("key", sorted(_KERNELS))
def test_kernels_register_themselves(key):
    assert REGISTRY[key].kernels["cpu"].fn is _KERNELS[key]


@pytest.mark.parametrize("key", ["Exp", "Log", "Tanh"])
def test_numpy_ufuncs_keep_no_kernel(key):
    # numpy's SIMD ufuncs beat a numba loop over libm calls (see the module docstring)
    assert "cpu" not in REGISTRY[key].kernels
    assert REGISTRY[key].kernel("cpu") is REGISTRY[key].forward


_F32 = np.ones((3, 4), np.float32)
_F64 = np.ones((3, 4), np.float64)


@pytest.mark.parametrize(
    "key, inputs, attrs, taken",
    [
        ("Relu", [_F32], {}, True),
        ("Relu", [_F64], {}, True),
        ("Relu", [_F32.astype(np.float16)], {}, False),
        ("Relu", [_F32.astype(np.int32)], {}, False),
        ("LeakyRelu", [_F64], {"alpha": 0.2}, True),
        ("LeakyRelu", [_F32.astype(np.float16)], {"alpha": 0.2}, False),
        ("Add", [_F32, _F32], {}, True),
        ("Add", [_F32, _F32[:1]], {}, False),  # broadcasting
        ("Add", [_F32, _F64], {}, False),
        ("Add", [_F32.astype(np.int64), _F32.astype(np.int64)], {}, False),
        ("Div", [_F64, _F64], {}, True),
        ("Div", [_F32.astype(np.int32), _F32.astype(np.int32)], {}, False),
        ("Gelu", [_F32], {}, True),
        ("Gelu", [_F32], {"approximate": "tanh"}, True),
        ("Gelu", [_F32], {"approximate": "cubic"}, False),
        ("Gelu", [_F32.astype(np.float16)], {}, False),
        ("dfdl.GeluGrad", [_F32, _F32], {"approximate": "tanh"}, True),
        ("dfdl.GeluGrad", [_F32, _F32], {"approximate": "cubic"}, False),
        ("dfdl.GeluGrad", [_F32, _F64], {}, False),
        ("dfdl.ReluGrad", [_F32, _F32], {"alpha": 0.1}, True),
        ("dfdl.ReluGrad", [_F32, _F32[:1]], {}, False),
        ("dfdl.ClipGrad", [_F64, _F64, np.array(-1.0), np.array(1.0)], {}, True),
        ("dfdl.ClipGrad", [_F64, _F64, None, np.array(1.0)], {}, True),
        ("dfdl.ClipGrad", [_F32.astype(np.float16)] * 2, {}, False),
        ("HardSwish", [_F32], {}, True),
        ("HardSwish", [_F32.astype(np.float16)], {}, False),
        ("HardSigmoid", [_F64], {"alpha": 0.25, "beta": 0.4}, True),
        ("HardSigmoid", [_F32.astype(np.float16)], {}, False),
        ("dfdl.HardSwishGrad", [_F32, _F32], {}, True),
        ("dfdl.HardSwishGrad", [_F32, _F64], {}, False),
        ("dfdl.HardSigmoidGrad", [_F64, _F64], {"alpha": 1 / 6}, True),
        ("dfdl.HardSigmoidGrad", [_F32.astype(np.float16)] * 2, {}, False),
    ],
)
def test_accepts_exactly_the_kernels_tiles(key, inputs, attrs, taken):
    """Tiles a kernel does not take (integers, float16, broadcasting or mixed operands,
    unknown attributes) go to the numpy forward: same result, or the forward's error."""
    op = REGISTRY[key]
    assert op.kernels["cpu"].accepts(*inputs, **attrs) is taken
    try:
        want = op.forward(*inputs, **attrs)
    except UnsupportedOpError:
        with pytest.raises(UnsupportedOpError):
            op.kernel("cpu")(*inputs, **attrs)
        return
    np.testing.assert_allclose(op.kernel("cpu")(*inputs, **attrs), want, rtol=1e-6)


# ------------------------------------------------------------------------ params rules


def test_params_resolve_the_attribute_defaults():
    x = np.ones(3, np.float32)
    assert REGISTRY["LeakyRelu"].params(x) == {"alpha": 0.01}
    assert REGISTRY["dfdl.ReluGrad"].params(x, x) == {"alpha": 0.0}
    assert REGISTRY["Gelu"].params(x) == {"tanh": False}
    assert REGISTRY["dfdl.GeluGrad"].params(x, x, approximate="tanh") == {"tanh": True}
    assert REGISTRY["dfdl.ClipGrad"].params(x, x) == {"lo": -math.inf, "hi": math.inf}
    assert REGISTRY["HardSigmoid"].params(x) == {"alpha": 0.2, "beta": 0.5}
    assert REGISTRY["dfdl.HardSigmoidGrad"].params(x, x, beta=0.25) == {"alpha": 0.2, "beta": 0.25}
    lo = REGISTRY["dfdl.ClipGrad"].params(x, x, np.array([-0.25], np.float32))["lo"]
    assert lo == -0.25 and type(lo) is float  # a Python float: no float64 promotion


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernels_with_params_match_their_forwards_bit_for_bit(dtype):
    rng = np.random.default_rng(3)
    x = rng.normal(0, 2, (5, 7)).round(1).astype(dtype)  # ties with the bounds and 0
    dy = rng.normal(0, 1, (5, 7)).astype(dtype)
    lo, hi = np.array(-0.5, dtype), np.array(0.7, dtype)
    np.testing.assert_array_equal(
        E.leaky_relu(x, alpha=0.3), REGISTRY["LeakyRelu"].forward(x, alpha=0.3)
    )
    np.testing.assert_array_equal(
        E.relu_grad(dy, x, alpha=0.1), REGISTRY["dfdl.ReluGrad"].forward(dy, x, alpha=0.1)
    )
    np.testing.assert_array_equal(
        E.clip_grad(dy, x, lo, hi, lo=-0.5, hi=0.7),
        REGISTRY["dfdl.ClipGrad"].forward(dy, x, lo, hi),
    )
    np.testing.assert_array_equal(
        E.clip_grad(dy, x, None, hi, lo=-math.inf, hi=0.7),
        REGISTRY["dfdl.ClipGrad"].forward(dy, x, None, hi),
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_hard_swish_and_hard_sigmoid_kernels_match_their_forwards_bit_for_bit(dtype):
    # the kinks, their neighbours, signed zeros, infinities and NaN, then a dense grid
    kinks = [-3.0, 3.0, -2.5, 2.5, -0.0, 0.0, np.inf, -np.inf, np.nan]
    x = np.concatenate([kinks, np.nextafter(np.array([-3.0, 3.0]), 0)]).astype(dtype)
    x = np.concatenate([x, np.linspace(-7, 7, 20_001, dtype=dtype)])
    dy = np.random.default_rng(4).normal(0, 1, x.shape).astype(dtype)
    for key, attrs in [("HardSwish", {}), ("HardSigmoid", {}), ("HardSigmoid", {"alpha": 1 / 6})]:
        op = REGISTRY[key]
        np.testing.assert_array_equal(op.kernel("cpu")(x, **attrs), op.forward(x, **attrs))
    for key, attrs in [("dfdl.HardSwishGrad", {}), ("dfdl.HardSigmoidGrad", {"beta": 0.25})]:
        op = REGISTRY[key]
        np.testing.assert_array_equal(op.kernel("cpu")(dy, x, **attrs), op.forward(dy, x, **attrs))


def test_a_dispatch_pickles_by_reference():
    # tasks carry the tile function to the workers: the table op's forward goes by name
    d = REGISTRY["Add"].kernel("cpu")
    back = pickle.loads(pickle.dumps(d))
    assert back.forward is REGISTRY["Add"].forward and back.kernel is E.add
    assert len(pickle.dumps(REGISTRY["Exp"].forward)) < 200


# --------------------------------------------- gradient rules against torch, kinks and ties


def _dfdl_grads(op: str, inputs: list, attrs: dict, dy: np.ndarray) -> list[np.ndarray]:
    """The gradient of every input of ``op`` for the output gradient ``dy``, from dfdl's VJP
    rule: the backward graph is evaluated node by node with the numpy forwards."""
    case = OpCase(op, inputs, attrs)
    g = bind(
        to_ir(case.model()), {k: TensorType(v.shape, v.dtype) for k, v in case.feeds().items()}
    )
    g.initializers["seed"] = dy
    g.types["seed"] = TensorType(dy.shape, dy.dtype)
    names = case.input_names()
    grads = gradients(g, g.outputs[0], names, seed="seed")
    values = {**case.feeds(), **g.initializers}
    for node in g.nodes:
        ins = [values[i] if i else None for i in node.inputs]
        out = REGISTRY[f"{node.domain}.{node.op_type}" if node.domain else node.op_type].forward(
            *ins, **node.attrs
        )
        values[node.outputs[0]] = out
    return [values[grads[n]] for n in names]


def _torch_grads(fn, inputs: list, dy: np.ndarray) -> list[np.ndarray]:
    torch = pytest.importorskip("torch")
    ts = [torch.tensor(x, requires_grad=True) for x in inputs]
    fn(*ts).backward(torch.tensor(dy))
    return [t.grad.numpy() for t in ts]


_TIES = [
    np.array([[1.0, 2.0, -1.0, 0.0], [0.0, 5.0, 3.0, 7.0]], np.float32),
    np.array([[1.0, 0.5, -1.0, 0.0], [0.0, 5.0, 4.0, 7.0]], np.float32),
    np.array([1.0, 2.0, -1.0, 0.0], np.float32),
]


@pytest.mark.parametrize("op", ["Max", "Min"])
def test_max_and_min_split_ties_as_torch(op):
    """Two inputs: torch.maximum/minimum (dy / 2 each at a tie); more inputs: torch.amax/
    amin over the stacked inputs (dy shared evenly by every input holding the extreme),
    broadcast inputs summed back to their shapes."""
    torch = pytest.importorskip("torch")
    dy = np.random.default_rng(1).normal(0, 1, (2, 4)).astype(np.float32)
    pair = torch.maximum if op == "Max" else torch.minimum
    two = _TIES[:2]
    for got, want in zip(_dfdl_grads(op, two, {}, dy), _torch_grads(pair, two, dy)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    extreme = torch.amax if op == "Max" else torch.amin

    def stacked(a, b, c):
        return extreme(torch.stack(torch.broadcast_tensors(a, b, c)), dim=0)

    for got, want in zip(_dfdl_grads(op, _TIES, {}, dy), _torch_grads(stacked, _TIES, dy)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def _activations():
    import torch.nn.functional as F

    return [
        ("HardSwish", {}, F.hardswish),
        ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, F.hardsigmoid),
        ("Elu", {"alpha": 0.7}, lambda x: F.elu(x, 0.7)),
        ("Selu", {}, F.selu),
        ("Celu", {"alpha": 1.5}, lambda x: F.celu(x, 1.5)),
        ("Softplus", {}, F.softplus),
        ("Softsign", {}, F.softsign),
        ("Mish", {}, F.mish),
        ("ThresholdedRelu", {"alpha": 0.5}, lambda x: F.threshold(x, 0.5, 0.0)),
        ("ThresholdedRelu", {"alpha": -0.5}, lambda x: F.threshold(x, -0.5, 0.0)),
    ]


def test_activation_gradients_match_torch_at_their_kinks():
    """The one-sided values torch takes at the kinks (HardSwish and HardSigmoid at +-3,
    the ELUs and thresholds at 0 and alpha), and torch's values elsewhere."""
    pytest.importorskip("torch")
    x = np.array([-3.0, 3.0, -0.5, 0.0, 0.5, -5.0, 5.0, 1.5, -2.0, 25.0], np.float64)
    dy = np.random.default_rng(2).normal(0, 1, x.shape)
    for op, attrs, fn in _activations():
        (got,) = _dfdl_grads(op, [x], attrs, dy)
        (want,) = _torch_grads(fn, [x], dy)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=op)


def test_prelu_and_mod_gradients_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = np.concatenate([[0.0, -1.0, 2.0], rng.normal(0, 2, 21)]).reshape(2, 3, 4)
    slope = rng.uniform(0, 0.5, (3, 1))
    dy = rng.normal(0, 1, x.shape)
    for got, want in zip(
        _dfdl_grads("PRelu", [x, slope], {}, dy),
        _torch_grads(lambda a, s: torch.where(a > 0, a, a * s), [x, slope], dy),
    ):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    b = np.where(rng.random((3, 4)) < 0.5, -1, 1) * rng.uniform(0.5, 2, (3, 4))
    for fmod, fn in [(0, torch.remainder), (1, torch.fmod)]:
        for got, want in zip(
            _dfdl_grads("Mod", [x, b], {"fmod": fmod}, dy), _torch_grads(fn, [x, b], dy)
        ):
            np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=f"fmod={fmod}")


@pytest.mark.parametrize("op", ["Sum", "Mean"])
def test_sum_and_mean_spread_the_gradient(op):
    a, b, c = _TIES
    dy = np.random.default_rng(5).normal(0, 1, (2, 4)).astype(np.float32)
    share = dy if op == "Sum" else dy / np.float32(3)
    got = _dfdl_grads(op, [a, b, c], {}, dy)
    np.testing.assert_allclose(got[0], share, rtol=1e-6)
    np.testing.assert_allclose(got[1], share, rtol=1e-6)
    np.testing.assert_allclose(got[2], share.sum(0), rtol=1e-6)


# ------------------------------------------------------------------- shape rule errors


@pytest.mark.parametrize(
    "op, types, attrs, error, match",
    [
        ("PRelu", [((2, 3), "f4"), ((3, 1), "f4")], {}, ShapeError, "unidirectional"),
        ("PRelu", [((2, 3), "f4"), ((3,), "f8")], {}, ShapeError, "slope of X's dtype"),
        ("PRelu", [((2, 3), "i1"), ((3,), "i1")], {}, ShapeError, "does not accept int8"),
        ("Mod", [((2, 3), "f4"), ((3,), "f4")], {"fmod": 2}, UnsupportedOpError, "fmod 0 or 1"),
        ("Mod", [((2, 3), "i4"), ((2,), "i4")], {}, ShapeError, "do not broadcast"),
        ("Max", [], {}, ShapeError, "at least one input"),
        ("Max", [((2, 3), "f4"), ((2, 3), "f8")], {}, ShapeError, "one dtype"),
        ("Sum", [((2, 3), "i4")], {}, ShapeError, "does not accept int32"),
        ("Celu", [((2, 3), "f4")], {"alpha": 0.0}, UnsupportedOpError, "nonzero alpha"),
        ("And", [((2,), "f4"), ((2,), "f4")], {}, ShapeError, "does not accept float32"),
        ("Round", [((2,), "i8")], {}, ShapeError, "does not accept int64"),
        ("IsNaN", [((2,), "i4")], {}, ShapeError, "does not accept int32"),
    ],
)
def test_shape_rules_refuse_what_the_spec_does_not_allow(op, types, attrs, error, match):
    ins = [TensorType(s, np.dtype(d)) for s, d in types]
    with pytest.raises(error, match=match):
        REGISTRY[op].shape(ins, [None] * len(ins), **attrs)
