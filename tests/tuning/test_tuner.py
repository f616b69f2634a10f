"""How many trials run at once by default: what the workers' memory holds by the plan's
working set, at most two per worker thread and at most a wave."""

from __future__ import annotations

from dfdl.plan.compile import Workers
from dfdl.plan.estimate import managed_target
from dfdl.tuning.tuner import choose_concurrency

GiB = 2**30


def test_concurrency_is_bounded_by_threads_memory_and_the_wave():
    roomy = Workers(cores=2, memory_limit=64 * GiB)
    assert choose_concurrency(GiB // 1024, roomy, threads=2, wave=8) == 4
    assert choose_concurrency(GiB // 1024, roomy, threads=8, wave=8) == 8
    assert choose_concurrency(GiB // 1024, roomy, threads=8, wave=3) == 3
    tight = Workers(cores=2, memory_limit=4 * GiB)
    held = int(managed_target() * 4 * GiB // GiB)  # trials of 1 GiB the limit holds
    assert 1 <= held < 4
    assert choose_concurrency(GiB, tight, threads=2, wave=8) == held
    assert choose_concurrency(64 * GiB, tight, threads=2, wave=8) == 1  # one at a time
    assert choose_concurrency(GiB, Workers(cores=2, memory_limit=None), threads=2, wave=8) == 4
