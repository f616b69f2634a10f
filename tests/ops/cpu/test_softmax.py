"""The softmax row kernels against numpy, on the rows where order and NaNs matter."""

import numpy as np
import pytest

from dfdl.ops import REGISTRY
from dfdl.ops.cpu.softmax import sub_row_max


@pytest.mark.parametrize("n", [1, 7, 8, 9, 16, 257])
def test_row_max_ignores_nans_at_every_lane(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((2 * n + 3, n), dtype=np.float32)
    for r in range(n):  # a NaN, then the row's largest value, at each position
        x[r, r] = np.nan
        x[n + r, r] = 100.0
    x[-1] = -np.inf
    out = np.empty_like(x)
    sub_row_max(x, out)
    want = x - np.fmax.reduce(x, axis=1, keepdims=True)  # fmax skips NaNs
    np.testing.assert_array_equal(out, want)


def test_softmax_rows_match_numpy():
    softmax, log_softmax = REGISTRY["Softmax"].kernel("cpu"), REGISTRY["LogSoftmax"].kernel("cpu")
    x = np.random.default_rng(0).standard_normal((64, 256), dtype=np.float32) * 3
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(softmax(x), e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(
        log_softmax(x), np.log(e / e.sum(axis=1, keepdims=True)), rtol=1e-5, atol=1e-5
    )
    assert np.isnan(softmax(np.array([[1.0, np.nan, 2.0]], np.float32))).all()


@pytest.mark.parametrize(
    "x, axis, taken",
    [
        (np.ones((2, 3), np.float32), -1, True),
        (np.ones((2, 3), np.float64), 1, True),
        (np.ones((2, 3), np.float32), 0, False),  # not the last axis
        (np.ones((2, 3), np.float16), -1, False),
        (np.ones((0, 3), np.float32), -1, False),  # empty
    ],
)
def test_kernels_take_the_last_axis_of_floats_only(x, axis, taken):
    for key in ("Softmax", "LogSoftmax"):
        assert REGISTRY[key].kernels["cpu"].accepts(x, axis=axis) is taken
    assert REGISTRY["dfdl.SoftmaxGrad"].kernels["cpu"].accepts(x, x, axis=axis) is taken
