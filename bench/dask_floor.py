"""Dask's latency floor under a training step: how long a level of dependent tasks takes
when its tasks do nothing, and how many such levels a dfdl step has.

A training step is a graph of tile tasks. Wherever a task reads the output of another,
the reader starts only after the producer's "finished" message reached the scheduler
and the scheduler's "compute" message reached the worker: a dependency's round trip,
which no kernel speed shortens. Where no task off the longest chain fills those round
trips (a graph whose levels hold one tile per worker thread), a step cannot take less
than

    (the workers' task thread-seconds per step) / threads
        + (the longest dependency chain of the step, in tasks) x (one level's latency)

where a level's latency is measured here with tasks that do nothing, two per level
(one per thread of the embedded cluster), each level reading both tasks of the level
before, as a batch-tiled layer reads both tiles of the previous one at a BatchNorm.

* :func:`level_latency` times such levels on a cluster, from Dask's task stream;
* :class:`GraphRecorder`, a scheduler plugin, records the dependencies of the graphs
  that ``dfdl.train`` submits; :func:`longest_chain_per_step` reads the longest chain
  of one step from them.

``bench/run.py`` runs both for every workload and reports the floor beside the measured
step (columns ``chain`` and ``floor``). Run alone:

    python bench/dask_floor.py [--levels 200] [--width 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import uuid

from distributed.diagnostics.plugin import SchedulerPlugin


def _noop(*_args) -> int:
    return 0


def level_latency(client, width: int = 2, levels: int = 200, repeat: int = 3) -> float:
    """Seconds per level of a chain of ``levels`` levels of ``width`` no-op tasks, each
    reading every task of the level before (median over ``repeat`` chains; the span from
    the end of the first level to the end of the last, from the task stream, so graph
    submission is not in it).

    Example:
        >>> level_latency(client)  # doctest: +SKIP
        0.0029
    """
    from dask.task_spec import Task, TaskRef
    from distributed import get_task_stream

    from dfdl.runtime import submit

    runs = []
    for _ in range(repeat):
        tag = f"floor-{uuid.uuid4().hex[:8]}"
        dsk = {(tag, 0, j): Task((tag, 0, j), _noop) for j in range(width)}
        for i in range(1, levels):
            refs = [TaskRef((tag, i - 1, j)) for j in range(width)]
            for j in range(width):
                dsk[(tag, i, j)] = Task((tag, i, j), _noop, *refs)
        last = [(tag, levels - 1, j) for j in range(width)]
        with get_task_stream(client) as ts:
            submit.get(client, dsk, last, sync=True)
        ends: dict[int, float] = {}
        for rec in ts.data:
            key = rec["key"]
            if isinstance(key, tuple) and key[0] == tag:
                for ss in rec.get("startstops", ()):
                    if ss["action"] == "compute":
                        ends[key[1]] = max(ends.get(key[1], 0.0), ss["stop"])
        runs.append((ends[levels - 1] - ends[0]) / (levels - 1))
    return statistics.median(runs)


class GraphRecorder(SchedulerPlugin):
    """Records, for every graph submitted while installed, each task's dependencies.

    Install with ``client.register_plugin(GraphRecorder())``; read with
    :func:`recorded`; remove with ``client.unregister_scheduler_plugin(NAME)``.
    """

    name = "dfdl-bench-graph-recorder"

    def __init__(self):
        self.deps: dict = {}

    def update_graph(self, scheduler, *, tasks=(), **kwargs) -> None:
        for key in tasks:
            ts = scheduler.tasks.get(key)
            if ts is not None:
                self.deps[key] = [d.key for d in ts.dependencies]


def recorded(client) -> dict:
    """The dependencies :class:`GraphRecorder` recorded on ``client``'s scheduler."""

    def read(dask_scheduler):
        return dask_scheduler.plugins[GraphRecorder.name].deps

    return client.run_on_scheduler(read)


def _step(key):
    return key[1] if isinstance(key, tuple) and len(key) > 1 and isinstance(key[1], int) else None


def longest_chain_per_step(deps: dict) -> dict[int, int]:
    """``{step: tasks on the longest dependency chain among that step's tasks}`` of a
    graph recorded by :class:`GraphRecorder` (dfdl's keys are ``(name, step, *tile)``).

    Tasks that depend on nothing (batch tiles embedded in the graph) are ready when the
    graph arrives, ahead of the step: they do not count. A task that reads only the
    previous step's values (the first layer, reading updated weights) counts once.

    Example:
        >>> longest_chain_per_step(
        ...     {("x", 0): [], ("a", 0): [("x", 0), ("w", -1)], ("b", 0): [("a", 0)]})
        {0: 2}
    """
    depth: dict = {}
    for key in deps:  # iterative: chains run to hundreds of tasks
        if key in depth or _step(key) is None:
            continue
        stack = [key]
        while stack:
            k = stack[-1]
            todo = [d for d in deps.get(k, ()) if d not in depth and _step(d) == _step(k)]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            same = [depth[d] for d in deps.get(k, ()) if _step(d) == _step(k)]
            depth[k] = 1 + max(same, default=0) if deps.get(k) else 0
    out: dict[int, int] = {}
    for k, v in depth.items():
        out[_step(k)] = max(out.get(_step(k), 0), v)
    return dict(sorted(out.items()))


def tasks_per_step(deps: dict) -> dict[int, int]:
    """``{step: number of tasks}`` of a recorded graph."""
    out: dict[int, int] = {}
    for k in deps:
        s = _step(k)
        if s is not None:
            out[s] = out.get(s, 0) + 1
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> int:
    from distributed import Client

    from dfdl.runtime.cluster import local_cluster

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", type=int, default=200)
    p.add_argument("--width", type=int, default=2)
    args = p.parse_args(argv)
    with local_cluster() as cluster, Client(cluster) as client:
        level_latency(client, args.width, 20, 1)  # warm-up
        for width in sorted({1, args.width}):
            s = level_latency(client, width, args.levels)
            print(f"embedded cluster: {s * 1e3:.2f} ms per level of {width} no-op task(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
