"""The shortcut max-pooling kernels against the general one they stand in for.

``dfdl.ops.cpu.pool`` runs 1-D and 2-D MaxPool and MaxPoolGrad through flat kernels
(:func:`~dfdl.ops.cpu.pool._max_pool_2d`, :func:`~dfdl.ops.cpu.pool._max_pool_grad_2d`),
and windows two wide with stride = kernel, at any rank, through
:func:`~dfdl.ops.cpu.pool._max_pool_pairs` and its gradient. They must give bit for bit
what the general 3-D kernels give, ties and NaNs included: the first maximum in scan
order wins, and the gradient adds in the same order.
"""

from __future__ import annotations

import numpy as np
import pytest

from dfdl.ops import REGISTRY
from dfdl.ops import pool as ref
from dfdl.ops.cpu import pool

MAX_POOL = REGISTRY["MaxPool"].kernel("cpu")
MAX_POOL_GRAD = REGISTRY["dfdl.MaxPoolGrad"].kernel("cpu")

GEOMETRIES = {
    "resnet_stem": dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    "overlap_ceil": dict(kernel_shape=[3, 2], strides=[2, 1], ceil_mode=1),
    "dilated_asym_pads": dict(kernel_shape=[2, 3], dilations=[2, 1], pads=[1, 0, 2, 1]),
    "window_in_padding": dict(kernel_shape=[2, 2], strides=[3, 3], pads=[2, 2, 0, 0]),
    "1d": dict(kernel_shape=[3], strides=[2], pads=[1, 1]),
    # the pairs kernels: a row and a column left over, an exact cover, 1-D and 3-D
    "pairs_2x2": dict(kernel_shape=[2, 2], strides=[2, 2]),
    "pairs_3x2_exact": dict(kernel_shape=[3, 2], strides=[3, 2]),
    "pairs_1d": dict(kernel_shape=[2], strides=[2]),
    "pairs_3d": dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2]),
    "pairs_3d_ceil": dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2], ceil_mode=1),
}

SHAPES = {"1d": (2, 3, 11), "pairs_1d": (2, 3, 11), "pairs_3d": (2, 3, 5, 6, 8)}
SHAPES["pairs_3d_ceil"] = SHAPES["pairs_3d"]


def _data(shape, dtype):
    # small integers: many ties; a few NaNs, one at a window's first tap
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, size=shape).astype(dtype)
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, size=max(1, flat.size // 20), replace=False)] = np.nan
    flat[0] = np.nan
    return x


def _general(dY, X, geo, storage_order=0):
    """The general 3-D kernels on the same (B, D, H, W) views as pool._run/_run_grad."""
    n, c, *sp = X.shape
    g = ref.pool_geometry(
        "MaxPool",
        tuple(sp),
        geo["kernel_shape"],
        geo.get("strides"),
        geo.get("pads"),
        "NOTSET",
        geo.get("dilations"),
        geo.get("ceil_mode", 0),
    )
    ones = (1,) * (3 - len(sp))
    x = np.ascontiguousarray(X).reshape((n * c, *ones, *sp))
    y = np.empty((n * c, *ones, *g.out), X.dtype)
    idx = np.empty(y.shape, np.int64)
    args = [pool._as3(v, f) for v, f in ((g.kernel, 1), (g.strides, 1), (g.dilations, 1))]
    pads = [pool._as3(g.pads_begin, 0), pool._as3(g.pads_end, 0)]
    pool._pool_kernel(x, y, idx, *args, *pads, True, False, storage_order == 1)
    dx = np.zeros(x.shape, X.dtype)
    dy = np.ascontiguousarray(dY).reshape(y.shape)
    pool._pool_grad_kernel(dy, x, dx, *args, *pads, True, False)
    out = (n, c, *g.out)
    return y.reshape(out), idx.reshape(out), dx.reshape(X.shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("name", GEOMETRIES)
def test_flat_max_kernels_equal_the_general_ones(name, storage_order, dtype):
    geo = GEOMETRIES[name]
    x = _data(SHAPES.get(name, (2, 3, 9, 10)), dtype)
    y, idx = MAX_POOL(x, storage_order=storage_order, **geo)
    dy = np.random.default_rng(4).standard_normal(y.shape).astype(dtype)
    dx = MAX_POOL_GRAD(dy, x, **geo)
    want_y, want_idx, want_dx = _general(dy, x, geo, storage_order)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(idx, want_idx)
    np.testing.assert_array_equal(dx, want_dx)
    assert np.isnan(y).any() and (idx == -1).any() == (name == "window_in_padding")


def test_the_flat_kernels_are_the_ones_that_run(monkeypatch):
    calls = []

    def spy(kernel):
        def run(*args):
            calls.append(kernel.__name__)
            return kernel(*args)

        run.__name__ = kernel.__name__
        return run

    kernels = ("_max_pool_2d", "_max_pool_grad_2d", "_pool_kernel", "_pool_grad_kernel")
    for name in (*kernels, "_max_pool_pairs", "_max_pool_grad_pairs"):
        monkeypatch.setattr(pool, name, spy(getattr(pool, name)))
    x = _data((2, 3, 9, 10), np.float32)
    y, _ = MAX_POOL(x, **GEOMETRIES["resnet_stem"])
    MAX_POOL_GRAD(np.ones_like(y), x, **GEOMETRIES["resnet_stem"])
    x3 = _data((1, 2, 4, 5, 6), np.float32)
    MAX_POOL(x3, kernel_shape=[3, 3, 3])  # 3-D, three wide: general
    y, _ = MAX_POOL(x3, kernel_shape=[2, 2, 2], strides=[2, 2, 2])
    MAX_POOL_GRAD(np.ones_like(y), x3, kernel_shape=[2, 2, 2], strides=[2, 2, 2])
    MAX_POOL(x3, kernel_shape=[2, 2, 2], strides=[2, 2, 2], storage_order=1)  # general
    MAX_POOL(x3, kernel_shape=[2, 2, 2], strides=[2, 2, 2], pads=[0, 0, 1] * 2)
    want = ["_max_pool_2d", "_max_pool_grad_2d", "_pool_kernel", "_max_pool_pairs"]
    assert calls == [*want, "_max_pool_grad_pairs", "_pool_kernel", "_pool_kernel"]
