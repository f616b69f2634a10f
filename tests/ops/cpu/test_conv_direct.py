"""The direct stride-1 3x3 convolution kernels (``dfdl.ops.cpu.conv_direct``).

Forward, input gradient and weight gradient are checked against the registry's numpy
forwards (independent of the CPU kernels) over 2-D and 3-D geometries with every pad
from 0 to 2 on either side, channel counts that are not multiples of the kernels' 16
(float32) or 8 (float64) channel vectors, several samples, float32 and float64. The
forward must give the same bits wherever a sample sits in its tile and however the
image is cut into tiles with halos, and the CPU kernels must route U-Net-like
convolutions here and ResNet-like ones not.
"""

from __future__ import annotations

import numpy as np
import pytest

from dfdl.ops import REGISTRY
from dfdl.ops.cpu import conv, conv_direct

CONV, GRAD_INPUT, GRAD_WEIGHT = (
    REGISTRY[k] for k in ("Conv", "dfdl.ConvGradInput", "dfdl.ConvGradWeight")
)

#: (id, X shape, W shape, pads)
GEOMETRIES = [
    ("2d_same", (2, 8, 9, 7), (8, 8, 3, 3), [1, 1, 1, 1]),
    ("2d_valid_odd_channels", (1, 9, 8, 10), (13, 9, 3, 3), [0, 0, 0, 0]),
    ("2d_asym_pads", (3, 10, 7, 8), (11, 10, 3, 3), [2, 0, 1, 2]),
    ("3d_same", (1, 8, 6, 7, 5), (9, 8, 3, 3, 3), [1, 1, 1, 1, 1, 1]),
    ("3d_asym_pads", (2, 11, 5, 6, 7), (10, 11, 3, 3, 3), [0, 2, 1, 2, 0, 1]),
    ("3d_flat_kernel", (2, 8, 4, 6, 6), (12, 8, 1, 3, 3), [0, 1, 1, 0, 1, 1]),
    # grid rows of 5 values: one 16-position block spans several output rows
    ("2d_narrow_rows", (2, 9, 5, 3), (21, 9, 3, 3), [1, 1, 1, 1]),
    # 33 output channels: three vectors of float32, five of float64, the last partial
    ("3d_channel_vectors", (2, 17, 4, 5, 4), (33, 17, 3, 3, 3), [1, 1, 1, 1, 1, 1]),
]


def _tol(dtype):
    # float32 sums of up to 17 x 27 products of magnitude ~1: rounding reaches 1e-5
    return {"rtol": 1e-4, "atol": 1e-4} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-12}


def _data(xs, ws, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: g[0])
def test_direct_kernels_match_the_reference(geometry, dtype):
    _, xs, ws, pads = geometry
    x, w = _data(xs, ws, dtype)
    nd = x.ndim - 2
    pb, pe = pads[:nd], pads[nd:]
    attrs = {"pads": pads}
    y = conv_direct.conv(x, w, pb, pe)
    np.testing.assert_allclose(y, CONV.forward(x, w, **attrs), **_tol(dtype))
    dy = np.random.default_rng(1).standard_normal(y.shape).astype(dtype)
    dx = conv_direct.conv_grad_input(dy, w, pb, pe, xs[2:])
    ref_dx = GRAD_INPUT.forward(dy, w, input_shape=list(xs), **attrs)
    np.testing.assert_allclose(dx, ref_dx, **_tol(dtype))
    dw = conv_direct.conv_grad_weight(x, dy, pb, pe, ws[2:])
    ref_dw = GRAD_WEIGHT.forward(x, dy, weight_shape=list(ws), **attrs)
    np.testing.assert_allclose(dw, ref_dw, **_tol(dtype))
    assert y.dtype == dx.dtype == dw.dtype == dtype


@pytest.mark.parametrize("shape", [(3, 8, 5, 9, 11), (5, 8, 7, 6)], ids=["3d", "2d"])
def test_forward_bits_do_not_depend_on_the_sample_place_in_the_tile(shape):
    """The samples of a tile share one grid, so each sample's positions fall at other
    offsets of the 16-position register blocks than when it is alone; its outputs must
    be the same bits. The input gradient runs the same kernel."""
    x, w = _data(shape, (10, 8) + (3,) * (len(shape) - 2), np.float32)
    pads = [1] * (len(shape) - 2)
    batch = conv_direct.conv(x, w, pads, pads)
    for b in range(shape[0]):
        assert np.array_equal(conv_direct.conv(x[b : b + 1], w, pads, pads)[0], batch[b])


def test_weight_gradient_does_not_depend_on_the_block_size(monkeypatch):
    x, w = _data((2, 8, 5, 9, 11), (10, 8, 3, 3, 3), np.float32)
    dy = np.random.default_rng(3).standard_normal((2, 10, 5, 9, 11)).astype(np.float32)
    whole = conv_direct.conv_grad_weight(x, dy, [1] * 3, [1] * 3, (3, 3, 3))
    for block in (1, 7, 100):
        monkeypatch.setattr(conv_direct, "DW_BLOCK", block)
        got = conv_direct.conv_grad_weight(x, dy, [1] * 3, [1] * 3, (3, 3, 3))
        # sums of ~1,000 products: the block size moves the rounding, no more
        np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-6 * np.abs(whole).max())


def test_scratch_reuse_leaves_no_stale_values():
    """The grid is reused scratch memory: a large call followed by a small one with
    other pads must see zeros, not the large call's values, on the small one's border."""
    big, w = _data((2, 8, 12, 12, 12), (8, 8, 3, 3, 3), np.float32)
    conv_direct.conv(big * 1e6, w, [2] * 3, [2] * 3)
    x, _ = _data((1, 8, 4, 5, 6), (8, 8, 3, 3, 3), np.float32, seed=5)
    np.testing.assert_allclose(
        conv_direct.conv(x, w, [1, 0, 2], [2, 1, 0]),
        CONV.forward(x, w, pads=[1, 0, 2, 2, 1, 0]),
        rtol=1e-5,
        atol=1e-5,
    )


def test_forward_bits_do_not_depend_on_the_tiling():
    """Rows 4:9 of the output, computed from a tile of rows 3:10 (one halo row each side,
    no pad there), are the same bits as in the whole image's output."""
    x, w = _data((2, 8, 12, 10), (8, 8, 3, 3), np.float32)
    whole = conv_direct.conv(x, w, [1, 1], [1, 1])
    tile = conv_direct.conv(np.ascontiguousarray(x[:, :, 3:10]), w, [0, 1], [0, 1])
    assert np.array_equal(tile, whole[:, :, 4:9])


def test_nan_in_the_input_reaches_the_outputs_it_touches():
    x, w = _data((1, 8, 6, 6), (8, 8, 3, 3), np.float32)
    x[0, 3, 2, 2] = np.nan
    y = conv_direct.conv(x, w, [1, 1], [1, 1])
    assert np.isnan(y[:, :, 1:4, 1:4]).all()
    assert np.isfinite(y[:, :, 4:, :]).all() and np.isfinite(y[:, :, :, 4:]).all()


U_NET = ((1, 16, 32, 32, 32), (16, 16, 3, 3, 3), [1] * 6)


def _applies(xs, ws, pads, *, strides=None, dilations=None, group=1, dtype=np.float32):
    nd = len(xs) - 2
    strides = strides or [1] * nd
    out = [s + a + b - k + 1 for s, a, b, k in zip(xs[2:], pads[:nd], pads[nd:], ws[2:])]
    return conv_direct.applies(
        xs, ws, strides, dilations or [1] * nd, group, pads[:nd], pads[nd:], out, dtype
    )


def test_applies_to_few_channels_on_large_images():
    assert _applies(*U_NET)
    assert _applies((2, 32, 64, 64), (32, 32, 3, 3), [1] * 4)
    assert _applies((1, 64, 16, 16, 16), (64, 64, 3, 3, 3), [1] * 6)


@pytest.mark.parametrize(
    "change",
    [
        {"dtype": np.float16},
        {"strides": [1, 2, 1]},
        {"dilations": [1, 1, 2]},
        {"group": 2},
        {"ws": (16, 16, 3, 3, 5)},
        {"ws": (16, 16, 2, 3, 3)},
        {"pads": [3, 1, 1, 1, 1, 1]},
        {"xs": (1, 4, 32, 32, 32), "ws": (16, 4, 3, 3, 3)},  # too few input channels
        {"ws": (4, 16, 3, 3, 3)},  # too few output channels
        {"xs": (1, 128, 32, 32, 32), "ws": (64, 128, 3, 3, 3)},  # channel product
        {"xs": (1, 16, 64, 4, 4)},  # 6x6 grid for 4x4 outputs
        {"xs": (1, 16, 40, 8, 8)},  # 10x10 grid for 8x8 outputs
        {"xs": (64, 16, 1, 16, 16), "ws": (16, 16, 1, 3, 3), "pads": [0, 1, 1, 0, 1, 1]},
    ],
    ids=[
        "float16",
        "stride",
        "dilation",
        "groups",
        "kernel_5",
        "kernel_2",
        "pad_3",
        "few_input_channels",
        "few_output_channels",
        "many_channels",
        "border_waste",
        "border_waste_8x8",
        "small_images",
    ],
)
def test_does_not_apply(change):
    xs, ws, pads = U_NET
    kw = {k: v for k, v in change.items() if k not in ("xs", "ws", "pads")}
    assert not _applies(change.get("xs", xs), change.get("ws", ws), change.get("pads", pads), **kw)


def _spy(monkeypatch, calls):
    for name in ("_stencil", "_stencil_grad_weight"):
        real = getattr(conv_direct, name)

        def counted(*args, _real=real, _name=name):
            calls.append(_name)
            return _real(*args)

        monkeypatch.setattr(conv_direct, name, counted)


@pytest.mark.parametrize(
    "shapes, direct",
    [
        (((1, 16, 8, 24, 24), (16, 16, 3, 3, 3)), True),
        (((4, 64, 16, 16), (64, 64, 3, 3)), False),
    ],
    ids=["unet_like", "resnet_like"],
)
def test_cpu_kernels_route_by_shape(shapes, direct, monkeypatch):
    xs, ws = shapes
    x, w = _data(xs, ws, np.float32)
    attrs = {"pads": [1] * 2 * (x.ndim - 2)}
    calls: list = []
    _spy(monkeypatch, calls)
    y = CONV.kernel("cpu")(x, w, **attrs)
    dy = np.ones_like(y)
    GRAD_INPUT.kernel("cpu")(dy, w, input_shape=list(xs), **attrs)
    GRAD_WEIGHT.kernel("cpu")(x, dy, weight_shape=list(ws), **attrs)
    assert (conv.algorithm(xs, ws, x.dtype, **CONV.params(x, w, **attrs)) == "direct") == direct
    expected = ["_stencil", "_stencil", "_stencil_grad_weight"] if direct else []
    assert calls == expected
    np.testing.assert_allclose(y, CONV.forward(x, w, **attrs), rtol=1e-4, atol=1e-4)
