"""Freed tile memory goes back to the system (dfdl.scheduler.heap), on a real worker."""

from __future__ import annotations

import time

import psutil
import pytest
from distributed import Client

import dfdl
from dfdl.scheduler import heap

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
    before = psutil.Process().memory_info().rss
    after_free = _fragment()
    free = heap.free_heap_bytes()
    assert free > 128 * MiB  # freed, but still held by malloc
    assert after_free - before > 128 * MiB  # and still resident
    heap.release_free_heap()
    released = psutil.Process().memory_info().rss
    assert after_free - released > 128 * MiB
    assert heap.free_heap_bytes() < free
    fragment_keep.clear()


def test_trim_threshold_scales_with_the_limit():
    assert heap.trim_threshold(2**30) == 2**30 // 32
    assert heap.trim_threshold(64 * MiB) == heap.TRIM_MIN_BYTES
    assert heap.trim_threshold(None) > 2**60  # no limit: never trims


def _plugin_trims(dask_worker) -> int | None:
    plugin = dask_worker.plugins.get(heap.HeapTrimmer.name)
    return None if plugin is None else plugin.trims


@pytest.mark.parametrize("installed", [False, True])
def test_a_worker_with_the_trimmer_gives_freed_memory_back(installed):
    with (
        dfdl.LocalCluster(1, memory_limit="2GiB", dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        if installed:
            heap.install(client)
        (idle,) = client.run(_rss).values()
        (peak,) = client.run(_fragment).values()
        assert peak - idle > 128 * MiB
        deadline = time.monotonic() + 5
        while True:
            (now,) = client.run(_rss).values()
            if not installed or now - idle < 64 * MiB or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        (trims,) = client.run(_plugin_trims).values()
        if installed:
            assert trims >= 1
            assert now - idle < 64 * MiB  # back near the idle footprint
        else:
            time.sleep(0.5)
            (now,) = client.run(_rss).values()
            assert trims is None
            assert now - idle > 128 * MiB  # without it the freed memory stays resident
