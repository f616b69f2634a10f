"""Winograd F(2x2, 3x3) convolutions (``dfdl.ops.cpu.winograd``).

The forward and both gradients are checked against the registry's numpy forwards
(independent of the CPU kernels) at float32 tolerance, over even and odd image sizes,
channel counts that are not powers of two, one sample and several blocks of tiles;
``applies`` must take only the geometry the transforms are written for, the CPU
kernels must route ResNet-like convolutions here, and im2col, run by name on the same
geometry, must agree with them.
"""

from __future__ import annotations

import numpy as np
import pytest

from dfdl.ops import REGISTRY
from dfdl.ops.cpu import conv, winograd

CONV, GRAD_INPUT, GRAD_WEIGHT = (
    REGISTRY[k] for k in ("Conv", "dfdl.ConvGradInput", "dfdl.ConvGradWeight")
)

#: (id, X shape, C_out)
SHAPES = [
    ("even", (2, 32, 8, 8), 32),
    ("odd_rows_and_columns", (3, 33, 7, 9), 35),
    ("one_pixel", (2, 32, 1, 1), 32),
    ("one_sample_wide", (1, 32, 5, 12), 48),
    ("resnet_stage", (4, 64, 16, 16), 64),
    ("channel_blocks_64_and_32", (2, 96, 6, 6), 40),
]

TOL = {"rtol": 1e-4, "atol": 1e-4}


def _data(xs, m, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal((m, xs[1], 3, 3)) / np.sqrt(9 * xs[1])).astype(np.float32)
    return x, w


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s[0])
def test_forward_matches_the_reference(shape):
    _, xs, m = shape
    x, w = _data(xs, m)
    np.testing.assert_allclose(winograd.conv(x, w), CONV.forward(x, w, pads=[1] * 4), **TOL)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s[0])
def test_weight_gradient_matches_the_reference(shape):
    _, xs, m = shape
    x, _ = _data(xs, m)
    dy = np.random.default_rng(3).standard_normal((xs[0], m, *xs[2:])).astype(np.float32)
    ref = GRAD_WEIGHT.forward(x, dy, pads=[1] * 4, weight_shape=[m, xs[1], 3, 3])
    # sums over up to 4 x 16 x 16 positions of magnitude ~1: compare to the largest value
    scale = float(np.abs(ref).max())
    np.testing.assert_allclose(winograd.conv_grad_weight(x, dy), ref, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s[0])
def test_cpu_kernels_route_here_and_match(shape):
    _, xs, m = shape
    x, w = _data(xs, m)
    b = np.random.default_rng(2).standard_normal(m).astype(np.float32)
    attrs = {"pads": [1] * 4}
    params = CONV.params(x, w, b, **attrs)
    assert conv.algorithm(xs, w.shape, x.dtype, **params) == "winograd"
    y = CONV.kernel("cpu")(x, w, b, **attrs)
    np.testing.assert_allclose(y, CONV.forward(x, w, b, **attrs), **TOL)
    dy = np.random.default_rng(1).standard_normal(y.shape).astype(np.float32)
    dx = GRAD_INPUT.kernel("cpu")(dy, w, input_shape=xs, **attrs)
    np.testing.assert_allclose(dx, GRAD_INPUT.forward(dy, w, input_shape=xs, **attrs), **TOL)
    dw = GRAD_WEIGHT.kernel("cpu")(x, dy, weight_shape=w.shape, **attrs)
    ref = GRAD_WEIGHT.forward(x, dy, weight_shape=w.shape, **attrs)
    np.testing.assert_allclose(dw, ref, rtol=1e-4, atol=1e-5 * float(np.abs(ref).max()))
    # im2col's forward, named, gives the same numbers (to rounding)
    np.testing.assert_allclose(conv.run_conv("im2col", x, w, b, **params), y, **TOL)
    # im2col's gradients give the same numbers (a bug in either would fail this)
    dx_params = GRAD_INPUT.params(dy, w, input_shape=xs, **attrs)
    np.testing.assert_allclose(conv.run_grad_input("im2col", dy, w, **dx_params), dx, **TOL)
    dw_params = GRAD_WEIGHT.params(x, dy, weight_shape=w.shape, **attrs)
    dw_plain = conv.run_grad_weight("im2col", x, dy, **dw_params)
    np.testing.assert_allclose(dw_plain, dw, rtol=1e-4, atol=1e-5 * float(np.abs(ref).max()))


def test_forward_error_is_im2cols_whatever_the_channels():
    # 256 channels: one float32 sum over them all had 1.9x im2col's error (float64 as the
    # reference; post-ReLU inputs as in a network); blocks of 64 summed in float64 must
    # keep it at im2col's (docs/design/float32-accuracy.md)
    rng = np.random.default_rng(0)
    x = np.maximum(rng.standard_normal((8, 256, 8, 8)), 0).astype(np.float32)
    w = (rng.standard_normal((256, 256, 3, 3)) / np.sqrt(9 * 256)).astype(np.float32)
    params = CONV.params(x, w, pads=[1] * 4)
    ref = conv.run_conv("im2col", x.astype(np.float64), w.astype(np.float64), **params)

    def error(y):
        return float(np.sqrt(np.mean((y - ref) ** 2)) / ref.std())

    blocks = error(winograd.conv(x, w))
    assert blocks <= 1.2 * error(conv.run_conv("im2col", x, w, **params))
    assert blocks < error(winograd.conv(x, w, sum_channels=None))


def test_blocks_of_tiles_and_chunks_of_samples_cover_every_tile(monkeypatch):
    x, w = _data((3, 32, 9, 7), 32)
    whole = winograd.conv(x, w)
    dw = winograd.conv_grad_weight(x, whole)
    monkeypatch.setattr(winograd, "BLOCK_BYTES", 1)
    monkeypatch.setattr(winograd, "MIN_BLOCK_TILES", 7)  # 75 tiles: 11 blocks, one short
    monkeypatch.setattr(winograd, "CHUNK_BYTES", 1)  # one sample at a time
    # equal to rounding: numpy's BLAS (dfdl's, once torch is imported) may run a small
    # block's products with other kernels than the whole's; a missed tile is off by O(1)
    np.testing.assert_allclose(winograd.conv(x, w), whole, rtol=1e-5, atol=1e-5)
    # the weight gradient sums the blocks in another order: equal to rounding
    np.testing.assert_allclose(winograd.conv_grad_weight(x, whole), dw, rtol=1e-5, atol=1e-4)


def test_gradient_kernels_are_called_for_resnet_convolutions(monkeypatch):
    calls = []
    real = winograd.conv

    def spy(x, w, **kw):
        calls.append((x.shape, kw))
        return real(x, w, **kw)

    real_dw = winograd.conv_grad_weight

    def spy_dw(x, dy):
        calls.append(("dW", x.shape))
        return real_dw(x, dy)

    monkeypatch.setattr(winograd, "conv", spy)
    monkeypatch.setattr(winograd, "conv_grad_weight", spy_dw)
    x, w = _data((2, 64, 8, 8), 64)
    CONV.kernel("cpu")(x, w, pads=[1] * 4)
    GRAD_INPUT.kernel("cpu")(x, w, pads=[1] * 4, input_shape=x.shape)
    GRAD_WEIGHT.kernel("cpu")(x, x, pads=[1] * 4, weight_shape=w.shape)
    # the forward sums channel blocks in float64 (its default); dX one float32 sum
    assert calls == [(x.shape, {}), (x.shape, {"sum_channels": None}), ("dW", x.shape)]


@pytest.mark.parametrize(
    "change",
    [
        {"x_shape": (2, 32, 8, 8, 8), "w_shape": (32, 32, 3, 3, 3)},  # 3-D
        {"w_shape": (32, 32, 5, 5)},
        {"strides": [2, 2]},
        {"dilations": [2, 2]},
        {"group": 2},
        {"pads_begin": [0, 0], "pads_end": [0, 0]},
        {"pads_end": [1, 0]},
        {"dtype": np.float64},
        {"x_shape": (2, 16, 8, 8)},  # too few input channels
        {"w_shape": (16, 32, 3, 3)},  # too few output channels
    ],
)
def test_applies_only_to_its_geometry(change):
    args = {
        "x_shape": (2, 32, 8, 8),
        "w_shape": (32, 32, 3, 3),
        "strides": [1, 1],
        "dilations": [1, 1],
        "group": 1,
        "pads_begin": [1, 1],
        "pads_end": [1, 1],
        "dtype": np.float32,
    }
    assert winograd.applies(**args)
    assert not winograd.applies(**{**args, **change})
