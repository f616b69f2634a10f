"""The worker preload of dfdl's clusters (dfdl.runtime.worker_setup), on real workers."""

from __future__ import annotations

import logging
import os
import sys
import threading

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

import dfdl
from dfdl.runtime import heap, worker_setup
from dfdl.runtime.cluster import WORKER_PRELOAD
from dfdl.taskgraph import tile_exec

PAUSE = "Worker is at %d%% memory usage. Pausing worker.  Process memory: %s"
RESUME = "Worker is at %d%% memory usage. Resuming worker. Process memory: %s"
OTHER = "Unmanaged memory use is high. This may indicate a memory leak"


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord(
        worker_setup.MEMORY_LOGGER, logging.WARNING, __file__, 1, message, (71, "7 MiB"), None
    )


@pytest.mark.parametrize("message,kept", [(PAUSE, False), (RESUME, False), (OTHER, True)])
def test_routine_pauses_drops_only_pause_and_resume(message, kept):
    assert worker_setup.RoutinePauses().filter(_record(message)) is kept


def test_routine_pauses_kept_when_the_logger_is_at_debug():
    logger = logging.getLogger(worker_setup.MEMORY_LOGGER)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        assert worker_setup.RoutinePauses().filter(_record(PAUSE))
    finally:
        logger.setLevel(level)


def _setup(dask_worker) -> tuple[bool, bool, bool]:
    """(trimmer installed, pause warning logged, other warning logged) on the worker."""
    logger = logging.getLogger(worker_setup.MEMORY_LOGGER)
    return (
        heap.HeapTrimmer.name in dask_worker.plugins,
        bool(logger.filter(_record(PAUSE))),
        bool(logger.filter(_record(OTHER))),
    )


def test_dfdl_workers_pause_quietly_at_the_spill_line():
    with (
        dfdl.LocalCluster(1, memory_limit="1GiB", dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        (setup,) = client.run(_setup).values()
        assert setup == (True, False, True)


def test_workers_pausing_above_the_spill_line_keep_dasks_warnings():
    """Preloaded on a cluster that keeps Dask's pause (0.8) above its spill line (0.7):
    pausing is not routine there, so its warnings stay."""
    with (
        dask.config.set({"distributed.worker.preload": [WORKER_PRELOAD]}),
        LocalCluster(
            n_workers=1, threads_per_worker=1, memory_limit="1GiB", dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        (setup,) = client.run(_setup).values()
        assert setup == (True, True, True)


def _scratch_cap() -> tuple[int, int]:
    from dfdl.ops.cpu import scratch
    from dfdl.taskgraph import gang

    return scratch.MAX_BYTES, gang.HELPERS


def test_scratch_memory_fits_the_worker_memory_limit():
    """A 256 MiB worker with 2 task threads and 1 gang helper keeps at most 1/32 of its
    limit as scratch: 256 MiB / 32 / (3 threads x 2 names) per buffer; the large grids
    of a convolution are then fresh arrays, as they were before scratch memory."""
    with (
        dfdl.LocalCluster(1, threads_per_worker=2, memory_limit="256MiB") as cluster,
        Client(cluster) as client,
    ):
        ((cap, helpers),) = client.run(_scratch_cap).values()
    assert helpers == 1
    assert cap == 256 * 2**20 // 32 // 6


def _task_thread_nice():
    return np.asarray(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))


def _nice_of_a_tile_task(client) -> int:
    meta = (_task_thread_nice, {}, (), ((),), "nice probe")
    return int(client.submit(tile_exec.run_tile, meta, pure=False).result())


#: Linux's largest nice value: a thread asked to be nicer than that stays at it
MAX_NICE = 19


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_tile_tasks_run_at_the_task_nice_value():
    base = os.getpriority(os.PRIO_PROCESS, 0)  # the suite itself may run under nice
    with dfdl.LocalCluster(1, threads_per_worker=2) as cluster, Client(cluster) as client:
        assert _nice_of_a_tile_task(client) == min(MAX_NICE, base + worker_setup.TASK_NICE)
        # the worker's event loop (client.run runs there) keeps the process's value
        (loop,) = client.run(_task_thread_nice).values()
        assert int(loop) == base
    with (
        dask.config.set({"dfdl.worker.task-nice": 3}),
        dfdl.LocalCluster(1, threads_per_worker=1) as cluster,
        Client(cluster) as client,
    ):
        assert _nice_of_a_tile_task(client) == min(MAX_NICE, base + 3)
