"""How many trials run at once by default: what the workers' memory holds by the plan's
working set, at most two per worker thread and at most a wave."""

from __future__ import annotations

import dask

from dfdl.plan.compile import Workers
from dfdl.tuning.tuner import choose_concurrency

GiB = 2**30


def test_concurrency_is_bounded_by_threads_memory_and_the_wave():
    roomy = Workers(cores=2, memory_limit=64 * GiB)
    assert choose_concurrency(GiB // 1024, roomy, threads=2, wave=8) == 4
    assert choose_concurrency(GiB // 1024, roomy, threads=8, wave=8) == 8
    assert choose_concurrency(GiB // 1024, roomy, threads=8, wave=3) == 3
    tight = Workers(cores=2, memory_limit=4 * GiB)
    # Dask keeps 60% of a 4 GiB limit in memory: two trials of 1 GiB, not four
    with dask.config.set({"distributed.worker.memory.target": 0.6}):
        assert choose_concurrency(GiB, tight, threads=2, wave=8) == 2
        assert choose_concurrency(64 * GiB, tight, threads=2, wave=8) == 1  # one at a time
    with dask.config.set({"distributed.worker.memory.target": 0.9}):
        assert choose_concurrency(GiB, tight, threads=2, wave=8) == 3
    assert choose_concurrency(GiB, Workers(cores=2, memory_limit=None), threads=2, wave=8) == 4
