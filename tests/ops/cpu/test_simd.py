"""The explicit vector intrinsics (``dfdl.ops.cpu.simd``) against numpy, float32 and
float64: loads and stores at unaligned offsets, the broadcast multiply-add (one
rounding, as numba's contracted ``s += a * b``), the in-register transpose and the
masked store that must not touch the lanes outside its range."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from dfdl.ops.cpu.simd import (
    vadd,
    vfma_bcast,
    vload,
    vstore,
    vstore_lanes,
    vtranspose,
    vzero,
)

DTYPES = [np.float32, np.float64]


def _lanes(dtype) -> int:
    return 64 // np.dtype(dtype).itemsize


@numba.njit
def _axpy_rows(x, w, out, offset):
    acc = vzero(w)
    lanes = out.size
    for i in range(x.size):
        acc = vfma_bcast(acc, x, i, vload(w, offset + i * lanes))
    vstore(out, 0, vadd(acc, acc))


@numba.njit(fastmath={"contract"})
def _axpy_scalar(x, w, out, offset):
    lanes = out.size
    for m in range(lanes):
        s = out.dtype.type(0)
        for i in range(x.size):
            s += x[i] * w[offset + i * lanes + m]
        out[m] = s + s


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_multiply_add_equals_the_contracted_scalar_loop(dtype):
    lanes = _lanes(dtype)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(37).astype(dtype)
    w = rng.standard_normal(37 * lanes + 3).astype(dtype)
    got, want = np.empty(lanes, dtype), np.empty(lanes, dtype)
    _axpy_rows(x, w, got, 3)  # offset 3: unaligned vector loads
    _axpy_scalar(x, w, want, 3)
    assert np.array_equal(got, want)
    np.testing.assert_allclose(got, 2 * (x @ w[3:].reshape(37, lanes)), rtol=1e-4)


@numba.njit
def _transpose16(a, out):
    n = a.shape[1]
    t = vtranspose(
        (
            vload(a, 0),
            vload(a, n),
            vload(a, 2 * n),
            vload(a, 3 * n),
            vload(a, 4 * n),
            vload(a, 5 * n),
            vload(a, 6 * n),
            vload(a, 7 * n),
            vload(a, 8 * n),
            vload(a, 9 * n),
            vload(a, 10 * n),
            vload(a, 11 * n),
            vload(a, 12 * n),
            vload(a, 13 * n),
            vload(a, 14 * n),
            vload(a, 15 * n),
        )
    )
    for k in numba.literal_unroll((0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)):
        vstore(out, k * n, t[k])


@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose_in_lane_blocks(dtype):
    lanes = _lanes(dtype)
    a = np.arange(16 * lanes, dtype=dtype).reshape(16, lanes)
    out = np.empty_like(a)
    _transpose16(a, out)
    # vector h*lanes + m: lane m of rows h*lanes .. h*lanes + lanes
    want = np.concatenate([a[h * lanes : (h + 1) * lanes].T for h in range(16 // lanes)])
    assert np.array_equal(out, want)


@numba.njit
def _store_lanes(v, out, index, lo, hi):
    vstore_lanes(out, index, vload(v, 0), lo, hi)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index, lo, hi", [(4, 0, 16), (4, 3, 7), (-3, 3, 9), (2, 5, 5)])
def test_masked_store_writes_only_its_lanes(dtype, index, lo, hi):
    lanes = _lanes(dtype)
    v = np.arange(1, lanes + 1, dtype=dtype)
    out = np.full(40, -1, dtype)
    _store_lanes(v, out, index, lo, hi)
    want = np.full(40, -1, dtype)
    for k in range(max(lo, 0), min(hi, lanes)):
        want[index + k] = v[k]
    assert np.array_equal(out, want)
