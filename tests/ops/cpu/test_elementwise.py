"""The elementwise CPU kernels (dfdl.ops.cpu.elementwise): which tiles they take, the
parameters their ops resolve for them, and the float32 GELU kernels (dfdl.ops.cpu.gelu_f32,
vectorizable exp/erfc) against a float64 libm reference over the whole float32 range,
across chunk boundaries, and on the special values where the float64 kernels define the
expected result. Kernels are called as tasks call them: ``REGISTRY[key].kernel("cpu")``."""

from __future__ import annotations

import math
import pickle

import numba
import numpy as np
import pytest

from dfdl.errors import UnsupportedOpError
from dfdl.ops import REGISTRY
from dfdl.ops.cpu import elementwise as E
from dfdl.ops.cpu import gelu_f32

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


def test_a_dispatch_pickles_by_reference():
    # tasks carry the tile function to the workers: the table op's forward goes by name
    d = REGISTRY["Add"].kernel("cpu")
    back = pickle.loads(pickle.dumps(d))
    assert back.forward is REGISTRY["Add"].forward and back.kernel is E.add
    assert len(pickle.dumps(REGISTRY["Exp"].forward)) < 200
