"""Where the CPU goes during ``dfdl.train``: CPU seconds by role, per thread, from Linux's
per-thread accounting (``/proc/self/task/*/stat``), in every process of the cluster.

The task stream says when a worker thread ran a task, not what else wanted the cores
meanwhile. On a machine with as many cores as worker threads, the kernels share the
cores with the worker's event loop, the scheduler and the process that builds the
graphs; every second of CPU those take is a second the kernels cannot have. Sampled
before and after a call, the processes' thread CPU times give, per role:

* ``kernels``: the worker threads that run tasks (Dask's executor threads);
* ``worker``: the worker processes' other threads (event loop, profiler) and their
  nannies where those have processes of their own (``LocalCluster``'s live in the
  trainer's process);
* ``scheduler``: the scheduler's process; on the embedded cluster it lives in the
  trainer's process, and its event-loop thread also carries the client's messages;
* ``trainer``: the rest of the calling process (graph building, submission).

With the cores' time over the same span, ``idle`` is what no thread used. So a step
takes at least (``kernels`` + ``worker`` + ``scheduler`` + ``trainer``) / cores
seconds, whatever the order of its tasks: :func:`cpu_bound`.

:class:`Sampler` takes snapshots every quarter second during a call, so the CPU of
exactly the span that ``bench/run.py`` times (the steps after the first) can be read.
Linux only; elsewhere the snapshots are empty and ``bench/run.py`` leaves them out.

Example:
    >>> a = snapshot(client)  # doctest: +SKIP
    >>> dfdl.train(...)  # doctest: +SKIP
    >>> by_role(a, snapshot(client))  # doctest: +SKIP
    {'kernels': 6.4, 'worker': 1.7, 'scheduler': 1.4, 'trainer': 0.6}
"""

from __future__ import annotations

import os

#: roles in the order ``bench/run.py`` prints them
ROLES = ("kernels", "worker", "scheduler", "trainer")
#: parts of the names of the threads that run kernels: a Dask worker's task threads and
#: dfdl's gang helpers (:mod:`dfdl.taskgraph.gang`)
KERNEL_THREADS = ("Dask-Default-Threads", "dfdl-gang")
#: the name of :class:`Sampler`'s thread (its own CPU is left out)
SAMPLER_THREAD = "cpu-sampler"


def thread_cpu() -> dict:
    """``{"pid": ..., "threads": {tid: (name, cpu seconds)}}`` of the calling process:
    user + system time of every thread, named as Python knows it (else the kernel's
    name). Empty threads where ``/proc`` is missing.

    Example:
        >>> import threading
        >>> own = thread_cpu()["threads"][threading.get_native_id()]
        >>> own[0], own[1] >= 0
        ('MainThread', True)
    """
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return {"pid": os.getpid(), "threads": out}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (names.get(int(tid), comm), (int(fields[11]) + int(fields[12])) / tick)
    return {"pid": os.getpid(), "threads": out}


def snapshot(client) -> dict:
    """:func:`thread_cpu` of this process, the scheduler's, every worker's and every
    nanny's (workers without nannies are left out of that part)."""
    import sys

    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # remote processes lack bench/
    snap = {"trainer": thread_cpu(), "scheduler": client.run_on_scheduler(thread_cpu)}
    snap["workers"] = list(client.run(thread_cpu).values())
    try:
        snap["nannies"] = list(client.run(thread_cpu, nanny=True).values())
    except Exception:  # noqa: BLE001 - a cluster without nannies
        snap["nannies"] = []
    return snap


def _delta(before: dict, after: dict) -> dict[int, tuple[str, float]]:
    """Per-thread CPU spent between two :func:`thread_cpu` results of one process
    (threads started in between count from zero)."""
    was = before["threads"] if before and before["pid"] == after["pid"] else {}
    return {
        tid: (name, cpu - was.get(tid, (name, 0.0))[1])
        for tid, (name, cpu) in after["threads"].items()
    }


def by_role(before: dict, after: dict, kernel_threads: tuple = KERNEL_THREADS) -> dict:
    """CPU seconds per role (:data:`ROLES`) between two :func:`snapshot` results;
    ``kernel_threads``: a thread whose name contains one of them runs kernels.

    Example:
        >>> t = lambda pid, **threads: {"pid": pid, "threads": {
        ...     i: (n, c) for i, (n, c) in enumerate(threads.items())}}
        >>> a = {"trainer": t(1, MainThread=1.0, IO_loop=2.0),
        ...      "scheduler": t(1, MainThread=1.0, IO_loop=2.0),
        ...      "workers": [t(2, MainThread=1.0, Dask_Default_Threads_0=5.0, gang_0=1.0)],
        ...      "nannies": [t(3, MainThread=0.5), t(1, MainThread=1.0, IO_loop=2.0)]}
        >>> b = {"trainer": t(1, MainThread=1.5, IO_loop=3.0),
        ...      "scheduler": t(1, MainThread=1.5, IO_loop=3.0),
        ...      "workers": [t(2, MainThread=1.25, Dask_Default_Threads_0=9.0, gang_0=2.0)],
        ...      "nannies": [t(3, MainThread=0.75), t(1, MainThread=1.5, IO_loop=3.0)]}
        >>> by_role(a, b, ("Dask_Default_Threads", "gang"))  # scheduler in process 1
        {'kernels': 5.0, 'worker': 0.5, 'scheduler': 1.0, 'trainer': 0.5}
    """
    roles = dict.fromkeys(ROLES, 0.0)
    seen = {after["trainer"]["pid"], after["scheduler"]["pid"]}
    for b, a in zip(before["workers"], after["workers"], strict=True):
        seen.add(a["pid"])
        for name, cpu in _delta(b, a).values():
            kernel = any(p in name for p in kernel_threads)
            roles["kernels" if kernel else "worker"] += cpu
    for b, a in zip(before["nannies"], after["nannies"], strict=True):
        if a["pid"] not in seen:  # LocalCluster's nannies live in the trainer's process
            seen.add(a["pid"])
            roles["worker"] += sum(cpu for _, cpu in _delta(b, a).values())
    trainer = _delta(before["trainer"], after["trainer"])
    trainer = {tid: v for tid, v in trainer.items() if v[0] != SAMPLER_THREAD}
    if after["scheduler"]["pid"] == after["trainer"]["pid"]:
        # in-process scheduler: its event loop runs on the trainer's loop thread
        main = {tid for tid, (name, _) in trainer.items() if name == "MainThread"}
        roles["trainer"] = sum(cpu for tid, (_, cpu) in trainer.items() if tid in main)
        roles["scheduler"] = sum(cpu for tid, (_, cpu) in trainer.items() if tid not in main)
    else:
        roles["trainer"] = sum(cpu for _, cpu in trainer.values())
        sched = _delta(before["scheduler"], after["scheduler"])
        roles["scheduler"] = sum(cpu for _, cpu in sched.values())
    return roles


class Sampler:
    """Takes a :func:`snapshot` of ``client``'s cluster every ``interval`` seconds on a
    thread of its own while the ``with`` block runs (and once at each end), so the CPU
    of any span inside it can be read afterwards (:meth:`per_second`). Each snapshot is
    a few round trips to the scheduler and the workers (milliseconds of their CPU).

    Example:
        >>> with Sampler(client) as cpu:  # doctest: +SKIP
        ...     dfdl.train(...)
        >>> cpu.per_second(t0, t1)  # doctest: +SKIP
        {'kernels': 1.6, 'worker': 0.3, 'scheduler': 0.25, 'trainer': 0.05}
    """

    def __init__(self, client, interval: float = 0.25):
        self.client, self.interval = client, interval
        self.samples: list[tuple[float, dict]] = []
        self._stop = None
        self._thread = None

    def _take(self) -> None:
        import time

        self.samples.append((time.time(), snapshot(self.client)))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._take()

    def __enter__(self) -> Sampler:
        import threading

        self._stop = threading.Event()
        self._take()
        self._thread = threading.Thread(target=self._run, name=SAMPLER_THREAD, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    def per_second(self, t0: float, t1: float) -> dict[str, float] | None:
        """CPU seconds per second by role between the first sample at or after ``t0``
        and the last at or before ``t1`` (wall-clock times, as in Dask's task stream);
        None when fewer than two samples lie in between."""
        inside = [(t, snap) for t, snap in self.samples if t0 <= t <= t1]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return None
        (ta, a), (tb, b) = inside[0], inside[-1]
        return {role: cpu / (tb - ta) for role, cpu in by_role(a, b).items()}


def cpu_bound(per_step: dict[str, float], cores: int) -> float:
    """The shortest step the measured CPU allows on ``cores`` cores: every role's CPU
    seconds per step, spread over all cores with none ever idle.

    Example:
        >>> cpu_bound({"kernels": 0.66, "worker": 0.18, "scheduler": 0.14,
        ...            "trainer": 0.06}, 2)
        0.52
    """
    return round(sum(per_step[r] for r in ROLES) / cores, 12)
