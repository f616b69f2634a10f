"""The float32 GELU kernels (dfdl.ops.cpu.gelu_f32, vectorizable exp/erfc), against a
float64 libm reference over the whole float32 range, across chunk boundaries, and on the
special values where the float64 kernels define the expected result."""

import math

import numba
import numpy as np
import pytest

from dfdl.ops.cpu import elementwise as E
from dfdl.ops.cpu import gelu_f32

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
    np.testing.assert_allclose(E.gelu(x), _ref_gelu(x), rtol=2e-6, atol=5e-7)


def test_gelu_grad_f32_matches_float64_reference():
    x = _grid()
    dy = np.random.default_rng(0).uniform(-3, 3, x.size).astype(np.float32)
    # float32 cancellation of Phi(x) + x phi(x) near x = -0.75 bounds the absolute error
    np.testing.assert_allclose(E.gelu_grad(dy, x), _ref_gelu_grad(dy, x), rtol=2e-6, atol=1e-6)


def test_f32_kernels_are_the_ones_dispatched():
    x = _grid(1001)
    dy = np.ones_like(x)
    out = np.empty_like(x)
    gelu_f32.gelu_grad(dy, x, out)
    np.testing.assert_array_equal(E.gelu_grad(dy, x), out)
    gelu_f32.gelu(x, out)
    np.testing.assert_array_equal(E.gelu(x), out)


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 511, 512, 513, 1543])
def test_vector_boundaries(n):
    rng = np.random.default_rng(n)
    x = rng.normal(0, 3, (n,)).astype(np.float32)
    dy = rng.normal(0, 1, (n,)).astype(np.float32)
    np.testing.assert_allclose(E.gelu(x), _ref_gelu(x), rtol=2e-6, atol=5e-7)
    np.testing.assert_allclose(E.gelu_grad(dy, x), _ref_gelu_grad(dy, x), rtol=2e-6, atol=1e-6)


def test_a_value_does_not_depend_on_its_position():
    # a tile's values must not change with where it starts: the vector loop and its
    # remainder compute the same bits
    x = np.random.default_rng(5).normal(0, 4, (1000,)).astype(np.float32)
    dy = np.ones_like(x)
    for start in (1, 3, 17):
        part = x[start:].copy()
        np.testing.assert_array_equal(E.gelu(part), E.gelu(x)[start:])
        np.testing.assert_array_equal(E.gelu_grad(dy[start:], part), E.gelu_grad(dy, x)[start:])


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
    np.testing.assert_array_equal(E.gelu(x), E.gelu(x.astype(np.float64)).astype(np.float32))
    np.testing.assert_array_equal(
        E.gelu_grad(ones, x),
        E.gelu_grad(ones.astype(np.float64), x.astype(np.float64)).astype(np.float32),
    )


def test_far_tail_is_exactly_zero():
    x = np.array([-14.0, -20.0, -1e10], np.float32)
    assert np.all(E.gelu(x) == 0)
    assert np.all(E.gelu_grad(np.ones_like(x), x) == 0)
