"""The worker preload of dfdl's clusters: what every dfdl worker process sets up.

``dask worker --preload dfdl.runtime.worker_setup`` (dask-jobqueue:
``worker_extra_args=["--preload", "dfdl.runtime.worker_setup"]``) runs
:func:`dask_setup` in the worker when it starts, and again in a worker the nanny
restarts. :func:`dfdl.LocalCluster`, the embedded cluster and
:func:`dfdl.cluster.slurm` preload it by themselves. It

- installs :class:`dfdl.runtime.heap.HeapTrimmer`, so the worker's resident memory
  follows its tiles;
- replaces Dask's per-worker task counter by
  :class:`dfdl.runtime.task_counter.LazyTaskCounter` (same metrics);
- gives the worker one helper thread fewer than its task threads for gangs of sibling
  tasks (:mod:`dfdl.taskgraph.gang`), and caps the kernels' per-thread scratch memory,
  on task threads and helpers, to a share of the worker's memory limit
  (:func:`dfdl.ops.cpu.scratch.fit_to_worker`);
- runs tile tasks on threads at nice :data:`TASK_NICE` (dask config
  ``dfdl.worker.task-nice``; Linux), so the worker's event loop and the scheduler take
  a core as soon as they have a message; nice only orders threads that want one core;
- leaves Dask's "Pausing worker" / "Resuming worker" warnings out of the log when the
  worker pauses at its spill line (:func:`dfdl.runtime.cluster.pause_at_spill`), where
  pausing is routine; a worker that stays paused is still reported by the trainer;
- on a GPU cluster (``dfdl.LocalCluster(gpus=N)``), makes worker ``i`` see only the
  ``i``-th of the cluster's GPUs (:func:`pin_gpu`);
- leaves Ctrl-C to the worker's nanny (:func:`leave_interrupts_to_nanny`): a terminal's
  Ctrl-C reaches every process of its group, and a worker that dies of it mid-task
  prints a traceback while its nanny (or the embedded cluster's process) closes it.

:func:`dfdl.train` installs the same on any cluster it is given, as the worker plugin
:class:`WorkerSetup` (:func:`install`), which Dask also runs on workers that restart or
join later; the plugin moreover pauses each worker at its spill line
(:func:`pause_at_spill`), as dfdl's own clusters are configured to. A worker that ran the
preload is not set up twice (:data:`MARKER`).

None of it changes a value a task computes.

Example:
    >>> cfg = {"distributed.worker.preload": ["dfdl.runtime.worker_setup"]}
    >>> dask.config.set(cfg)  # doctest: +SKIP
    >>> install(Client(cluster))  # doctest: +SKIP

Measurements: ``docs/design/task-nice.md``, ``task-counter.md``, ``worker-memory.md``.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import dask
from distributed.diagnostics.plugin import WorkerPlugin

from dfdl.ops.cpu import scratch
from dfdl.runtime import task_counter
from dfdl.runtime.device_memory import DeviceSpillBuffer
from dfdl.runtime.heap import HeapTrimmer
from dfdl.taskgraph import exchange, gang, tile_exec, wire

#: nice value of the threads that run tile tasks (``dfdl.worker.task-nice`` overrides)
TASK_NICE = 10

#: attribute set on a worker once dfdl's setup ran there (preload or plugin)
MARKER = "_dfdl_worker_setup"

#: the logger Dask's memory monitor writes its pause and resume warnings to
MEMORY_LOGGER = "distributed.worker.memory"


class RoutinePauses(logging.Filter):
    """Drops Dask's pause/resume warnings (they stay at DEBUG level of the logger)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        routine = "Pausing worker" in message or "Resuming worker" in message
        return not routine or logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def _pauses_at_spill(worker) -> bool:
    manager = getattr(worker, "memory_manager", None)
    spill = getattr(manager, "memory_spill_fraction", False)
    pause = getattr(manager, "memory_pause_fraction", False)
    return bool(spill) and pause == spill


def quiet_routine_pauses(worker) -> bool:
    """Leave Dask's pause/resume warnings out of ``worker``'s log when it pauses at its
    spill line; returns whether it did.

    Example:
        >>> quiet_routine_pauses(worker)  # doctest: +SKIP
        True
    """
    if not _pauses_at_spill(worker):
        return False
    logger = logging.getLogger(MEMORY_LOGGER)
    if not any(isinstance(f, RoutinePauses) for f in logger.filters):
        logger.addFilter(RoutinePauses())
    return True


def leave_interrupts_to_nanny(worker) -> bool:
    """Ignore SIGINT in ``worker``'s process when a nanny looks after it (the nanny
    closes the worker on its own SIGINT or when its cluster closes); returns whether it
    did. A worker without a nanny keeps Ctrl-C, or nothing would stop it.

    Example:
        >>> leave_interrupts_to_nanny(worker)  # doctest: +SKIP
        True
    """
    if (
        not getattr(worker, "nanny", None)
        or threading.current_thread() is not threading.main_thread()
    ):
        return False
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return True


def pause_at_spill(worker) -> bool:
    """Pause ``worker`` at its spill line when its pause line is above it (Dask's default
    pause is 0.8 of the memory limit, the spill line 0.7); returns whether it changed.

    Above the spill line a worker's resident memory is more than its tiles: a task
    started there, as Dask starts them up to the pause line, can carry the process past
    the nanny's restart threshold (0.95). The planner sizes tasks for the pause line the
    workers report (:func:`dfdl.runtime.cluster.worker_memory_config`).

    Example:
        >>> pause_at_spill(worker)  # doctest: +SKIP
        True
    """
    manager = getattr(worker, "memory_manager", None)
    spill = getattr(manager, "memory_spill_fraction", False)
    pause = getattr(manager, "memory_pause_fraction", False)
    if not (spill and pause) or pause <= spill:
        return False
    manager.memory_pause_fraction = spill
    worker._dfdl_pause = pause  # what WorkerSetup.teardown puts back
    return True


#: the GPUs of a ``dfdl.LocalCluster(gpus=N)``, comma-separated, in its workers' environment
GPU_LIST_ENV = "DFDL_WORKER_GPUS"


def pin_gpu(worker) -> str | None:
    """Give worker ``i`` of a GPU cluster the ``i``-th GPU of :data:`GPU_LIST_ENV` (as
    its ``CUDA_VISIBLE_DEVICES``, before anything in the process starts CUDA); the GPU
    given, or None outside a GPU cluster.

    Example:
        >>> pin_gpu(worker)  # doctest: +SKIP
        '1'
    """
    devices = [d for d in os.environ.get(GPU_LIST_ENV, "").split(",") if d]
    if not devices:
        return None
    try:
        index = int(worker.name)
    except (TypeError, ValueError):
        index = 0
    os.environ["CUDA_VISIBLE_DEVICES"] = devices[index % len(devices)]
    return os.environ["CUDA_VISIBLE_DEVICES"]


#: the worker metric (sent with each heartbeat) that tells the dashboard the worker's device
DEVICE_METRIC = "dfdl_device"


def device_metric(worker) -> dict:
    """What a worker reports of its device with each heartbeat (:data:`DEVICE_METRIC`):
    ``gpu``, the GPU it uses (its ``CUDA_VISIBLE_DEVICES``; None for a worker without
    the ``GPU`` resource), and
    ``memory_bytes``, the bytes cupy's memory pool holds for arrays in use (None until a
    kernel has imported cupy: a heartbeat never starts CUDA); with a device memory limit
    (:mod:`dfdl.runtime.device_memory`), ``limit`` and ``spilled_bytes``, the bytes its
    tiles spilled off the device so far (else None).

    Example:
        >>> device_metric(None)["memory_bytes"] is None or "cupy" in sys.modules
        True
    """
    resources = getattr(getattr(worker, "state", None), "total_resources", None) or {}
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES") if resources.get("GPU", 0) > 0 else None
    cupy = sys.modules.get("cupy")
    used = None
    if cupy is not None and hasattr(cupy, "get_default_memory_pool"):
        used = int(cupy.get_default_memory_pool().used_bytes())
    data = getattr(worker, "data", None)
    limit = spilled = None
    if isinstance(data, DeviceSpillBuffer):
        limit, spilled = data.device_limit, data.device_spilled[1]
    return {"gpu": gpu, "memory_bytes": used, "limit": limit, "spilled_bytes": spilled}


async def dask_setup(worker) -> None:
    """Preload hook: sets up a dfdl worker (see the module docstring); a worker already
    set up (:data:`MARKER`) is left as it is.

    Example:
        >>> cfg = {"distributed.worker.preload": ["dfdl.runtime.worker_setup"]}
        >>> dask.config.set(cfg)  # doctest: +SKIP
    """
    if not hasattr(worker, "plugin_add"):  # a nanny or a scheduler
        return
    if getattr(worker, MARKER, False):
        return
    setattr(worker, MARKER, True)
    pin_gpu(worker)
    worker.metrics[DEVICE_METRIC] = device_metric
    quiet_routine_pauses(worker)
    leave_interrupts_to_nanny(worker)
    tile_exec.TASK_NICE = int(dask.config.get("dfdl.worker.task-nice", TASK_NICE))
    manager = getattr(worker, "memory_manager", None)
    threads = worker.state.nthreads
    gang.HELPERS = max(0, threads - 1)
    # the gangs' helpers run kernels too: their scratch counts against the same share
    scratch.fit_to_worker(getattr(manager, "memory_limit", None), threads + gang.HELPERS)
    task_counter.install(worker)
    exchange.install(worker)
    wire.install(worker, exchange.deliver)
    await worker.plugin_add(plugin=HeapTrimmer(), name=HeapTrimmer.name)


class WorkerSetup(WorkerPlugin):
    """dfdl's worker setup as a worker plugin, for clusters dfdl did not start: what
    :func:`dask_setup` does (once per worker), and :func:`pause_at_spill`.

    ``idempotent``: registering it again, as every :func:`dfdl.train` call does, leaves
    the workers alone.

    Example:
        >>> client.register_plugin(WorkerSetup())  # doctest: +SKIP
    """

    name = "dfdl-worker-setup"
    idempotent = True

    async def setup(self, worker) -> None:
        # pause first: the trimmer's floor and the quiet pauses read the pause line
        pause_at_spill(worker)
        quiet_routine_pauses(worker)  # also on a worker the preload set up before
        await dask_setup(worker)

    def teardown(self, worker) -> None:
        # unregistered: Dask's pause line again (the rest of the setup stays)
        pause = getattr(worker, "_dfdl_pause", None)
        if pause is not None:
            worker.memory_manager.memory_pause_fraction = pause
            del worker._dfdl_pause
            logger = logging.getLogger(MEMORY_LOGGER)
            for f in [f for f in logger.filters if isinstance(f, RoutinePauses)]:
                logger.removeFilter(f)


def install(client) -> None:
    """Register :class:`WorkerSetup` on ``client``'s cluster: every worker runs it now, and
    Dask runs it on each worker that restarts or joins later.

    Example:
        >>> install(Client("tcp://scheduler:8786"))  # doctest: +SKIP
    """
    client.register_plugin(WorkerSetup(), name=WorkerSetup.name)
