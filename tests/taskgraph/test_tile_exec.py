"""``run_tile``: the function every tile task calls."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from dfdl.ops import REGISTRY
from dfdl.taskgraph import tile_exec
from dfdl.taskgraph.tile_exec import combine, run_tile
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


def test_outputs_rest_c_contiguous_and_own_their_memory():
    # a kernel returning a transposed view: passed on as is, a consumer in the same
    # worker would see another layout than one receiving the transferred copy, and
    # BLAS sums a transposed operand in another order (results would depend on
    # placement); a view would also pin its whole base array in memory
    base = rand(8, 6, seed=4)
    meta = (lambda x: x.T, {}, (("value", 0),), ((6, 8),), "node 't' (Transpose) tile (0, 0)")
    out = run_tile(meta, base)
    assert out.flags.c_contiguous and out.base is None
    np.testing.assert_array_equal(out, base.T)
    part = (lambda x: x[:2], {}, (("value", 0),), ((2, 6),), "node 's' (Slice) tile (0,)")
    assert run_tile(part, base).base is None
    whole = (lambda x: x.reshape(6, 8), {}, (("value", 0),), ((6, 8),), "r")
    fresh = rand(8, 6, seed=5).copy()
    assert run_tile(whole, fresh).base is fresh  # a whole-array view costs no copy


def test_strided_inputs_give_the_same_result_as_contiguous_ones():
    a, b = rand(4, 64, seed=6), rand(64, 1, seed=7)
    meta = (np.matmul, {}, (("value", 0), ("value", 1)), ((4, 1),), "node 'm' (MatMul)")
    want = run_tile(meta, a, b)
    transposed = np.asfortranarray(b)  # same values, the other layout
    strided = np.repeat(a, 2, axis=1)[:, ::2]
    np.testing.assert_array_equal(run_tile(meta, strided, transposed), want)


@pytest.mark.parametrize("how, ufunc", [("sum", np.add), ("max", np.maximum), ("min", np.minimum)])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("shape", [(), (7,), (3, 5)])
def test_combine_folds_partials_left_to_right_into_a_new_array(how, ufunc, n, shape):
    parts = [rand(*shape, seed=s).astype(np.float32) for s in range(n)]
    parts[0] = parts[0] * 1e4  # large + small: a different summation order would round apart
    before = [p.copy() for p in parts]
    want = parts[0]
    for p in parts[1:]:
        want = ufunc(want, p)
    got = combine(how, *parts)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == shape
    np.testing.assert_array_equal(got, want)
    assert all(got is not p and not np.shares_memory(got, p) for p in parts)
    for p, b in zip(parts, before):  # partials are Dask's data: never written to
        np.testing.assert_array_equal(p, b)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_tile_tasks_make_their_thread_nicer_by_task_nice(monkeypatch):
    def nice():
        return np.asarray(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    base = os.getpriority(os.PRIO_PROCESS, 0)
    meta = (nice, {}, (), ((),), "nice probe")
    monkeypatch.setattr(tile_exec, "TASK_NICE", 4)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(run_tile, meta).result()
        again = pool.submit(run_tile, meta).result()  # applied once per thread
    assert int(first) == int(again) == base + 4
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base


def test_several_outputs_are_sized_exactly_for_dask():
    from dask.sizeof import sizeof

    # one large tile among many small ones, as a grouped optimizer update returns them
    values = [np.zeros(2**18, np.float32)] + [np.zeros(4, np.float32)] * 29
    exact = sum(v.nbytes for v in values)
    # what the type fixes: Dask samples 10 items of a longer plain tuple
    plain = {sizeof(tuple(values)) - sys.getsizeof(tuple(values)) for _ in range(200)}
    assert len(plain) > 1, plain
    outputs = tile_exec.Outputs(values)
    assert {sizeof(outputs) - sys.getsizeof(outputs) for _ in range(200)} == {exact}

    def pair(x):
        return x, x + 1

    meta = (pair, {}, (("value", 0),), ((3,), (3,)), "node 'p' (Pair) tile 0")
    out = run_tile(meta, np.zeros(3, np.float32))
    assert isinstance(out, tile_exec.Outputs) and len(out) == 2
    assert out[1].tolist() == [1.0, 1.0, 1.0]


# ---- device arrays: tiles of another array namespace flow through as they are -------


@pytest.fixture
def device():
    """array-api-strict on a non-default device: converting one of its arrays to numpy
    raises, as a GPU array does, so any numpy call on a tile fails the test."""
    xp = pytest.importorskip("array_api_strict", reason="the device stand-in is not installed")
    return xp, xp.Device("device1")


def _on(device, values) -> object:
    xp, dev = device
    return xp.asarray(np.asarray(values, np.float64), device=dev)


def _back(x) -> np.ndarray:
    """A device array's values as numpy (moved to the default device first)."""
    xp = x.__array_namespace__()
    return np.asarray(xp.asarray(x, device=xp.Device("CPU_DEVICE")))


def test_device_tiles_are_assembled_run_and_combined_on_their_device(device):
    xp, dev = device
    with pytest.raises(RuntimeError):
        np.asarray(_on(device, [1.0]))  # the stand-in refuses numpy, as a GPU array would
    left, right = _on(device, [[1.0, 2.0], [3.0, 4.0]]), _on(device, [[5.0], [6.0]])
    pieces = ((0, None, (slice(0, 2), slice(0, 2)), (slice(0, 2), slice(0, 2))),
              (1, None, (slice(0, 2), slice(0, 1)), (slice(0, 2), slice(2, 3))))  # fmt: skip
    meta = (
        xp.add,
        {},
        (("assemble", (2, 3), None, pieces), ("slice", 0, None, (slice(0, 2), slice(0, 1)))),
        ((2, 3),),
        "node 'a' (Add) tile (0,)",
    )
    out = run_tile(meta, left, right)
    assert out.device == dev
    np.testing.assert_array_equal(_back(out), [[2.0, 3.0, 6.0], [6.0, 7.0, 9.0]])
    total = combine("sum", out, out, out)
    assert total.device == dev
    np.testing.assert_array_equal(_back(total), 3 * _back(out))
    assert _back(combine("max", out, -out)).tolist() == _back(out).tolist()


def test_device_moments_merge_like_numpy(device):
    rows = (
        np.array([[2.0, 1.0, 0.5], [0.0, 0.0, 0.0]]),
        np.array([[3.0, 2.0, 1.5], [1.0, 4.0, 0.0]]),
    )
    want = combine("moments", *rows)
    got = combine("moments", *(_on(device, r) for r in rows))
    np.testing.assert_allclose(_back(got), want, rtol=1e-15)
