"""The CPU convolution kernels in both of their layouts.

``dfdl.ops.cpu.conv`` runs a convolution channels-last (per block of samples) where a
sample's im2col buffer is small and the groups have enough channels, channels-first
otherwise, and stride-1 3x3 convolutions with few channels on large images through the
direct kernels of ``dfdl.ops.cpu.conv_direct``. The registry's cases
(``tests/ops/cases_conv.py``) mostly have too few channels for the channels-last and
direct paths, so here every conv-family case runs through each path: channels-first,
channels-last with blocks of one sample, of two (five samples: a short last block) and
of all samples, and direct with its channel, size and border limits lifted (the cases it
cannot run take im2col), against the case's reference (float32 and float64 cases: other
dtypes take the numpy forward); the matrix products on numpy's BLAS and, where it is
installed, on MKL (every product, however small).
"""

from __future__ import annotations

import numpy as np
import pytest

from dfdl.ops import REGISTRY
from dfdl.ops.cpu import blas, conv, conv_direct, conv_pointwise
from tests.ops.cpu.test_blas import use_mkl
from tests.ops.test_registry import CASES, _present, assert_matches

CONV_OPS = ("Conv", "ConvTranspose", "ConvGradInput", "ConvGradWeight")
CONV_CASES = [
    c
    for c in CASES
    if c.op in CONV_OPS
    and all(np.asarray(x).dtype in (np.float32, np.float64) for x in c.inputs if x is not None)
]

#: samples per channels-last block; 0: channels-first; None: direct where it applies;
#: "pointwise": 1x1 kernels without padding on conv_pointwise, the rest channels-first
LAYOUTS = {
    "channels_first": 0,
    "cl_blocks_of_1": 1,
    "cl_blocks_of_2": 2,
    "cl_one_block": 64,
    "direct": None,
    "pointwise": "pointwise",
}

#: (op, case id) of the registry's cases that the direct kernels run when their channel
#: and border limits are lifted
DIRECT_CASES = {
    ("Conv", "2d_pad"),
    ("Conv", "2d_nopad_nobias"),
    ("Conv", "const_weights"),
    ("ConvGradInput", "2d_pad"),
    ("ConvGradWeight", "2d_pad"),
}


def _spy(monkeypatch, name: str, calls: list, module=conv) -> None:
    real = getattr(module, name)

    def counted(*args):
        calls.append(name)
        return real(*args)

    monkeypatch.setattr(module, name, counted)


def test_every_conv_op_has_cases_here():
    assert {c.op for c in CONV_CASES} == set(CONV_OPS)


@pytest.mark.parametrize("library", ["numpy", "mkl"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: c.name())
def test_kernel_matches_reference_in_each_layout(case, layout, library, monkeypatch):
    if library == "mkl":  # every product on MKL, however small
        use_mkl(monkeypatch)
        monkeypatch.setattr(blas, "MIN_WORK", 1)
    else:
        monkeypatch.setattr(blas, "_MKL", None)
    per = LAYOUTS[layout]
    if per == "pointwise":
        per = 0
        monkeypatch.setattr(conv_direct, "applies", lambda *args: False)
        monkeypatch.setattr(conv, "_cl_samples", lambda *args: 0)
    else:  # the im2col and direct paths run 1x1 kernels too
        monkeypatch.setattr(conv_pointwise, "applies", lambda *args: False)
    if per is None:
        monkeypatch.setattr(conv_direct, "MIN_CHANNELS", 1)
        monkeypatch.setattr(conv_direct, "MAX_CHANNEL_PRODUCT", 1 << 62)
        monkeypatch.setattr(conv_direct, "MAX_GRID_WASTE", float("inf"))
        monkeypatch.setattr(conv_direct, "MIN_POSITIONS", 1)
    elif layout != "pointwise":
        monkeypatch.setattr(conv_direct, "applies", lambda *args: False)
        monkeypatch.setattr(conv, "_cl_samples", lambda *args: per)
    calls: list = []
    _spy(monkeypatch, "_im2col_cl", calls)
    _spy(monkeypatch, "_col2im_cl", calls)
    _spy(monkeypatch, "_stencil", calls, conv_direct)
    _spy(monkeypatch, "_stencil_grad_weight", calls, conv_direct)
    _spy(monkeypatch, "_sampled", calls, conv_pointwise)
    _spy(monkeypatch, "conv_grad_input", calls, conv_pointwise)
    got = REGISTRY[case.key].kernel("cpu")(*_present(case.inputs), **case.attrs)
    assert_matches(got, case.expected()[0], case, f"{layout} kernel")
    direct = [c for c in calls if c.startswith("_stencil")]
    pointwise_conv = case.op == "Conv" and "pointwise" in case.id
    if per and not pointwise_conv:  # a 1x1 stride-1 Conv is a plain GEMM either way
        assert calls, "the channels-last path was not taken"
    pointwise = [c for c in calls if c in ("_sampled", "conv_grad_input")]
    if layout == "pointwise":
        w_shape = np.shape(case.inputs[1]) if case.op != "ConvGradWeight" else ()
        one_by_one = "pointwise" in case.id or "1x1" in case.id
        assert bool(pointwise) == (one_by_one and case.op != "ConvTranspose"), (calls, w_shape)
    elif per == 0:
        assert not calls, "the channels-first path ran channels-last or direct kernels"
    if per is None:
        assert bool(direct) == ((case.op, case.id) in DIRECT_CASES), calls


def test_channels_last_applies_to_small_samples_with_enough_channels(monkeypatch):
    monkeypatch.setattr(conv, "COLS_BYTES", 1000)
    monkeypatch.setattr(conv, "CL_MIN_CHANNELS", 4)
    assert conv._cl_samples(npos=10, kk=25, channels=4, itemsize=4) == 1  # 1000 bytes
    assert conv._cl_samples(npos=5, kk=20, channels=8, itemsize=4) == 2  # 400 bytes
    assert conv._cl_samples(npos=10, kk=26, channels=4, itemsize=4) == 0  # over the budget
    assert conv._cl_samples(npos=5, kk=20, channels=3, itemsize=4) == 0  # too few channels


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_resnet_like_shapes_take_the_channels_last_path_by_default(dtype, monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 16, 9, 8)).astype(dtype)
    w = rng.standard_normal((24, 16, 3, 3)).astype(dtype)
    attrs = {"pads": [1, 1, 1, 1], "strides": [2, 2]}
    calls: list = []
    _spy(monkeypatch, "_im2col_cl", calls)
    _spy(monkeypatch, "_col2im_cl", calls)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-10}
    conv_op, gi, gw = (REGISTRY[k] for k in ("Conv", "dfdl.ConvGradInput", "dfdl.ConvGradWeight"))
    y = conv_op.kernel("cpu")(x, w, **attrs)
    np.testing.assert_allclose(y, conv_op.forward(x, w, **attrs), **tol)
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = gi.kernel("cpu")(dy, w, input_shape=list(x.shape), **attrs)
    np.testing.assert_allclose(dx, gi.forward(dy, w, input_shape=list(x.shape), **attrs), **tol)
    dw = gw.kernel("cpu")(x, dy, weight_shape=list(w.shape), **attrs)
    np.testing.assert_allclose(dw, gw.forward(x, dy, weight_shape=list(w.shape), **attrs), **tol)
    assert calls.count("_im2col_cl") > 0 and calls.count("_col2im_cl") > 0
