"""Per-thread scratch arrays (``dfdl.ops.cpu.scratch``): reuse within a thread, separate
memory across threads and names, alignment, and no caching above the size cap."""

from __future__ import annotations

import threading

import numpy as np

from dfdl.ops.cpu import scratch as sc


def test_same_name_reuses_memory_and_grows():
    a = sc.scratch("t.reuse", (100,), np.float32)
    b = sc.scratch("t.reuse", (50, 2), np.float32)
    assert a.ctypes.data == b.ctypes.data and b.shape == (50, 2)
    c = sc.scratch("t.reuse", (10_000,), np.float64)
    assert c.shape == (10_000,) and c.dtype == np.float64
    assert sc.scratch("t.reuse", (10,), np.float32).ctypes.data == c.ctypes.data


def test_names_and_threads_do_not_share():
    a = sc.scratch("t.one", (64,), np.float32)
    b = sc.scratch("t.two", (64,), np.float32)
    assert not np.shares_memory(a, b)
    seen = []
    t = threading.Thread(target=lambda: seen.append(sc.scratch("t.one", (64,), np.float32)))
    t.start()
    t.join()
    assert not np.shares_memory(a, seen[0])


def test_views_are_aligned_for_vectors():
    for n in (1, 3, 1000, 12345):
        assert sc.scratch("t.align", (n,), np.float32).ctypes.data % 64 == 0


def test_above_the_cap_is_a_fresh_array(monkeypatch):
    monkeypatch.setattr(sc, "MAX_BYTES", 1024)
    a = sc.scratch("t.cap", (1024,), np.float32)
    b = sc.scratch("t.cap", (1024,), np.float32)
    assert not np.shares_memory(a, b)


def test_fit_to_worker_only_lowers_the_cap(monkeypatch):
    monkeypatch.setattr(sc, "MAX_BYTES", 64 * 2**20)
    assert sc.fit_to_worker(None, 2) == 64 * 2**20
    assert sc.fit_to_worker(64 * 2**30, 2) == 64 * 2**20  # a large worker: unchanged
    assert sc.fit_to_worker(512 * 2**20, 2) == 512 * 2**20 // 32 // 4
    assert sc.fit_to_worker(64 * 2**30, 2) == 512 * 2**20 // 32 // 4  # never raised
