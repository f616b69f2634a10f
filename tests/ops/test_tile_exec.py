"""``run_tile``: the function every tile task calls."""

from __future__ import annotations

import numpy as np

from dfdl.ops import REGISTRY
from dfdl.ops.tile_exec import run_tile
from tests.ops.case import rand


def unaligned(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` one byte off alignment, as tiles pickled inside a graph can arrive."""
    buf = np.empty(a.nbytes + 1, np.uint8)
    out = buf[1:].view(a.dtype).reshape(a.shape)
    out[...] = a
    assert not out.flags.aligned
    return out


def test_unaligned_tiles_give_bit_identical_results():
    # numpy's matmul skips BLAS for unaligned operands and rounds differently; run_tile
    # must not let the byte offset a tile happened to arrive at change the result.
    a, b, c = rand(1, 32, seed=1), rand(64, 32, seed=2), rand(64, seed=3)
    meta = (
        REGISTRY["Gemm"].kernel("cpu"),
        {"transB": 1},
        (("value", 0), ("value", 1), ("const", unaligned(c))),
        ((1, 64),),
        "node 'g' (Gemm) tile (0, 0)",
    )
    want = run_tile(meta, a, b)
    np.testing.assert_array_equal(run_tile(meta, unaligned(a), unaligned(b)), want)
