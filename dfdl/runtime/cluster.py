"""Clusters: dfdl's local clusters, the embedded one, and connecting to others.

:func:`local_cluster` (``dfdl.LocalCluster``) starts a ``distributed.LocalCluster`` with
dfdl's settings (:data:`DASK_CONFIG`, a pause at the spill line, the worker preload
:mod:`dfdl.runtime.worker_setup`, message batching of :mod:`dfdl.runtime.latency`).
:func:`embedded_client` is the cluster :func:`dfdl.train` starts when no client is
given: one worker process with one thread per core, so tiles never cross a process
boundary, BLAS and numba run one thread per task (parallelism comes from tiles) and
the scheduler's queuing is off (``worker-saturation: inf``); it stays up for the
process's next call. dfdl's local clusters are private: scheduler, nannies and workers
speak ``tls://`` with a certificate made for the cluster (``Security.temporary()``), so
only clients holding it (``Client(cluster)``) get in, and no HTTP server listens unless
a dashboard was asked for. :func:`connect` yields a given client or that one;
:func:`open_client` connects to a scheduler's address (TLS included) or raises a
:class:`~dfdl.errors.ConfigError` that says why not.

Guarantees: the settings here change where and when tasks run, never a value; every
worker, restarted ones too, runs dfdl's worker setup; a client without the cluster's
credentials is refused during the TLS handshake (``docs/user/security.md``).

Example:
    >>> parse_memory("1 KiB")
    1024
    >>> with connect(None) as client:  # doctest: +SKIP
    ...     client.nthreads()

Measurements: ``docs/design/embedded-cluster.md``, ``worker-memory.md``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import dask
from dask.utils import parse_bytes
from distributed import Client, Nanny, Scheduler, Worker
from distributed.security import Security

from dfdl.errors import ConfigError
from dfdl.runtime import latency
from dfdl.runtime.device_memory import DeviceSpillBuffer

#: dask settings dfdl's embedded cluster runs with: no queuing on the scheduler; arrays
#: under 32 MiB from the malloc heap, not fresh mmaps that fault their pages in on first
#: touch, with free heap over 128 MiB still going back to the system; one malloc arena,
#: so a tile freed by one task is reused by the next (``docs/design/embedded-cluster.md``)
DASK_CONFIG = {
    "distributed.scheduler.worker-saturation": float("inf"),
    "distributed.worker.daemon": False,
    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": 128 * 2**20,
    "distributed.nanny.pre-spawn-environ.MALLOC_MMAP_THRESHOLD_": 32 * 2**20,
    "distributed.nanny.pre-spawn-environ.MALLOC_ARENA_MAX": 1,
}

#: Dask's periodic work on every server's event loop that dfdl's clusters do less often,
#: unless the caller's dask config already sets them: the workers' statistical profiler
#: (10 ms in Dask) and the event-loop tick (20 ms). On 2 cores a worker's event loop took
#: 0.18 s of CPU per transformer step (7% of a core), 0.12-0.14 s with these two at 100
#: ms: every sample of the profiler walks the busy task thread's stack; every extra
#: worker process on the same cores pays it again (``docs/design/embedded-cluster.md``)
LOOP_CONFIG = {
    "distributed.worker.profile.interval": "100ms",
    "distributed.admin.tick.interval": "100ms",
}


def loop_config() -> dict:
    """:data:`LOOP_CONFIG`, less the keys the caller's dask config sets to other than
    Dask's defaults (the caller's choice wins).

    Example:
        >>> loop_config()["distributed.worker.profile.interval"]
        '100ms'
        >>> with dask.config.set({"distributed.worker.profile.interval": "5ms"}):
        ...     "distributed.worker.profile.interval" in loop_config()
        False
    """
    defaults = dask.config.merge(*dask.config.defaults)
    return {
        k: v
        for k, v in LOOP_CONFIG.items()
        if dask.config.get(k, None) == dask.config.get(k, None, config=defaults)
    }


def worker_dask_config(memory_limit) -> dict:
    """The dask settings dfdl's clusters start their servers with, for workers of
    ``memory_limit``: :data:`DASK_CONFIG`, :func:`loop_config`, :func:`malloc_config`
    and :func:`pause_at_spill`.

    Example:
        >>> worker_dask_config("8GiB")["distributed.admin.tick.interval"]
        '100ms'
    """
    return {
        **DASK_CONFIG,
        **loop_config(),
        **malloc_config(memory_limit),
        **pause_at_spill(),
    }


#: the worker preload of dfdl's clusters (:mod:`dfdl.runtime.worker_setup`)
WORKER_PRELOAD = "dfdl.runtime.worker_setup"

#: share of a worker's memory limit that glibc may keep as free heap (not returned to the
#: system): 128 MiB of retained heap is nothing for a worker of many GiB, but it doubled
#: the resident memory of 128 MiB workers in the beyond-memory benchmark
MALLOC_KEEP_FRACTION = 1 / 8


def malloc_config(memory_limit) -> dict:
    """``DASK_CONFIG``'s glibc thresholds scaled down for a small worker ``memory_limit``
    (bytes or a string; other values keep them): free heap kept at most
    ``MALLOC_KEEP_FRACTION`` of the limit, heap (not mmap) allocations up to a quarter
    of that."""
    try:
        limit = parse_bytes(memory_limit) if isinstance(memory_limit, str) else memory_limit
    except ValueError:
        return {}
    if not isinstance(limit, int) or limit <= 1:  # "auto", 0 (no limit), a fraction
        return {}
    key = "distributed.nanny.pre-spawn-environ."
    trim = min(DASK_CONFIG[key + "MALLOC_TRIM_THRESHOLD_"], int(limit * MALLOC_KEEP_FRACTION))
    mmap = min(DASK_CONFIG[key + "MALLOC_MMAP_THRESHOLD_"], max(128 * 2**10, trim // 4))
    return {key + "MALLOC_TRIM_THRESHOLD_": trim, key + "MALLOC_MMAP_THRESHOLD_": mmap}


def pause_at_spill() -> dict:
    """Dask config that pauses a worker at its spill threshold (when both are on; Dask's
    default pause is 0.8, the spill line 0.7).

    A paused worker starts no task. The planner sizes tasks to start below the pause
    line and end under :data:`dfdl.plan.estimate.HEADROOM` of the limit
    (:func:`dfdl.plan.estimate.task_budget`): at Dask's 0.8 that leaves a tenth of the
    limit per task, at the spill line a fifth (``docs/design/worker-memory.md``).

    Example:
        >>> with dask.config.set({"distributed.worker.memory.spill": 0.7,
        ...                       "distributed.worker.memory.pause": 0.8}):
        ...     pause_at_spill()
        {'distributed.worker.memory.pause': 0.7}
    """
    spill = dask.config.get("distributed.worker.memory.spill", False)
    pause = dask.config.get("distributed.worker.memory.pause", False)
    if spill and pause and pause > spill:
        return {"distributed.worker.memory.pause": spill}
    return {}


#: Dask's worker memory thresholds (``distributed.worker.memory.<name>``)
THRESHOLDS = ("target", "spill", "pause", "terminate")


def _thresholds(dask_worker) -> dict:
    manager = dask_worker.memory_manager
    return {k: getattr(manager, f"memory_{k}_fraction", None) for k in THRESHOLDS}


def worker_memory_config(client=None) -> dict:
    """Dask config entries with the memory thresholds the workers apply, for planning
    tiles on this side: those of ``client``'s workers (the highest of each, so the most
    cautious; a nanny's restart threshold included), else those of the embedded cluster
    (this process's config and :func:`pause_at_spill`).

    Example:
        >>> with dask.config.set(worker_memory_config(client)):  # doctest: +SKIP
        ...     tg, plan = plan_training(tg, memory_limit=worker_memory_limit(client))
    """
    if client is None:
        return pause_at_spill()
    found: list[dict] = []
    for nanny in (False, True):
        try:
            found += list(client.run(_thresholds, nanny=nanny).values())
        except Exception:  # noqa: BLE001 - no workers yet, or workers without nannies
            pass
    config = {}
    for k in THRESHOLDS:
        values = [v[k] for v in found if v.get(k) is not None]
        if values:
            on = [float(v) for v in values if v]
            config[f"distributed.worker.memory.{k}"] = max(on) if on else False
    return config


def default_workers() -> int:
    """The usable cores: worker threads of the embedded cluster."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def local_cluster(
    n_workers: int | None = None, *, gpus: int = 0, device_memory_limit=None, **kwargs
):
    """Start a ``distributed.LocalCluster`` with dfdl's settings (``dfdl.LocalCluster``).

    The embedded cluster of :func:`dfdl.train` is ``local_cluster()``. Every worker has
    a memory limit (dask's default ``"auto"``: this machine's memory shared among the
    worker processes) and spills tiles to its local directory beyond it; dfdl plans
    tiles so that every task fits in a quarter of the limit
    (:data:`dfdl.plan.tiling.TASK_MEMORY_FRACTION`).

    Args:
        n_workers: worker processes. Default: one process with a thread per core. With
            ``n_workers`` given, each process has one thread unless
            ``threads_per_worker`` says otherwise.
        gpus: GPU workers: one worker process per GPU (the first ``gpus`` of this
            machine's, or of ``CUDA_VISIBLE_DEVICES``), each seeing only its own GPU,
            with the resource ``GPU=1`` and two threads; dfdl then runs the tile
            kernels on the GPUs (:mod:`dfdl.ops.gpu`, cupy).
        device_memory_limit: with ``gpus``, the device memory each GPU worker's tiles
            may hold (bytes, or a string like ``"2GiB"``): past it the least recently
            used spill to the host and on to disk
            (:class:`~dfdl.runtime.device_memory.DeviceSpillBuffer`), and dfdl plans the
            tiles for it. Default: no limit (the whole GPU).
        **kwargs: passed to ``distributed.LocalCluster``: ``memory_limit`` (bytes, or
            a string like ``"2GiB"``, per worker process), ``local_directory`` (where
            workers spill), ``threads_per_worker``, ``dashboard_address`` (default
            None: no dashboard and no HTTP server at all; with one, the dashboard has
            dfdl's page, see :mod:`dfdl.runtime.dashboard`), ``security`` (default: TLS
            with a certificate made for this cluster, ``Security.temporary()``; a
            ``Security`` of your own; ``False`` for plain ``tcp://``; a ``protocol`` or
            a ``host`` with a scheme other than ``tls://`` also turns the default off)...

    The cluster is private: ``Client(cluster)`` takes its credentials from
    ``cluster.security``; a client without them is refused.

    Example:
        >>> cluster = dfdl.LocalCluster(2, memory_limit="1GiB",  # doctest: +SKIP
        ...                             local_directory="/scratch/me")
        >>> client = Client(cluster)  # doctest: +SKIP
    """
    if gpus:
        n_workers = _gpu_workers(gpus, n_workers, kwargs)
    if device_memory_limit is not None:
        if not gpus:
            raise ConfigError(
                "LocalCluster: device_memory_limit is for GPU workers: give gpus=N too"
            )
        limit = parse_memory(device_memory_limit, "device_memory_limit")
        kwargs["data"] = (DeviceSpillBuffer, {"device_limit": limit, **_host_spill(kwargs)})
    if n_workers is None:
        n_workers = 1
        kwargs.setdefault("threads_per_worker", default_workers())
    kwargs.setdefault("threads_per_worker", 1)
    kwargs.setdefault("processes", True)
    kwargs.setdefault("dashboard_address", None)
    kwargs["security"] = _security(kwargs)
    # no HTTP server on the scheduler or the workers unless a dashboard was asked for
    kwargs.setdefault("worker_class", DfdlNanny if kwargs["processes"] else DfdlWorker)
    if kwargs["dashboard_address"] is not None:
        import dfdl.runtime.dashboard  # noqa: F401 - adds the dfdl page before the scheduler starts

    # every worker, restarted ones too, runs dfdl's worker setup (worker_setup.py)
    preload = [*(dask.config.get("distributed.worker.preload", None) or []), WORKER_PRELOAD]
    config = worker_dask_config(kwargs.get("memory_limit"))
    with dask.config.set({**config, "distributed.worker.preload": list(dict.fromkeys(preload))}):
        cluster = _restart_safe_local_cluster()(n_workers=n_workers, **kwargs)
    try:
        with Client(cluster) as client:
            latency.install(client)
    except BaseException:
        cluster.close()
        raise
    return cluster


_LOG = logging.getLogger("dfdl")


def _host_spill(kwargs: dict) -> dict:
    """The host tier's target of a GPU worker's :class:`DeviceSpillBuffer`: Dask's spill
    target of the worker's memory limit, as Dask gives its own ``SpillBuffer``."""
    from distributed.worker_memory import parse_memory_limit

    threads = kwargs.get("threads_per_worker", 1)
    limit = parse_memory_limit(
        kwargs.get("memory_limit", "auto"), threads, os.cpu_count() or 1, logger=_LOG
    )
    fraction = DASK_CONFIG.get(
        "distributed.worker.memory.target", dask.config.get("distributed.worker.memory.target")
    )
    return {"host_target": int(limit * fraction) if limit and fraction else 2**62}


def visible_gpus() -> list[str]:
    """The NVIDIA GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` where set, else
    those ``nvidia-smi -L`` lists (none without a driver).

    Example:
        >>> visible_gpus()  # doctest: +SKIP
        ['0', '1']
    """
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [d.strip() for d in given.split(",") if d.strip() and not d.strip().startswith("-")]
    try:
        listed = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(listed.splitlines()) if line.startswith("GPU ")]


def _gpu_workers(gpus, n_workers, kwargs: dict) -> int:
    """The options of a GPU cluster (:func:`local_cluster`'s ``gpus``), set in
    ``kwargs``; its number of workers."""
    from dfdl.runtime.worker_setup import GPU_LIST_ENV

    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
        raise ConfigError(f"LocalCluster: gpus must be a non-negative integer, not {gpus!r}")
    if n_workers is not None and n_workers != gpus:
        raise ConfigError(
            f"LocalCluster: n_workers={n_workers} with gpus={gpus}: a GPU cluster has one "
            "worker per GPU; leave n_workers out"
        )
    devices = visible_gpus()
    if len(devices) < gpus:
        raise ConfigError(
            f"LocalCluster: gpus={gpus}, but this machine has {len(devices)} NVIDIA GPU(s) "
            "visible (nvidia-smi -L, CUDA_VISIBLE_DEVICES); ask for at most that many, or "
            "leave gpus out to train on the CPUs"
        )
    kwargs.setdefault("threads_per_worker", 2)
    kwargs["resources"] = {**(kwargs.get("resources") or {}), "GPU": 1}
    kwargs["env"] = {**(kwargs.get("env") or {}), GPU_LIST_ENV: ",".join(devices[:gpus])}
    return gpus


def _security(kwargs: dict) -> Security | None:
    """The ``security`` of :func:`local_cluster`: the one given (``False``: None, plain
    tcp), else temporary TLS credentials unless a protocol other than tls was chosen."""
    security = kwargs.get("security")
    if security is False:
        return None
    if security is not None and security is not True:
        return security
    host = str(kwargs.get("host") or "")
    protocol = kwargs.get("protocol") or (host.split("://")[0] if "://" in host else "tls")
    if protocol.removesuffix("://") != "tls":
        return None
    try:
        return Security.temporary()
    except ImportError:
        raise ConfigError(
            "dfdl's local cluster speaks TLS with a temporary certificate, which needs the "
            "'cryptography' package: pip install cryptography (or pass security=False)"
        ) from None


class DfdlScheduler(Scheduler):
    """A ``distributed.Scheduler`` that starts its HTTP server (dashboard, Prometheus
    metrics, health and JSON routes) only when a dashboard or Jupyter was asked for; Dask's
    own one always listens, on port 8787 when free."""

    def __init__(self, *args, dashboard=None, dashboard_address=None, jupyter=False, **kwargs):
        self._dfdl_http = bool(dashboard or dashboard_address is not None or jupyter)
        super().__init__(
            *args,
            dashboard=dashboard,
            dashboard_address=dashboard_address,
            jupyter=jupyter,
            **kwargs,
        )

    def start_http_server(self, *args, **kwargs):
        if self._dfdl_http:
            super().start_http_server(*args, **kwargs)


class DfdlWorker(Worker):
    """A ``distributed.Worker`` that starts its HTTP server only with a worker dashboard
    (``worker_dashboard_address``); Dask's own one always listens, on a random port."""

    def start_http_server(self, routes, dashboard_address, *args, **kwargs):
        if dashboard_address is not None or getattr(self, "_dashboard", True):
            super().start_http_server(routes, dashboard_address, *args, **kwargs)


class DfdlNanny(Nanny):
    """A ``distributed.Nanny`` whose worker process is a :class:`DfdlWorker`."""

    def __init__(self, *args, worker_class=None, **kwargs):
        super().__init__(*args, worker_class=worker_class or DfdlWorker, **kwargs)


def _spawn_workers_deaf_to_interrupts() -> None:
    """Block SIGINT in this thread when it is not the main thread (a synchronous cluster's
    event loop), for good: the threads it starts, the nannies' process starters among
    them, inherit the block and so do the worker processes they spawn, through exec.

    A terminal's Ctrl-C reaches every process of the foreground group. A worker process
    still starting (importing distributed and dfdl, about 1.5 s, before the worker setup
    ignores SIGINT) would die of it with a traceback; blocked, the signal waits and is
    dropped once the setup ignores it (multiprocessing starts its resource tracker so,
    bpo-33613). The command's main thread keeps SIGINT and closes the cluster, the nanny
    its worker. SIG_IGN would reach the children too, but it holds for the whole process
    and only the main thread may set it. The resource tracker starts first: starting, it
    unblocks SIGINT in the thread that starts it (the first nanny's, here).
    """
    if threading.current_thread() is threading.main_thread() or not hasattr(
        signal, "pthread_sigmask"
    ):
        return
    _start_quiet_resource_tracker()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


#: the warnings filter the resource tracker process starts with (``-W``)
QUIET_TRACKER = "ignore::UserWarning:multiprocessing.resource_tracker"


def _start_quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker, if it is not running, with its own
    warnings off. A Ctrl-C while a worker process starts can leave that start's
    semaphore registered; the tracker removes it when the command exits, and would print
    two ``UserWarning`` lines ("leaked semaphore objects", "No such file or directory")
    after ``dfdl: interrupted``. The filter names the tracker's module only, so a process
    spawned meanwhile that inherits it loses no other warning."""
    from multiprocessing import resource_tracker

    sys.warnoptions.append(QUIET_TRACKER)  # the tracker's command line is built from it
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions.remove(QUIET_TRACKER)


@functools.cache
def _restart_safe_local_cluster():
    """``distributed.LocalCluster`` whose workers stay in ``cluster.workers`` across
    nanny restarts.

    SpecCluster drops a worker's nanny when, ``distributed.deploy.lost-worker-timeout``
    (15 s) after the worker left, no worker of that name is registered. The timer does
    not know about restarts in between: a worker killed, restarted, and killed again
    just before an earlier timer fires (while its nanny restarts it, about 1.5 s here)
    lost its nanny for good, and the cluster stayed one worker short (measured: about
    one in 20 SIGKILLs 6-10 s apart). Here the timer only drops the nanny when no worker
    of that name registered since it left. Its scheduler starts no HTTP server unless a
    dashboard was asked for (:class:`DfdlScheduler`).
    """
    import asyncio

    from dask.utils import parse_timedelta
    from distributed import LocalCluster
    from distributed.deploy.cluster import Cluster

    class RestartSafeLocalCluster(LocalCluster):
        async def _start(self):
            if isinstance(self.new_spec.get("cls"), type) and issubclass(
                self.new_spec["cls"], Nanny
            ):
                _spawn_workers_deaf_to_interrupts()
            # LocalCluster names distributed's Scheduler; its HTTP server always listens
            if self.scheduler_spec.get("cls") is Scheduler:
                self.scheduler_spec = {**self.scheduler_spec, "cls": DfdlScheduler}
            await super()._start()

        def _update_worker_status(self, op, msg):
            registered = self.__dict__.setdefault("_dfdl_registered", {})
            if op == "add":
                for info in msg.get("workers", {}).values():
                    registered[info.get("name")] = registered.get(info.get("name"), 0) + 1
            elif op == "remove":
                name = self.scheduler_info["workers"][msg]["name"]
                seen = registered.get(name, 0)

                def drop_if_still_lost():
                    names = {d["name"] for d in self.scheduler_info["workers"].values()}
                    back = registered.get(name, 0) != seen or name in names
                    if name in self.workers and not back:
                        self._futures.add(asyncio.ensure_future(self.workers[name].close()))
                        del self.workers[name]

                delay = parse_timedelta(dask.config.get("distributed.deploy.lost-worker-timeout"))
                asyncio.get_running_loop().call_later(delay, drop_if_still_lost)
            Cluster._update_worker_status(self, op, msg)  # not SpecCluster's own timer

    return RestartSafeLocalCluster


def parse_memory(value, name: str = "memory_limit") -> int | None:
    """Bytes from an int or a string like ``"1.5 GiB"``; None or 0 stays None (no limit).

    Example:
        >>> parse_memory("1 KiB")
        1024
    """
    if value is None or (isinstance(value, int | float) and value == 0):
        return None
    try:
        n = int(parse_bytes(value)) if isinstance(value, str) else int(value)
    except (ValueError, TypeError):
        n = -1
    if n <= 0:
        raise ConfigError(
            f"{name} must be a positive byte count like 2**30 or '1GiB', not {value!r}"
        )
    return n


def gpu_workers(client) -> list[str]:
    """Addresses of the client's workers that declare a ``GPU`` resource, sorted.

    Example:
        >>> gpu_workers(Client(dfdl.LocalCluster()))  # doctest: +SKIP
        []
    """
    workers = client.scheduler_info()["workers"]
    return sorted(a for a, w in workers.items() if (w.get("resources") or {}).get("GPU", 0) > 0)


def workers_device(client) -> str:
    """Where the client's workers run a training's tile kernels: ``"gpu"`` when some
    workers declare a ``GPU`` resource (``dfdl.LocalCluster(gpus=N)``,
    ``dfdl.cluster.slurm(gpus=N)``; on a cluster that also has CPU workers the training
    runs on the GPU workers, :func:`placement`), ``"cpu"`` when none does.

    Raises:
        ConfigError: workers declare a GPU but cannot run cupy kernels.

    Example:
        >>> workers_device(Client(dfdl.LocalCluster()))  # doctest: +SKIP
        'cpu'
    """
    gpu = gpu_workers(client)
    if not gpu:
        return "cpu"
    problems = {a: p for a, p in client.run(_gpu_problem, workers=gpu).items() if p}
    if problems:
        addr, problem = sorted(problems.items())[0]
        raise ConfigError(
            f"{len(problems)} of the {len(gpu)} workers that declare a GPU cannot run GPU "
            f"kernels (worker {addr}: {problem}); install the gpu extra on the GPU "
            "nodes (pip install 'dfdl[gpu]', cupy for the node's CUDA) or start the "
            "workers without the GPU resource"
        )
    return "gpu"


def placement(client, device: str) -> dict:
    """Where a training's tasks and scattered tiles go: on a cluster that mixes GPU and
    CPU workers, training on the GPUs (``device`` ``"gpu"``), ``{"resources": {"GPU":
    1}, "workers": [the GPU workers]}`` (tasks by resource, which workers that restart or
    join keep; scatters to the GPU workers of the moment); ``{}`` everywhere else, where
    the scheduler may place anything on any worker.

    Example:
        >>> placement(Client(dfdl.LocalCluster()), "cpu")  # doctest: +SKIP
        {}
    """
    if device != "gpu":
        return {}
    workers = client.scheduler_info()["workers"]
    gpu = gpu_workers(client)
    if len(gpu) == len(workers):
        return {}
    return {"resources": {"GPU": 1}, "workers": gpu}


def _gpu_problem() -> str | None:
    """On a worker: why it cannot run cupy kernels, or None when it can."""
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - any failure is the answer
        return f"{type(e).__name__}: {e}"
    return None if count > 0 else "CUDA sees no GPU"


def worker_memory_limit(client) -> int | None:
    """The smallest memory limit among the client's workers (None: none has a limit)."""
    limits = [int(w.get("memory_limit") or 0) for w in client.scheduler_info()["workers"].values()]
    limits = [v for v in limits if v > 0]
    return min(limits) if limits else None


#: share of the workers' memory limits that one scatter or gather of weight tiles may
#: move at once. A single message carrying every tile lands in the receiving worker's
#: unmanaged memory before Dask can spill any of it (measured: 2 workers x 512 MiB, one
#: killed at 95% while 0.9 GB of weights and momentum were scattered in one call).
TRANSFER_FRACTION = 0.1


def transfer_budget(client) -> int | None:
    """Bytes one scatter/gather may move: ``TRANSFER_FRACTION`` of the workers' limits
    together (None when no worker has a limit)."""
    limits = [int(w.get("memory_limit") or 0) for w in client.scheduler_info()["workers"].values()]
    if not limits or min(limits) <= 0:
        return None
    return max(1, int(TRANSFER_FRACTION * sum(limits)))


def gather_budget(client) -> int | None:
    """Bytes one gather may take from each worker: ``TRANSFER_FRACTION`` of the smallest
    limit (None when no worker has a limit). A worker reads its spilled tiles back into
    memory to send them, paused or not: with batches of a tenth of two 512 MiB workers'
    limits together (102 MiB, from one worker or both), a worker went past the nanny's
    0.95 while the trained weights were gathered (``bench/user_cluster.py``, 4.5x the
    limits)."""
    limits = [int(w.get("memory_limit") or 0) for w in client.scheduler_info()["workers"].values()]
    if not limits or min(limits) <= 0:
        return None
    return max(1, int(TRANSFER_FRACTION * min(limits)))


def byte_batches(sizes: list[int], budget: int | None, owners: list | None = None) -> list[range]:
    """Consecutive index ranges whose sizes sum to at most ``budget`` (an item larger than
    the budget travels alone); one range for everything when ``budget`` is None. With
    ``owners`` (one per item), the budget bounds each owner's items in a range.

    Example:
        >>> byte_batches([4, 4, 4, 9, 1], 8)
        [range(0, 2), range(2, 3), range(3, 4), range(4, 5)]
        >>> byte_batches([4, 4, 4, 4], 8, owners=["a", "b", "a", "b"])
        [range(0, 4)]
    """
    if budget is None or not sizes:
        return [range(len(sizes))]
    owners = owners if owners is not None else [None] * len(sizes)
    out, start, total = [], 0, {}
    for i, n in enumerate(sizes):
        if i > start and total.get(owners[i], 0) + n > budget:
            out.append(range(start, i))
            start, total = i, {}
        total[owners[i]] = total.get(owners[i], 0) + n
    out.append(range(start, len(sizes)))
    return out


def embedded_memory_limit() -> int:
    """The memory limit of the embedded cluster's one worker: this machine's memory
    (or the cgroup's limit), as dask's ``memory_limit="auto"`` gives it."""
    from distributed.system import MEMORY_LIMIT

    return int(MEMORY_LIMIT)


_embedded: dict = {}
_embedded_lock = threading.Lock()


def embedded_client():
    """The client of this process's embedded cluster (:func:`local_cluster`): started
    by the first call, reused by later ones while it has running workers, and shut down
    when the process exits (or by :func:`close_embedded`).

    Starting a cluster costs seconds (a worker process, its imports, dfdl's worker
    setup); a process that trains or runs several models pays it once.

    Example:
        >>> client = embedded_client()  # doctest: +SKIP
    """
    with _embedded_lock:
        client = _embedded.get("client")
        if client is not None and client.status == "running":
            try:
                if client.scheduler_info()["workers"]:
                    return client
            except Exception:  # noqa: BLE001 - a dead scheduler: start a new cluster
                pass
        _close_embedded()
        cluster = local_cluster()
        try:
            client = Client(cluster)
        except BaseException:
            cluster.close()
            raise
        _embedded.update(cluster=cluster, client=client)
        if not _embedded.get("atexit"):
            atexit.register(close_embedded)
            _embedded["atexit"] = True
        return client


def close_embedded(quiet: bool = False) -> None:
    """Shut the embedded cluster down (a later call starts a new one).

    Args:
        quiet: silence Dask's and tornado's logs first, here and in the workers: after
            an interrupt, each task cut short would log a warning or a traceback.

    Example:
        >>> close_embedded()
    """
    with _embedded_lock:
        if quiet:
            _silence_logs()
            client = _embedded.get("client")
            try:
                if client is not None and client.status == "running":
                    client.run(_silence_logs)
            except Exception:  # noqa: BLE001 - workers already gone: nothing to silence
                pass
        _close_embedded()
        if quiet:
            _close_half_started()
            _kill_stragglers()


def _close_half_started() -> None:
    """Close clusters an interrupt left half started: distributed's exit hook would fail
    on them with a traceback (an AssertionError on a worker still starting)."""
    from distributed.deploy.spec import SpecCluster

    for cluster in list(SpecCluster._instances):
        if str(getattr(cluster, "status", "")).endswith("closed"):
            continue
        try:
            cluster.close(timeout=5)
        except Exception:  # noqa: BLE001 - nothing left to save; keep the exit quiet
            cluster.shutdown_on_close = False


def _kill_stragglers() -> None:
    """Kill the child processes still alive after the close: a worker process spawned
    just before the interrupt, still unpickling its start-up data, would print a
    traceback once this process has gone (its semaphores vanish with it)."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
        child.join(timeout=5)


def _silence_logs() -> None:
    from dfdl.interrupts import silence_dask_logs

    silence_dask_logs()


def _close_embedded() -> None:
    client, cluster = _embedded.pop("client", None), _embedded.pop("cluster", None)
    for closing in (client, cluster):
        if closing is not None:
            try:
                closing.close()
            except Exception:  # noqa: BLE001 - closing a broken cluster: nothing to keep
                pass


@contextlib.contextmanager
def connect(client=None) -> Iterator:
    """Yield ``client`` unchanged, or the embedded cluster's client
    (:func:`embedded_client`), which stays up for the process's next call."""
    yield client if client is not None else embedded_client()


def open_client(address: str, security=None, timeout: float = 30.0):
    """A ``distributed.Client`` for the scheduler at ``address``, or a ConfigError that
    says why not (unreachable, or TLS credentials missing or not trusted).

    Args:
        address: the scheduler, e.g. ``"tcp://node1:8786"`` or ``"tls://node1:8786"``.
        security: a ``distributed.security.Security``; default: dask's
            ``distributed.comm.tls`` config (also set by ``DASK_DISTRIBUTED__COMM__TLS__*``
            environment variables).
        timeout: seconds to wait for the connection.

    Example:
        >>> from distributed.security import Security
        >>> client = open_client("tls://node1:8786", Security(  # doctest: +SKIP
        ...     tls_ca_file="ca.pem", tls_client_cert="me.pem", tls_client_key="me.key",
        ...     require_encryption=True))
    """
    tls = str(address).startswith("tls://")
    hint = (
        " Give the cluster's CA and a client certificate and key (dfdl train --tls-ca-file, "
        "--tls-cert, --tls-key, or dask's distributed.comm.tls config)."
        if tls
        else " Check the address (tls://... for a scheduler that uses TLS, as dfdl.LocalCluster's "
        "does), and that the scheduler is running and reachable from here."
    )
    try:
        return Client(address, security=security, timeout=timeout)
    except (OSError, TypeError, ValueError) as e:
        detail = " ".join(str(e).split()) or type(e).__name__
        if tls and isinstance(e, TypeError):  # distributed's words for "no TLS context"
            detail = "no TLS credentials were given"
    # raised outside the except block, with no link to the connection error: its traceback
    # holds the half-started Client, whose __del__ deadlocks if it runs later, inside
    # the start of another Client
    gc.collect()
    raise ConfigError(f"cannot connect to the scheduler at {address}: {detail}.{hint}")


def total_threads(client) -> int:
    """Worker threads of the client's cluster (at least 1)."""
    try:
        return max(1, sum(client.nthreads().values()))
    except Exception:
        return 1
