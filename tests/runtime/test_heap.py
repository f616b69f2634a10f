"""Freed tile memory goes back to the system (dfdl.runtime.heap), on a real worker."""

from __future__ import annotations

import os
import time

import psutil
import pytest
from distributed import Client

import dfdl
from dfdl.runtime import heap

pytestmark = pytest.mark.skipif(
    heap.free_heap_bytes() is None, reason="needs glibc >= 2.33 (mallinfo2, malloc_trim)"
)

MiB = 2**20


def _fragment(total: int = 256 * MiB, piece: int = 96 * 1024) -> int:
    """Allocate ``total`` bytes in heap-sized pieces, keep every 16th piece (so the heap's
    top cannot shrink), free the rest; return the resident bytes after the frees."""
    import numpy as np

    pieces = [np.ones(piece // 8) for _ in range(total // piece)]
    keep = pieces[::16]
    del pieces
    fragment_keep.append(keep)  # alive until the next call
    return psutil.Process().memory_info().rss


fragment_keep: list = []


def _rss(dask_worker=None) -> int:
    return psutil.Process().memory_info().rss


def test_release_returns_free_heap_pages_in_the_middle_of_the_heap():
    fragment_keep.clear()
    # earlier tests in this process may have left freed heap resident, which the pieces
    # below would reuse without growing the process: give it back first
    heap.release_free_heap()
    before = psutil.Process().memory_info().rss
    after_free = _fragment()
    free = heap.free_heap_bytes()
    assert free > 128 * MiB  # freed, but still held by malloc
    assert after_free - before > 128 * MiB  # and still resident
    heap.release_free_heap()
    released = psutil.Process().memory_info().rss
    assert after_free - released > 128 * MiB
    # malloc still counts the released middle pages as free (madvise keeps its chunks);
    # only a trimmed top shrinks the count, and the heap's top may be in use (other
    # threads of this process, a Dask client's or pytest's, may free a few KB meanwhile)
    assert heap.free_heap_bytes() <= free + MiB
    fragment_keep.clear()


def _trimmer(floor: int, threshold: int) -> heap.HeapTrimmer:
    trimmer = heap.HeapTrimmer()
    trimmer._process, trimmer.floor, trimmer.threshold = psutil.Process(), floor, threshold
    return trimmer


def test_under_the_floor_the_check_never_walks_the_heap(monkeypatch):
    """``mallinfo2`` holds the malloc lock the task threads wait on: a worker whose
    resident memory is under the floor must not call it at every check."""
    calls = []
    monkeypatch.setattr(heap, "free_heap_bytes", lambda: calls.append(1) or 2**40)
    monkeypatch.setattr(heap, "release_free_heap", lambda: True)
    low = _trimmer(floor=2**62, threshold=0)
    low._check()
    assert calls == [] and low.trims == 0
    high = _trimmer(floor=0, threshold=2**30)
    high._check()
    assert calls == [1] and high.trims == 1


def test_far_under_the_floor_the_worker_is_checked_less_often():
    from tornado.ioloop import PeriodicCallback

    trimmer = _trimmer(floor=2**62, threshold=2**30)
    trimmer._callback = PeriodicCallback(trimmer._check, 1000 * trimmer.interval)
    trimmer._check()
    assert trimmer._callback.callback_time == 1000 * heap.IDLE_INTERVAL_S
    trimmer.floor = trimmer._rss()  # now at the floor: checked at the full rate again
    trimmer._check()
    assert trimmer._callback.callback_time == 1000 * heap.INTERVAL_S < 1000 * heap.IDLE_INTERVAL_S


def test_trim_threshold_scales_with_the_limit():
    assert heap.trim_threshold(2**30) == 2**30 // 32
    assert heap.trim_threshold(64 * MiB) == heap.TRIM_MIN_BYTES
    assert heap.trim_threshold(None) > 2**60  # no limit: never trims


def test_trim_floor_is_half_the_lowest_threshold_dask_acts_on():
    assert heap.trim_floor(2**30, (0.7, 0.8, 0.95)) == int(2**30 * 0.35)
    assert heap.trim_floor(2**30, (False, 0.8, None)) == int(2**30 * 0.4)
    assert heap.trim_floor(2**30, (False, False, False)) == 2**29  # all off: the limit's
    assert heap.trim_floor(None) > 2**60


def _plugin_trims(dask_worker) -> int | None:
    plugin = dask_worker.plugins.get(heap.HeapTrimmer.name)
    return None if plugin is None else plugin.trims


def _cluster(kind: str, limit: str = "768MiB"):
    """One worker: dfdl's (the trimmer preloaded), plain Dask's, or plain Dask's with
    :func:`heap.install`. At 768 MiB, fragmenting 256 MiB takes it well over the trim
    floor (spill 0.7: 269 MiB)."""
    from distributed import LocalCluster

    if kind == "dfdl":
        return dfdl.LocalCluster(1, memory_limit=limit, dashboard_address=None)
    return LocalCluster(
        n_workers=1, threads_per_worker=1, memory_limit=limit, dashboard_address=None
    )


def _floor(dask_worker) -> int:
    return dask_worker.plugins[heap.HeapTrimmer.name].floor


@pytest.mark.parametrize("kind", ["plain", "dfdl", "installed"])
def test_a_worker_with_the_trimmer_gives_freed_memory_back(kind):
    with _cluster(kind) as cluster, Client(cluster) as client:
        if kind == "installed":
            heap.install(client)
        (idle,) = client.run(_rss).values()
        (peak,) = client.run(_fragment).values()
        assert peak - idle > 128 * MiB
        if kind != "plain":
            (floor,) = client.run(_floor).values()
            assert peak > floor + 64 * MiB  # the test's premise: over the floor
        deadline = time.monotonic() + 5
        while True:
            (now,) = client.run(_rss).values()
            if kind == "plain" or now - idle < 64 * MiB or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        (trims,) = client.run(_plugin_trims).values()
        if kind == "plain":
            time.sleep(0.5)
            (now,) = client.run(_rss).values()
            assert trims is None
            assert now - idle > 128 * MiB  # without it the freed memory stays resident
        else:
            assert trims >= 1
            assert now - idle < 64 * MiB  # back near the idle footprint


def test_a_worker_far_under_its_thresholds_keeps_its_free_heap():
    """Under the floor trimming would only cost page faults: the next step allocates the
    same memory again."""
    with _cluster("dfdl", "8GiB") as cluster, Client(cluster) as client:
        (idle,) = client.run(_rss).values()
        (peak,) = client.run(_fragment).values()
        (floor,) = client.run(_floor).values()
        assert peak - idle > 128 * MiB
        assert peak < floor  # the premise: 0.35 * 8 GiB
        time.sleep(0.5)  # 25 checks
        (now,) = client.run(_rss).values()
        (trims,) = client.run(_plugin_trims).values()
        assert trims == 0
        assert now - idle > 128 * MiB


def _measured_after_fragmenting(dask_worker) -> tuple[int, int]:
    """Dask's own measurement of the worker's memory, just after freeing fragmented heap
    (before the trimmer's periodic check can run: this holds the event loop)."""
    plugin = dask_worker.plugins[heap.HeapTrimmer.name]
    plugin._callback.stop()  # only the measurement may trim here
    try:
        rss = _fragment()
        return rss, dask_worker.monitor.get_process_memory()
    finally:
        plugin._callback.start()


def test_dask_measures_the_worker_after_freed_heap_is_trimmed():
    """Dask's spill loop evicts a tile, then measures the process: the measurement must
    see the tile's memory gone, or the loop evicts far more than it needs."""
    with _cluster("dfdl") as cluster, Client(cluster) as client:
        ((rss, measured),) = client.run(_measured_after_fragmenting).values()
        assert rss - measured > 128 * MiB


def test_a_restarted_worker_has_the_trimmer_again():
    with _cluster("dfdl") as cluster, Client(cluster) as client:
        (before,) = client.run(os.getpid).values()
        client.restart()
        (after,) = client.run(os.getpid).values()
        assert after != before
        assert None not in client.run(_plugin_trims).values()
