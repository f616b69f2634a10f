"""1x1 convolutions without padding (``dfdl.ops.cpu.conv_pointwise``) against the numpy
reference of ``dfdl.ops.conv``, on shapes larger than the registry's cases: strides that
do and do not divide the image, 1-D to 3-D, float32 and float64; and the geometries it
must leave to the other kernels."""

from __future__ import annotations

import numpy as np
import pytest

from dfdl.ops import REGISTRY
from dfdl.ops import conv as ref
from dfdl.ops.cpu import conv_pointwise

CONV, GRAD_INPUT, GRAD_WEIGHT = (
    REGISTRY[k].kernel("cpu") for k in ("Conv", "dfdl.ConvGradInput", "dfdl.ConvGradWeight")
)

#: (X shape, C_out, strides)
SHAPES = [
    ((6, 16, 9, 8), 24, [2, 2]),
    ((6, 16, 8, 8), 24, [2, 2]),
    ((3, 8, 10, 7), 5, [3, 1]),
    ((4, 8, 13), 6, [2]),
    ((2, 4, 5, 6, 7), 3, [2, 3, 1]),
    ((3, 8, 6, 5), 4, [1, 1]),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("x_shape,c_out,strides", SHAPES)
def test_pointwise_kernels_match_the_reference(x_shape, c_out, strides, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal((c_out, x_shape[1]) + (1,) * (len(x_shape) - 2)).astype(dtype)
    b = rng.standard_normal(c_out).astype(dtype)
    attrs = {"strides": strides}
    want = ref.Conv(x, w, b, **attrs)
    got = CONV(x, w, b, **attrs)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-12}
    np.testing.assert_allclose(got, want, **tol)
    dy = rng.standard_normal(want.shape).astype(dtype)
    np.testing.assert_allclose(
        GRAD_INPUT(dy, w, input_shape=list(x_shape), **attrs),
        ref.ConvGradInput(dy, w, input_shape=list(x_shape), **attrs),
        **tol,
    )
    np.testing.assert_allclose(
        GRAD_WEIGHT(x, dy, weight_shape=list(w.shape), **attrs),
        ref.ConvGradWeight(x, dy, weight_shape=list(w.shape), **attrs),
        **tol,
    )


def test_the_pointwise_kernels_are_the_ones_that_run(monkeypatch):
    calls = []
    for name in ("conv", "conv_grad_input", "conv_grad_weight"):
        real = getattr(conv_pointwise, name)
        monkeypatch.setattr(
            conv_pointwise, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a)
        )
    x = np.ones((2, 4, 6, 6), np.float32)
    w = np.ones((3, 4, 1, 1), np.float32)
    y = CONV(x, w, strides=[2, 2])
    GRAD_INPUT(y, w, input_shape=list(x.shape), strides=[2, 2])
    GRAD_WEIGHT(x, y, weight_shape=list(w.shape), strides=[2, 2])
    assert calls == ["conv", "conv_grad_input", "conv_grad_weight"]
    CONV(x, w, pads=[1, 1, 1, 1])  # padded: im2col
    CONV(x, np.ones((4, 2, 1, 1), np.float32), group=2)  # grouped: im2col
    CONV(x, np.ones((3, 4, 3, 3), np.float32))  # 3x3
    assert calls == ["conv", "conv_grad_input", "conv_grad_weight"]


@pytest.mark.parametrize(
    "w_shape,group,pads_begin,pads_end,want",
    [
        ((8, 4, 1, 1), 1, [0, 0], [0, 0], True),
        ((8, 4, 1), 1, [0], [0], True),
        ((8, 4, 1, 1, 1), 1, [0, 0, 0], [0, 0, 0], True),
        ((8, 4, 1, 1), 1, [0, 1], [0, 0], False),
        ((8, 4, 1, 1), 1, [0, 0], [1, 0], False),
        ((8, 2, 1, 1), 2, [0, 0], [0, 0], False),
        ((8, 4, 1, 3), 1, [0, 0], [0, 0], False),
    ],
)
def test_applies_only_to_unpadded_ungrouped_1x1(w_shape, group, pads_begin, pads_end, want):
    assert conv_pointwise.applies(w_shape, group, pads_begin, pads_end) == want
