"""The LRN kernels against the numpy forwards on AlexNet's LRN and on strided tiles."""

import numpy as np
import pytest

from dfdl.ops import REGISTRY

ALEXNET = {"size": 5, "alpha": 1e-4, "beta": 0.75, "bias": 2.0}


def _x(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype) * 4


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_alexnet_lrn_matches_forward(dtype):
    x = _x((2, 96, 13, 13), dtype)
    got = REGISTRY["LRN"].kernel("cpu")(x, **ALEXNET)
    want = REGISTRY["LRN"].forward(x, **ALEXNET)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == np.float32 else 1e-13)


def test_strided_tile_and_its_gradient():
    # a tile cut out of a larger tensor, channels last in memory
    big = _x((3, 9, 8, 16)).transpose(0, 3, 1, 2)[:, :, 2:7, 1:6]
    dy = _x(big.shape, seed=1)
    attrs = {"size": 4, "alpha": 0.5, "beta": 0.625, "bias": 1.5}
    np.testing.assert_allclose(
        REGISTRY["LRN"].kernel("cpu")(big, **attrs),
        REGISTRY["LRN"].forward(big, **attrs),
        rtol=1e-6,
    )
    grad = REGISTRY["dfdl.LRNGrad"]
    np.testing.assert_allclose(
        grad.kernel("cpu")(dy, big, **attrs), grad.forward(dy, big, **attrs), rtol=1e-5, atol=1e-6
    )


def test_float16_runs_the_forward():
    x = _x((2, 5, 3, 3), np.float16)
    got = REGISTRY["LRN"].kernel("cpu")(x, **ALEXNET)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, REGISTRY["LRN"].forward(x, **ALEXNET))
