"""Scaling predicted past this machine: a discrete-event simulation of one training step
on N worker processes, built from the task graph dfdl really submits for N workers.

    python bench/scale_sim.py --json out.json [--quick] [--workloads mlp resnet ...]

The model (``docs/design/scale-sim.md``):

* **Graph**: :func:`scale_graph.step_graph`, the engine's own optimized graph of one
  step for N worker processes of one thread: per-worker step tasks, one per stage,
  each pinned to its worker, and the ``getitem`` tasks that take exported values out
  of them. The step's inputs are in memory when it starts: the batch tile on the worker
  that reads it, each weight and optimizer state on the worker that updated it in the
  previous step (every other worker that reads it fetches it).
* **Durations**: each tile task's time is ``c + a * FLOPs + b * bytes``, with
  ``(c, a, b)`` fitted per op kind (Conv, Gemm, MatMul, ..., elementwise, sum) to
  the times of every tile task of lowered graphs executed here, one thread, in this
  process (:func:`measure_tasks`, :func:`fit`). A step task runs its members one after
  another (``threads`` at once on a one-process worker, whose gang helper runs too).
* **Scheduler**: every task's "finished" message costs the scheduler ``task_s`` of
  CPU, one message at a time; a task is sent to its worker once the scheduler has
  processed its last dependency, ``rtt_s`` (software) plus two network latencies
  after that dependency ended; these two, and ``fetch_s``, the software cost of one
  fetch from another worker, come from Dask's level latency measured here
  (:func:`measure_overheads`).
* **Network**: a fetch takes ``latency + bytes / bandwidth``; each worker's link
  carries one transfer in and one out at a time (:data:`NETWORKS`).

Calibration (:func:`calibrate`): real ``dfdl.train`` runs of bench/run.py's small
workloads on 1 and 2 worker processes here, step time from Dask's task stream as in
bench/run.py, against the simulation of the same graphs.

Example:
    >>> tasks = [SimTask("a", 0, 1.0, ()), SimTask("b", 0, 2.0, ("a",))]
    >>> simulate(tasks, Overheads(0.0, 0.0, 0.0), NETWORKS["local"]).makespan
    3.0
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import operator
import os
import platform
import sys
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from dask.task_spec import DataNode, Task, TaskRef

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale_graph  # noqa: E402  (bench/ is not a package)
from run import member_id  # noqa: E402
from scale_graph import TOKEN, Cost, TaskCosts, members, step_graph, step_plan  # noqa: E402

from dfdl.taskgraph import exchange  # noqa: E402
from dfdl.taskgraph.fuse import run_fused  # noqa: E402
from dfdl.taskgraph.lower import task_name  # noqa: E402
from dfdl.taskgraph.step_tasks import STEP_NAME, _item_after, run_exchange  # noqa: E402


@dataclass(frozen=True)
class Network:
    """A cluster network: one-way latency of a message (seconds) and bandwidth per link.
    ``copies_on_cores``: a transfer's time is also the CPU time of both workers' cores
    (loopback on a machine whose cores the workers share: copying, TLS), which their
    next tasks then wait for.

    Example:
        >>> NETWORKS["ib100"].bandwidth_bytes_s / 1e9
        11.25
    """

    name: str
    latency_s: float
    bandwidth_bytes_s: float
    copies_on_cores: bool = False


#: presets: 100 Gb/s InfiniBand and 25 Gb/s Ethernet at 90% of their line rates, with a
#: TCP message's one-way latency over them (IPoIB about 5 us, Ethernet about 25 us);
#: "local" is this machine's loopback, whose latency the measured overheads contain
NETWORKS = {
    "ib100": Network("100 Gb/s InfiniBand", 5e-6, 0.9 * 100e9 / 8),
    "eth25": Network("25 Gb/s Ethernet", 25e-6, 0.9 * 25e9 / 8),
    "local": Network("this machine's loopback", 0.0, 1e9, copies_on_cores=True),
}


#: a small ResNet of the zoo, for examples and tests, and its tiles on two workers
RESNET_TINY = dict(in_channels=2, image_size=8, stem=4, stages=(4, 8), blocks_per_stage=1)
TWO_TILES = {"batch": 2, "model": 1, "split_norms": 1}


@dataclass(frozen=True)
class Overheads:
    """Dask's costs (seconds): the scheduler's CPU per task, the software part of a
    dependency's round trip (finished -> scheduler -> compute), one fetch's software;
    ``send_s``: one direct message's software on the sender's event loop
    (``exchange.Outbox.send``, one message at a time); ``message_s``: the rest of a
    direct message's software on its way (the receiver's loop, the waiting thread's
    wake-up), a delay.

    Example:
        >>> Overheads(task_s=1e-3, rtt_s=1e-3, fetch_s=5e-3).task_s
        0.001
    """

    task_s: float
    rtt_s: float
    fetch_s: float
    send_s: float = 0.0
    message_s: float = 0.0


@dataclass(frozen=True)
class Member:
    """One member of a worker's share of a step in the direct-exchange design (a
    ``run_exchange`` task's tile task, in the task's priority order).

    Attributes:
        key: its key (a remote member: the key of the member that sends it).
        duration: seconds it runs.
        deps: the indices of the share's members it reads.
        sends: ``(worker, bytes)`` of each message it sends once computed.
        remote: a value another worker sends (it runs nothing: it arrives).

    Example:
        >>> Member("a", 1.0, (), ((1, 8e6),)).sends
        ((1, 8000000.0),)
    """

    key: Hashable
    duration: float
    deps: tuple = ()
    sends: tuple = ()
    remote: bool = False


@dataclass
class SimTask:
    """One task of a simulated graph.

    Attributes:
        key: its key.
        worker: the worker that runs it.
        duration: seconds it runs.
        deps: the keys it reads.
        out_bytes: bytes of its value.
        source: a value in memory when the step starts (no run, no scheduler).
        home: for a source, the worker that holds it (None: every worker, the batch).
        program: a share of the direct-exchange design: its members, run on the
            worker's thread in this order's priority, each as soon as what it reads is
            there (:func:`simulate`); ``duration`` is then their sum, for the record.

    Example:
        >>> SimTask("a", worker=0, duration=1.0, deps=()).source
        False
    """

    key: Hashable
    worker: int
    duration: float
    deps: tuple
    out_bytes: float = 0.0
    source: bool = False
    home: int | None = None
    program: tuple[Member, ...] | None = None


@dataclass
class Result:
    """A simulated step: its makespan and where the time went.

    Example:
        >>> Result(1.0, 2, 0, 0.0, 0.0).makespan
        1.0
    """

    makespan: float
    tasks: int
    fetches: int
    fetched_bytes: float
    scheduler_busy_s: float
    compute_s: list[float] = field(default_factory=list)
    messages: int = 0
    message_bytes: float = 0.0


def simulate(tasks: Sequence[SimTask], over: Overheads, net: Network) -> Result:
    """Runs the graph ``tasks`` to its end; returns when it ended (the step's time).

    A task with a ``program`` (a share of the direct-exchange design) runs as
    ``run_exchange`` does: its members one at a time on the worker's thread, always
    the first (in the program's order) whose inputs are all there, waiting only when
    none can run; a member's value goes to each worker in its ``sends`` as a message
    that leaves the sender's event loop after ``send_s`` (one message at a time) and
    arrives ``bytes / bandwidth + latency`` later, each link carrying one transfer in
    and one out at a time. A message for a share that has not started yet waits in
    that worker's mailbox.

    Example:
        >>> t = [SimTask("x", 0, 0.0, (), 8e6, source=True, home=0),
        ...      SimTask("b", 1, 1.0, ("x",))]
        >>> simulate(t, Overheads(0.001, 0.0, 0.0), Network("n", 0.0, 8e6)).makespan
        2.001
    """
    by_key = {t.key: t for t in tasks}
    order = {t.key: i for i, t in enumerate(tasks)}
    readers: dict = {}
    missing: dict = {}
    where: dict = {}
    for t in tasks:
        if t.source:
            where[t.key] = None if t.home is None else {t.home}
            continue
        live = [d for d in t.deps if d in by_key and not by_key[d].source]
        missing[t.key] = len(live)
        for d in live:
            readers.setdefault(d, []).append(t.key)
    workers = 1 + max((t.worker for t in tasks), default=0)
    for t in tasks:
        for m in t.program or ():
            workers = max(workers, 1 + max((p for p, _ in m.sends), default=0))
    events: list = []
    seq = [0]

    def push(at: float, kind: str, key) -> None:
        seq[0] += 1
        heapq.heappush(events, (at, seq[0], kind, key))

    sched_free = 0.0
    busy = 0.0
    for t in tasks:  # sent when the graph arrives: the step's first tasks
        if not t.source and missing[t.key] == 0:
            sched_free += over.task_s
            busy += over.task_s
            push(sched_free + net.latency_s + over.rtt_s, "dispatch", t.key)
    loop_free = [0.0] * workers
    link_in = [0.0] * workers
    link_out = [0.0] * workers
    running = [False] * workers
    queue: list[list] = [[] for _ in range(workers)]
    compute = [0.0] * workers
    fetches, fetched, end = 0, 0.0, 0.0
    sent = [0, 0.0]
    shares: dict[int, _Share] = {}  # worker -> the share running there
    mailbox: list[dict] = [{} for _ in range(workers)]  # values for shares not started

    debt = [0.0] * workers  # copying a worker's core did (copies_on_cores)

    def transfer(src: int, dst: int, at: float, size: float) -> float:
        """Reserves the links for a transfer ready to go at ``at``; returns its end."""
        x0 = max(at, link_out[src], link_in[dst])
        x1 = x0 + size / net.bandwidth_bytes_s
        link_out[src] = link_in[dst] = x1
        if net.copies_on_cores:
            debt[src] += x1 - x0
            debt[dst] += x1 - x0
        return x1

    def start(w: int, now: float) -> None:
        if running[w] or not queue[w]:
            return
        _, key = heapq.heappop(queue[w])
        running[w] = True
        task = by_key[key]
        if task.program is not None:
            share = shares[w] = _Share(task)
            for k in [k for k in mailbox[w] if k in share.remote]:
                del mailbox[w][k]
                share.done(share.remote[k])
            advance(w, now)
            return
        compute[w] += task.duration
        push(now + debt[w] + task.duration, "done", key)
        debt[w] = 0.0

    def advance(w: int, now: float) -> None:
        """The share on ``w`` runs its next member, or ends, or waits."""
        share = shares[w]
        if share.busy:
            return
        if share.ready:
            i = heapq.heappop(share.ready)
            share.busy = True
            d = share.members[i].duration
            compute[w] += d
            push(now + debt[w] + d, "member", (w, i))
            debt[w] = 0.0
        elif share.left == 0:
            del shares[w]
            push(now, "done", share.task.key)

    while events:
        now, _, kind, key = heapq.heappop(events)
        if kind == "member":
            w, i = key
            share = shares[w]
            share.busy = False
            share.done(i)
            for p, size in share.members[i].sends:
                t0 = max(now, loop_free[w]) + over.send_s
                loop_free[w] = t0
                x1 = transfer(w, p, t0, size)
                push(x1 + net.latency_s + over.message_s, "arrive", (p, share.members[i].key))
                sent[0] += 1
                sent[1] += size
            advance(w, now)
            continue
        if kind == "arrive":
            p, k = key
            share = shares.get(p)
            if share is not None and share.task.worker == p and k in share.remote:
                share.done(share.remote[k])
                advance(p, now)
            else:
                mailbox[p][k] = now
            continue
        task = by_key[key]
        if kind == "dispatch":
            w = task.worker
            groups: dict = {}
            for d in task.deps:
                held = where.get(d)
                if held is None or w in held:
                    continue
                groups.setdefault(min(held), []).append(d)
            ready = now
            for src, ds in sorted(groups.items()):
                size = sum(by_key[d].out_bytes for d in ds)
                t0 = max(now, loop_free[w])
                loop_free[w] = t0 + over.fetch_s
                x1 = transfer(src, w, t0 + over.fetch_s + net.latency_s, size)
                ready = max(ready, x1 + net.latency_s)
                fetches += 1
                fetched += size
                for d in ds:
                    where[d].add(w)
            push(ready, "ready", key)
        elif kind == "ready":
            heapq.heappush(queue[task.worker], (order[key], key))
            start(task.worker, now)
        elif kind == "done":
            end = max(end, now)
            where[key] = {task.worker}
            running[task.worker] = False
            start(task.worker, now)
            push(now + net.latency_s, "finished", key)
        else:  # "finished" reaches the scheduler
            sched_free = max(now, sched_free) + over.task_s
            busy += over.task_s
            for r in readers.get(key, ()):
                missing[r] -= 1
                if not missing[r]:
                    push(sched_free + net.latency_s + over.rtt_s, "dispatch", r)
    if shares:
        raise RuntimeError(f"shares never ended (a member waits for ever): {sorted(shares)}")
    n_run = sum(not t.source for t in tasks)
    return Result(end, n_run, fetches, fetched, busy, compute, sent[0], sent[1])


class _Share:
    """The bookkeeping of one running share (``run_exchange``'s ``_Schedule``): members
    whose inputs are all there, by index; the remote members by key."""

    __slots__ = ("busy", "left", "members", "readers", "ready", "remote", "task", "waiting")

    def __init__(self, task: SimTask):
        self.task = task
        self.members = task.program
        self.waiting = [len(m.deps) for m in self.members]
        self.readers: list = [[] for _ in self.members]
        for i, m in enumerate(self.members):
            for d in m.deps:
                self.readers[d].append(i)
        self.remote = {m.key: i for i, m in enumerate(self.members) if m.remote}
        self.ready = [i for i, m in enumerate(self.members) if not m.remote and not m.deps]
        heapq.heapify(self.ready)
        self.left = len(self.members)
        self.busy = False

    def done(self, i: int) -> None:
        self.left -= 1
        for r in self.readers[i]:
            self.waiting[r] -= 1
            if not self.waiting[r]:
                heapq.heappush(self.ready, r)


# -- durations --------------------------------------------------------------------------


@dataclass(frozen=True)
class DurationModel:
    """Seconds of a tile task: ``c + a * FLOPs + b * bytes`` with ``(c, a, b)`` of its
    kind (``"*"`` for kinds not measured).

    Example:
        >>> round(DurationModel({"*": (1e-4, 1e-10, 0.0)})(Cost("Conv", 1e9, 0.0, 0.0)), 6)
        0.1001
    """

    coef: dict[str, tuple[float, float, float]]

    def __call__(self, cost: Cost) -> float:
        c, a, b = self.coef.get(cost.kind, self.coef["*"])
        return c + a * cost.flops + b * cost.io_bytes


def measure_tasks(sp, repeat: int = 2) -> list[tuple[str, float, float, float]]:
    """``(kind, FLOPs, bytes, seconds)`` of every tile task of the plan's lowered graph,
    executed here in this process, one task at a time on one thread, BLAS on one thread
    as in a worker process of one thread (the last of ``repeat`` runs: the first
    compiles the kernels).

    Example:
        >>> recs = measure_tasks(step_plan("mlp", dict(sizes=(8, 4, 2)), batch=4, n=1))
        >>> {r[0] for r in recs} >= {"Gemm"}
        True
    """
    from threadpoolctl import threadpool_limits

    from dfdl.taskgraph.lower import lower

    dsk, src = scale_graph.sources(sp, arrays=True)
    tasks, _ = lower(sp.plan, src, step=0, attrs=sp.tg.seeds(0, 0), token=TOKEN)
    dsk.update(tasks)
    costs = TaskCosts(sp)
    out: list = []
    with threadpool_limits(limits=1):
        for _ in range(repeat):
            out = _run_timed(dsk, costs)
    return out


def _run_timed(dsk: dict, costs: TaskCosts) -> list:
    import graphlib

    deps = {k: set(getattr(v, "dependencies", ())) for k, v in dsk.items()}
    left = {k: 0 for k in dsk}
    for ds in deps.values():
        for d in ds:
            left[d] += 1
    cache: dict = {}
    out = []
    for k in graphlib.TopologicalSorter(deps).static_order():
        node = dsk[k]
        t0 = time.perf_counter()
        cache[k] = node(cache) if isinstance(node, Task) else node.value
        seconds = time.perf_counter() - t0
        if isinstance(node, Task):
            c = costs(k)
            out.append((c.kind, c.flops, c.io_bytes, seconds))
        for d in deps[k]:
            left[d] -= 1
            if not left[d]:
                del cache[d]
    return out


def fit(records: Iterable[tuple[str, float, float, float]]) -> DurationModel:
    """Non-negative least squares of ``seconds ~ c + a * FLOPs + b * bytes`` per kind
    (kinds with fewer than 4 tasks use the fit over all tasks, ``"*"``); absolute
    errors, so the long tasks, which set the step, weigh the most.

    Example:
        >>> recs = [("Conv", f, 0.0, 1e-4 + f * 1e-10) for f in (1e6, 1e7, 1e8, 1e9)]
        >>> round(fit(recs)(Cost("Conv", 5e8, 0.0, 0.0)), 4)
        0.0501
    """
    from scipy.optimize import nnls

    records = list(records)
    groups: dict = {"*": records}
    for r in records:
        groups.setdefault(r[0], []).append(r)
    coef = {}
    for kind, rs in groups.items():
        if len(rs) < 4:
            continue
        x = np.array([[1.0, r[1], r[2]] for r in rs])
        y = np.array([r[3] for r in rs])
        scale = x.max(axis=0)
        scale[scale == 0] = 1.0
        sol, _ = nnls(x / scale, y)
        coef[kind] = tuple(float(v) for v in sol / scale)
    return DurationModel(coef)


# -- the graph as simulated tasks -------------------------------------------------------


def sim_tasks(
    sp,
    dsk: dict,
    carried: dict,
    model: DurationModel,
    threads: int = 1,
    measured: dict[str, float] | None = None,
    parts_only: bool = False,
) -> list[SimTask]:
    """The simulated tasks of an optimized step graph (:func:`scale_graph.step_graph`):
    each task on its worker, lasting its members' modelled times (run one after another,
    or list-scheduled on ``threads`` threads), each value its bytes; a share of the
    direct-exchange design (``run_exchange``) as a program of members
    (:func:`_program`). ``measured``: a member's seconds by :func:`member_id` (a real
    run's), used where it has the member. ``parts_only``: a what-if, each direct message
    carrying only the parts of the value its reader takes (the engine sends the whole).

    Example:
        >>> sp = step_plan("resnet", RESNET_TINY, batch=8, n=2, tiles=TWO_TILES)
        >>> dsk, carried = step_graph(sp, 2)
        >>> tasks = sim_tasks(sp, dsk, carried, DurationModel({"*": (1e-3, 0.0, 0.0)}))
        >>> sorted({t.worker for t in tasks if not t.source})
        [0, 1]
    """
    costs = TaskCosts(sp)
    measured = measured or {}

    def seconds(task: Task) -> float:
        got = measured.get(member_id(task.key))
        return got if got is not None else sum(model(costs(m.key)) for m in members(task))

    worker: dict = {}

    def worker_of(k) -> int:
        if k in worker:
            return worker[k]
        stack = [k]
        while stack:
            top = stack[-1]
            node = dsk.get(top)
            if _is_step(top):
                worker[top] = top[2] if len(top) == 4 else 0
            elif isinstance(node, Task):
                todo = [d for d in node.dependencies if d in dsk and d not in worker]
                todo = [d for d in todo if not isinstance(dsk[d], DataNode)]
                if todo:
                    stack.extend(todo)
                    continue
                placed = [worker[d] for d in node.dependencies if d in worker]
                worker[top] = placed[0] if placed else 0
            else:
                worker[top] = 0
            stack.pop()
        return worker[k]

    new_home = {src: worker_of(new) for src, new in carried.items() if new in dsk}
    parts = _parts_taken(dsk, costs) if parts_only else None
    out = []
    for k, node in dsk.items():
        if isinstance(node, DataNode):
            home = new_home.get(k)
            size = _source_bytes(sp, k) if home is not None else 0.0
            out.append(SimTask(k, 0, 0.0, (), size, source=True, home=home))
            continue
        deps = tuple(node.dependencies)
        if _is_step(k) and node.func is run_exchange:
            program = _program(node, seconds, costs, parts)
            dur = sum(m.duration for m in program)
            out.append(SimTask(k, worker_of(k), dur, deps, 0.0, program=program))
        elif _is_step(k):
            dur = _step_duration(node, seconds, threads)
            out.append(SimTask(k, worker_of(k), dur, deps, 0.0))
        elif node.func in (operator.getitem, _item_after):
            out.append(SimTask(k, worker_of(k), 0.0, deps, costs(k).out_bytes))
        else:
            dur = seconds(node)
            out.append(SimTask(k, worker_of(k), dur, deps, costs(k).out_bytes))
    return out


def _program(
    node: Task, seconds, costs: TaskCosts, parts: dict | None = None
) -> tuple[Member, ...]:
    """A ``run_exchange`` task's members as :class:`Member`\\ s, in its order: each one's
    modelled seconds, the indices of the members it reads, and the messages it sends
    (to each worker in its ``owed`` entry, the parts of the value it reads, as the engine
    sends them: of a fused task's packed outputs, :func:`_value_bytes`, those its members
    take). ``parts``: ``{(key, worker): bytes}`` to send instead (:func:`_parts_taken`)."""
    tasks, deps, _exports, owed, _peers, _me = node.args[:6]
    owed = {i: list(zip(ps, rest[0] if rest else [None] * len(ps))) for i, ps, *rest in owed}
    out = []
    for i, t in enumerate(tasks):
        if t.func is exchange.receive:
            out.append(Member(t.key, 0.0, (), (), remote=True))
            continue
        sizes = _value_bytes(t, costs) if i in owed else []
        sends = []
        for p, taken in owed.get(i, ()):
            if taken is None or any(k >= len(sizes) for k in taken):
                sent = float(sum(sizes))  # whole, or parts of a value not sized by part
            else:
                sent = float(sum(sizes[k] for k in taken))
            sends.append((p, sent if parts is None else parts.get((t.key, p), sent)))
        sends = tuple(sends)
        out.append(Member(t.key, seconds(t), tuple(deps[i]), sends))
    return tuple(out)


def _value_bytes(task: Task, costs: TaskCosts) -> list[float]:
    """Bytes of each part of a member's value: one part, or a fused task's packed
    outputs (its value and the values it carries, ``fuse._pack``)."""
    if task.func is run_fused:
        program, last = task.args[0], task.args[1]
        for m, _ in program:
            if m.key == last and getattr(m.func, "__name__", "") == "_pack":
                return [costs(a.key).out_bytes for a in m.args if isinstance(a, TaskRef)]
    return [costs(task.key).out_bytes]


def _parts_taken(dsk: dict, costs: TaskCosts) -> dict:
    """``{(key, worker): bytes}``: for each value a share receives, the bytes of the
    parts its members take (``getitem(value, i)``; all of it where one reads it whole)."""
    senders: dict = {}
    shares = [(k, v) for k, v in dsk.items() if _is_step(k) and v.func is run_exchange]
    for _, node in shares:
        for t in node.args[0]:
            if t.func is not exchange.receive:
                senders[t.key] = t
    out = {}
    for g, node in shares:
        remote = {t.key for t in node.args[0] if t.func is exchange.receive}
        taken: dict = {}
        for t in node.args[0]:
            if t.key not in remote:
                _refs(t, remote, taken)
        for k in remote:
            sizes = _value_bytes(senders[k], costs)
            got = taken.get(k)
            out[(k, g[2])] = float(
                sum(sizes) if got is None else sum(sizes[i] for i in got if i < len(sizes))
            )
    return out


def _refs(node: object, keys: set, taken: dict) -> None:
    """Into ``taken``: for each of ``keys`` that ``node`` reads, the parts it takes
    (``getitem(key, i)``), or None where it reads the value whole."""
    if isinstance(node, TaskRef):
        if node.key in keys:
            taken[node.key] = None
        return
    if isinstance(node, Task):
        if node.func is operator.getitem and isinstance(node.args[0], TaskRef):
            k = node.args[0].key
            if k in keys:
                if k not in taken:
                    taken[k] = set()
                if taken[k] is not None:
                    taken[k].add(node.args[1])
                return
        for a in (*node.args, *node.kwargs.values()):
            _refs(a, keys, taken)
    elif isinstance(node, (tuple, list)):
        for a in node:
            _refs(a, keys, taken)
    elif isinstance(node, dict):
        for a in node.values():
            _refs(a, keys, taken)


def _is_step(key) -> bool:
    return isinstance(key, tuple) and key and key[0] == task_name(STEP_NAME, TOKEN)


def _source_bytes(sp, key) -> float:
    name = key[0].removesuffix(f"-src-{TOKEN}")
    chunks = sp.plan.chunks[name]
    idx = key[2:]
    shape = [c[i] for c, i in zip(chunks, idx)]
    return float(math.prod(shape) * np.dtype(sp.plan.graph.types[name].dtype).itemsize)


def _step_duration(node: Task, seconds: Callable[[Task], float], threads: int) -> float:
    """A step task's time: its members one after another, or on ``threads`` threads in
    their priority order, each as soon as what it reads is done (list scheduling)."""
    tasks, deps = node.args[0], node.args[1]
    times = [seconds(t) for t in tasks]
    if threads == 1:
        return sum(times)
    free = [0.0] * threads
    done = [0.0] * len(tasks)
    for i in range(len(tasks)):
        ready = max((done[d] for d in deps[i]), default=0.0)
        j = min(range(threads), key=free.__getitem__)
        done[i] = max(ready, free[j]) + times[i]
        free[j] = done[i]
    return max(done, default=0.0)


# -- what the simulation needs measured here --------------------------------------------


def measure_overheads(levels: int = 100) -> dict:
    """Dask's level latency here (bench/dask_floor.py) on one worker process of one
    thread at widths 1 and 4, and on two processes at width 2 (every task reads both
    of the level before, so each worker fetches one value from the other); solved as
    ``level(w on one) = rtt + w * task``, ``level(2 on two) = rtt + 2 * task + fetch``.

    Example:
        >>> measure_overheads()["overheads"]  # doctest: +SKIP
        {'task_s': 0.0014, 'rtt_s': 0.00096, 'fetch_s': 0.0071}
    """
    import dask_floor
    from distributed import Client

    from dfdl.runtime.cluster import local_cluster

    got = {}
    for procs, widths in ((1, (1, 4)), (2, (2,))):
        with local_cluster(procs) as cluster, Client(cluster) as client:
            dask_floor.level_latency(client, widths[0], 20, 1)  # warm-up
            for w in widths:
                got[f"{procs}x{w}"] = dask_floor.level_latency(client, w, levels)
    task = max(0.0, (got["1x4"] - got["1x1"]) / 3)
    rtt = max(0.0, got["1x1"] - task)
    fetch = max(0.0, got["2x2"] - rtt - 2 * task)
    return {"levels_s": got, "overheads": asdict(Overheads(task, rtt, fetch))}


def measure_send(rounds: int = 200, nbytes: int = 64) -> dict[str, float]:
    """A direct message between two worker processes here (the engine's
    ``exchange.Outbox.send`` of a ``nbytes`` array to the other worker's mailbox, taken
    there with ``exchange.receive``), two ways, each the best of three after a warm-up:
    ``one_way_s``, half a round trip of a ping-pong of ``rounds`` round trips between a
    task on each worker (one message in flight); ``burst_s``, per message of ``rounds``
    messages sent back to back by one task and taken by the other (what the sender's
    event loop spends per message when it sends many). Returns both and the overheads
    the simulation takes: ``send_s`` = ``burst_s`` (the sender's event loop, one message
    at a time) and ``message_s`` = ``one_way_s - burst_s`` (the rest of a message's way:
    the receiver's loop and the waiting thread's wake-up, a delay).

    Example:
        >>> measure_send()  # doctest: +SKIP
        {'one_way_s': 0.00077, 'burst_s': 0.0002, 'send_s': 0.0002, 'message_s': 0.00057}
    """
    from distributed import Client

    from dfdl.runtime.cluster import local_cluster

    def play(peer: str, role: str, rounds: int, nbytes: int, tag: str) -> float:
        from dfdl.taskgraph import exchange as ex

        ex.begin()
        box = ex.Outbox()
        value = np.ones(nbytes // 8)
        t0 = time.perf_counter()
        for i in range(rounds):
            if role == "ping":
                box.send(peer, (f"ping-{tag}", i), value)
                ex.receive((f"pong-{tag}", i))
            elif role == "pong":
                ex.receive((f"ping-{tag}", i))
                box.send(peer, (f"pong-{tag}", i), value)
            elif role == "burst":
                box.send(peer, (f"burst-{tag}", i), value)
            else:
                ex.receive((f"burst-{tag}", i))
        box.close()
        return time.perf_counter() - t0

    got = {"one_way_s": math.inf, "burst_s": math.inf}
    with local_cluster(2) as cluster, Client(cluster) as client:
        a, b = sorted(client.scheduler_info()["workers"])
        for j in range(4):
            n = 20 if j == 0 else rounds  # the first: a warm-up
            for what, roles, per in (
                ("one_way_s", ("ping", "pong"), 2),
                ("burst_s", ("burst", "take"), 1),
            ):
                fb = client.submit(
                    play, a, roles[1], n, nbytes, f"{what}{j}", workers=[b], pure=False
                )
                fa = client.submit(
                    play, b, roles[0], n, nbytes, f"{what}{j}", workers=[a], pure=False
                )
                took = max(fa.result(), fb.result())
                if j:
                    got[what] = min(got[what], took / (per * n))
    got["send_s"] = got["burst_s"]
    got["message_s"] = max(0.0, got["one_way_s"] - got["burst_s"])
    return got


def measure_bandwidth(nbytes: int = 64 * 2**20) -> float:
    """Bytes per second of one fetch of ``nbytes`` between two worker processes here
    (Dask's task stream "transfer" interval; the best of three).

    Example:
        >>> measure_bandwidth()  # doctest: +SKIP
        511492758.9
    """
    from distributed import Client, get_task_stream

    from dfdl.runtime.cluster import local_cluster

    best = math.inf
    with local_cluster(2) as cluster, Client(cluster) as client:
        a, b = sorted(client.scheduler_info()["workers"])
        for i in range(3):
            x = client.submit(np.ones, nbytes // 8, workers=[a], pure=False, key=f"bw-x-{i}")
            with get_task_stream(client) as ts:
                client.submit(np.sum, x, workers=[b], key=f"bw-s-{i}").result()
            for rec in ts.data:
                for ss in rec.get("startstops", ()):
                    if ss["action"] == "transfer":
                        best = min(best, ss["stop"] - ss["start"])
    return nbytes / best


def durations_for(runs: Sequence[tuple[str, dict, int, int, tuple, dict]]) -> tuple:
    """Measured tile tasks of each ``(workload, kwargs, batch, n, optimizer, dims)``
    plan and the duration model fitted to all of them; returns ``(model, records,
    seconds measured per run)``.

    Example:
        >>> model, recs, totals = durations_for(_timed_runs())  # doctest: +SKIP
    """
    records = []
    totals = []
    for name, kw, batch, n, opt, dims in runs:
        sp = step_plan(name, kw, batch, n, opt, dims)
        recs = measure_tasks(sp)
        records += recs
        totals.append((name, batch, n, sum(r[3] for r in recs), len(recs)))
        print(
            f"  timed {name} batch {batch} n={n}: {len(recs)} tasks, {totals[-1][3]:.3f} s",
            file=sys.stderr,
            flush=True,
        )
    return fit(records), records, totals


# -- calibration: real runs here ---------------------------------------------------------


def real_step(name: str, cfg: tuple, workers: int, steps: int = 4, warmup: int = 1) -> dict:
    """A real ``dfdl.train`` of bench/run.py's config ``cfg`` on ``workers`` worker
    processes of one thread here: seconds per step from Dask's task stream as
    bench/run.py measures it (the span from the end of the warm-up to the last step),
    and each tile task's mean seconds over the timed steps (the step tasks' members'
    runs, bench/run.py's ``with_members``), by :func:`member_id`.

    Example:
        >>> import run  # doctest: +SKIP
        >>> real_step("resnet", run.SMALL["resnet"], 2)["step_s"]  # doctest: +SKIP
        0.517
    """
    import run
    from distributed import Client

    from dfdl.models import ZOO
    from dfdl.runtime.cluster import local_cluster

    kw, batch, kind, okw, _ = cfg
    model = ZOO[name](**kw)
    x, y = run.make_data(name, kw, batch * (warmup + steps))
    with local_cluster(workers) as cluster, Client(cluster) as client:
        _, records = run.train_streamed(client, model, x, y, batch, kind, okw, warmup + steps)
    first = max(warmup, 1)
    span, _ = run._step_span(records, first, warmup + steps - 1)
    return {
        "step_s": span / (warmup + steps - first),
        "members": run.member_seconds(records, first),
    }


def predicted_step(
    name: str,
    kw: dict,
    batch: int,
    n: int,
    opt: tuple,
    dims: dict,
    model: DurationModel,
    over: Overheads,
    net: Network,
    threads: int = 1,
    measured: dict[str, float] | None = None,
) -> Result:
    """The simulated step of ``batch`` samples of a workload on ``n`` workers (tile
    tasks' seconds from ``measured`` where it has them, else from ``model``).

    Example:
        >>> free = Overheads(0.0, 0.0, 0.0)
        >>> res = predicted_step("resnet", RESNET_TINY, 8, 2, ("sgd", {"lr": 0.1}), {},
        ...                      DurationModel({"*": (1e-3, 0.0, 0.0)}), free, NETWORKS["ib100"])
        >>> res.makespan > 0
        True
    """
    sp = step_plan(name, kw, batch, n, opt, dims)
    dsk, carried = step_graph(sp, n)
    return simulate(sim_tasks(sp, dsk, carried, model, threads, measured), over, net)


# -- scaling ----------------------------------------------------------------------------

#: worker counts simulated
NS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: ResNet-50 at 224 px, 32 samples per worker, SGD with momentum (the issue's anchor)
RESNET50 = ({}, 32, "sgd", {"lr": 0.01, "momentum": 0.9}, {})


def workloads() -> dict[str, tuple]:
    """bench/run.py's full-size workloads and ResNet-50: name -> (kwargs, batch per
    worker at N = 1, optimizer kind, its kwargs, dims).

    Example:
        >>> sorted(workloads())
        ['mlp', 'resnet', 'resnet50', 'transformer', 'unet3d']
    """
    import run

    return {**run.FULL, "resnet50": RESNET50}


#: one component of the cost at a time taken away, on the first network (where the
#: curve bends and why): the scheduler's CPU per task, a fetch's software, the wire
def _ablations(
    over: Overheads, net: Network, design: str = "stages"
) -> dict[str, tuple[Overheads, Network]]:
    out = {
        "no_scheduler_cpu": (replace(over, task_s=0.0), net),
        "no_fetch_software": (replace(over, fetch_s=0.0), net),
        "no_wire": (over, Network("instant", 0.0, math.inf)),
    }
    if design == "direct":
        out["no_send_software"] = (replace(over, send_s=0.0, message_s=0.0), net)
        # a message's software a tenth of this loaded 2-core VM's (a node's idle core)
        tenth = replace(over, send_s=over.send_s / 10, message_s=over.message_s / 10)
        out["tenth_send_software"] = (tenth, net)
    return out


_GRAPHS: dict = {}


def graph_tasks(
    name: str,
    cfg: tuple,
    batch: int,
    n: int,
    model: DurationModel,
    design: str = "stages",
    parts_only: bool = False,
) -> tuple:
    """``(tasks, stages)`` of the simulated step of ``batch`` samples on ``n`` workers
    (built once per ``(name, batch, n, design)``); ``design`` "direct": each worker's
    share one task exchanging values directly (``stages`` is then 1), "stages": a task
    per worker and stage. ``parts_only``: see :func:`sim_tasks`.

    Example:
        >>> tasks, stages = graph_tasks("resnet50", RESNET50, 64, 2, model)  # doctest: +SKIP
    """
    key = (name, batch, n, design)
    if key not in _GRAPHS:
        kw, _, kind, okw, dims = cfg
        sp = step_plan(name, kw, batch, n, (kind, okw), dims)
        dsk, carried = step_graph(sp, n, direct=design == "direct")
        steps = [k for k in dsk if _is_step(k)]
        stages = 1 + max((k[3] for k in steps if len(k) == 4), default=0)
        _GRAPHS.clear()  # one at a time: the largest hold hundreds of MB
        _GRAPHS[key] = (sp, dsk, carried, stages, {})
    sp, dsk, carried, stages, made = _GRAPHS[key]
    if parts_only not in made:
        made[parts_only] = sim_tasks(sp, dsk, carried, model, parts_only=parts_only)
    return made[parts_only], stages


def scaling(
    name: str,
    cfg: tuple,
    mode: str,
    ns: Sequence[int],
    model: DurationModel,
    over: Overheads,
    nets: dict[str, Network],
    what_if: Overheads | None = None,
    design: str = "stages",
) -> list[dict]:
    """Simulated steps of one workload for each N: ``mode`` "strong" keeps the global
    batch (the config's; ResNet-50's is 32 x 64), "weak" the batch per worker (the
    config's); where the plan has fewer tiles than workers, the others idle. One row
    per N with each network's step, the ablations of :func:`_ablations` on the first
    network, and a what-if there: for the stage design ``what_if`` (other overheads),
    for the direct design (``design`` "direct") each message carrying only the parts
    of the value its reader takes (``parts_only``).

    Example:
        >>> rows = scaling("resnet50", RESNET50, "weak", (1, 64), model, over,  # doctest: +SKIP
        ...                {"ib100": NETWORKS["ib100"]}, WHAT_IF)
    """
    kw, batch, kind, okw, dims = cfg
    global_batch = batch * (64 if name == "resnet50" else 1)
    first = next(iter(nets.values()))
    rows = []
    labels: list[str] = []
    for n in ns:
        b = global_batch if mode == "strong" else batch * n
        t0 = time.perf_counter()
        tasks, stages = graph_tasks(name, cfg, b, n, model, design)
        row: dict = {"n": n, "batch": b, "stages": stages, "design": design}
        row["graph_tasks"] = sum(not t.source for t in tasks)
        row["members"] = sum(len(t.program or ()) for t in tasks)
        runs = {label: (tasks, over, net) for label, net in nets.items()}
        if design == "direct":
            parted, _ = graph_tasks(name, cfg, b, n, model, design, parts_only=True)
            runs["parts_only"] = (parted, over, first)
        elif what_if is not None:
            runs["what_if"] = (tasks, what_if, first)
        runs.update((k, (tasks, *v)) for k, v in _ablations(over, first, design).items())
        for label, (ts, o, net) in runs.items():
            res = simulate(ts, o, net)
            row[label] = {
                "step_s": res.makespan,
                "compute_per_worker_s": max(res.compute_s, default=0.0),
                "scheduler_busy_s": res.scheduler_busy_s,
                "fetches": res.fetches,
                "fetched_bytes": res.fetched_bytes,
                "messages": res.messages,
                "message_bytes": res.message_bytes,
            }
        row["build_and_simulate_s"] = time.perf_counter() - t0
        rows.append(row)
        labels = list(runs)
        shown = ", ".join(f"{k} {row[k]['step_s']:.3f} s" for k in runs)
        print(f"  {name} {mode} {design} N={n}: {shown}", file=sys.stderr, flush=True)
    _efficiencies(rows, mode, labels)
    return rows


def _efficiencies(rows: list[dict], mode: str, labels: Iterable[str]) -> None:
    """Adds each row's efficiency against N = 1: strong ``T1 / (N * TN)``, weak
    ``T1 / TN`` (the work per worker is the same)."""
    if not rows or rows[0]["n"] != 1:
        return
    for label in labels:
        if label not in rows[0]:
            continue
        t1 = rows[0][label]["step_s"]
        for r in rows:
            tn = r[label]["step_s"]
            r[label]["efficiency"] = t1 / (r["n"] * tn) if mode == "strong" else t1 / tn
            r[label]["speedup"] = r["n"] * r[label]["efficiency"]


# -- the plot ---------------------------------------------------------------------------

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def svg_plot(panels: list[tuple[str, dict[str, list[tuple[int, float]]]]], path: str) -> None:
    """Writes an SVG of efficiency (0..1.1) against N (log 2 axis), one panel per
    ``(title, {label: [(N, efficiency)]})``; a label ending in ")" (a what-if, a
    comparison) is dashed.

    Example:
        >>> svg_plot([("strong", {"a": [(1, 1.0), (2, 0.9)]})], "/tmp/x.svg")
    """
    w, h, pad = 420, 300, 48
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w * len(panels)}" height="{h + 90}"'
        f' font-family="sans-serif" font-size="11">',
        f'<rect width="{w * len(panels)}" height="{h + 90}" fill="white"/>',
    ]
    labels = sorted({lab for _, series in panels for lab in series})
    color = {lab: COLORS[i % len(COLORS)] for i, lab in enumerate(labels)}
    for p, (title, series) in enumerate(panels):
        ox = p * w
        top, bottom, left, right = 24, h - pad, ox + pad, ox + w - 12
        maxn = max((n for pts in series.values() for n, _ in pts), default=2)
        span = max(1.0, math.log2(maxn))

        def x(n: float, left=left, right=right, span=span) -> float:
            return left + (right - left) * math.log2(n) / span

        def y(e: float, top=top, bottom=bottom) -> float:
            return bottom - (bottom - top) * min(e, 1.1) / 1.1

        parts.append(f'<text x="{left}" y="16" font-weight="bold">{title}</text>')
        parts.append(
            f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}"'
            ' fill="none" stroke="#888"/>'
        )
        for e in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):
            parts.append(
                f'<line x1="{left}" x2="{right}" y1="{y(e):.1f}" y2="{y(e):.1f}" stroke="#ddd"/>'
            )
            parts.append(
                f'<text x="{left - 6}" y="{y(e) + 4:.1f}" text-anchor="end">{e:.1f}</text>'
            )
        k = 1
        while k <= maxn:
            parts.append(f'<text x="{x(k):.1f}" y="{bottom + 14}" text-anchor="middle">{k}</text>')
            k *= 2
        parts.append(
            f'<text x="{(left + right) / 2}" y="{bottom + 30}" text-anchor="middle">'
            "worker processes N</text>"
        )
        for lab, pts in series.items():
            dash = ' stroke-dasharray="5,3"' if lab.endswith(")") else ""
            coords = " ".join(f"{x(n):.1f},{y(e):.1f}" for n, e in pts)
            parts.append(
                f'<polyline points="{coords}" fill="none" stroke="{color[lab]}"'
                f' stroke-width="1.8"{dash}/>'
            )
    for i, lab in enumerate(labels):
        lx, ly = 12 + (i % 3) * 260, h + 24 + (i // 3) * 16
        dash = ' stroke-dasharray="5,3"' if lab.endswith(")") else ""
        parts.append(
            f'<line x1="{lx}" x2="{lx + 24}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color[lab]}"'
            f' stroke-width="1.8"{dash}/>'
        )
        parts.append(f'<text x="{lx + 30}" y="{ly}">{lab}</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


# -- the command ------------------------------------------------------------------------


#: the plans whose tile tasks are timed for the duration model: bench/run.py's small
#: workloads on 1 and 2 workers (the calibration runs' tiles) and ResNet-50 at 2 and 8
#: samples
def _timed_runs() -> list[tuple]:
    import run

    out = []
    for name, (kw, batch, kind, okw, dims) in run.SMALL.items():
        for n in (1, 2):
            out.append((name, kw, batch, n, (kind, okw), dims))
    for b in (2, 8):
        out.append(("resnet50", {}, b, 1, ("sgd", {"lr": 0.01, "momentum": 0.9}), {}))
    return out


def measure(path: str, parts: Sequence[str] = ("overheads", "send", "real", "tasks")) -> dict:
    """Measures here what the simulation takes from this machine and adds it to the
    JSON at ``path`` (made if missing): ``overheads`` (Dask's, and the loopback
    bandwidth), ``send`` (a direct message's software, :func:`measure_send`), ``real``
    (the real 1- and 2-process step times of bench/run.py's small
    workloads), ``tasks`` (the timed tile tasks); with the 1-minute load averages.

    Example:
        >>> measure("measured.json", ["overheads"])  # doctest: +SKIP
    """
    import run

    out: dict = {}
    if os.path.exists(path):
        with open(path) as f:
            out = json.load(f)
    machine = out.setdefault("machine", {"cpus": os.cpu_count(), "platform": platform.platform()})
    for part in parts:
        machine[f"loadavg_before_{part}"] = os.getloadavg()
        if part == "overheads":
            out.update(measure_overheads())
            out["bandwidth_bytes_s"] = measure_bandwidth()
        elif part == "send":
            got = measure_send()
            out["send"] = got
            out.setdefault("overheads", {}).update(send_s=got["send_s"], message_s=got["message_s"])
        elif part == "real":
            # tile tasks at the priority the timed tile tasks had (dfdl's workers run
            # them at nice 10, which on a machine other jobs load stretches them)
            os.environ["DASK_DFDL__WORKER__TASK_NICE"] = "0"
            machine["real_runs_task_nice"] = 0
            real = out.setdefault("real_step_s", {})
            for name in run.SMALL:
                for w in (1, 2):
                    real[f"{name}/{w}"] = real_step(name, run.SMALL[name], w)
                    print(
                        f"  real {name} on {w}: {real[f'{name}/{w}']['step_s']:.3f} s/step",
                        file=sys.stderr,
                        flush=True,
                    )
        else:
            _, records, totals = durations_for(_timed_runs())
            out["task_records"] = records
            out["task_totals"] = totals
        machine[f"loadavg_after_{part}"] = os.getloadavg()
        with open(path, "w") as f:
            json.dump(out, f)
    return out


def calibration(measured: dict, model: DurationModel, over: Overheads) -> list[dict]:
    """The simulated 1- and 2-process steps of bench/run.py's small workloads here
    (loopback network at the measured bandwidth; workers of one thread, which have no
    gang helper) against the measured ones: with each tile task's seconds from the real
    run itself (``error_real_durations``: the graph, scheduler and network model alone)
    and from the fitted duration model (``error``: the whole simulation).

    Example:
        >>> rows = calibration(measured, fit(measured["task_records"]), over)  # doctest: +SKIP
    """
    import run

    local = Network("this machine's loopback", 0.0, measured["bandwidth_bytes_s"], True)
    rows = []
    for key, real in measured["real_step_s"].items():
        name, w = key.split("/")
        n = int(w)
        kw, batch, kind, okw, dims = run.SMALL[name]
        args = (name, kw, batch, n, (kind, okw), dims, model, over, local)
        modelled = predicted_step(*args).makespan
        replayed = predicted_step(*args, measured=real["members"]).makespan
        rows.append(
            {
                "workload": name,
                "workers": n,
                "real_step_s": real["step_s"],
                "simulated_step_s": modelled,
                "error": modelled / real["step_s"] - 1,
                "simulated_real_durations_s": replayed,
                "error_real_durations": replayed / real["step_s"] - 1,
                "real_members_s": sum(real["members"].values()),
            }
        )
        r = rows[-1]
        print(
            f"  calibration {name} on {n}: real {real['step_s']:.3f} s, simulated"
            f" {modelled:.3f} s ({100 * r['error']:+.1f}%), with the run's own task times"
            f" {replayed:.3f} s ({100 * r['error_real_durations']:+.1f}%)",
            file=sys.stderr,
            flush=True,
        )
    return rows


#: the what-if: no scheduler inside a step (each worker runs its whole share as one
#: program and exchanges directly with the others, 1 us of software per message)
WHAT_IF = Overheads(task_s=0.0, rtt_s=0.0, fetch_s=1e-6)


def calibration_direct(
    scale_out: dict, measured: dict, model: DurationModel, over: Overheads
) -> list[dict]:
    """The direct-exchange design against real runs here: ``bench/scale_out.py``'s
    arms ``one`` (one worker process of 2 threads: one step task, its members
    list-scheduled on the 2 threads) and ``shares`` (2 processes of one thread, each
    worker's share one task exchanging directly) of bench/run.py's full-size workloads,
    with the plan those runs had (the ``tiling`` recorded), the fitted durations, the
    measured overheads and the loopback network at the measured bandwidth.

    Example:
        >>> rows = calibration_direct(json.load(open(so)), measured, model, over)  # doctest: +SKIP
    """

    local = Network("this machine's loopback", 0.0, measured["bandwidth_bytes_s"], True)
    rows = []
    for r in scale_out["rows"]:
        name = r["workload"]
        kw, batch, kind, okw, dims = workloads()[name]
        batch = r.get("batch", batch)  # (ResNet-50's real runs take 8 samples, not 32)
        tiles = r["tiling"]
        for arm, n, threads in (("one", 1, 2), ("shares", 2, 1)):
            if arm not in r:
                continue
            sp = step_plan(name, kw, batch, n, (kind, okw), dims, tiles=tiles)
            dsk, carried = step_graph(sp, n, direct=True, threads=threads)
            tasks = sim_tasks(sp, dsk, carried, model, threads)
            res = simulate(tasks, over, local)
            row = {
                "workload": name,
                "workers": n,
                "threads": threads,
                "arm": arm,
                "real_step_s": r[arm],
                "simulated_step_s": res.makespan,
                "error": res.makespan / r[arm] - 1,
                "compute_per_worker_s": max(res.compute_s),
                "messages": res.messages,
                "message_bytes": res.message_bytes,
            }
            own = r.get(f"{arm}_members")
            if own:  # the same simulation, each member lasting what it took in this run
                found = _members_found(dsk, own)
                replay = simulate(sim_tasks(sp, dsk, carried, model, threads, own), over, local)
                row.update(
                    simulated_real_durations_s=replay.makespan,
                    error_real_durations=replay.makespan / r[arm] - 1,
                    compute_per_worker_real_durations_s=max(replay.compute_s),
                    members_found=found,
                )
            rows.append(row)
            replayed = (
                f"; with the run's own member times {row['simulated_real_durations_s']:.3f} s"
                f" ({100 * row['error_real_durations']:+.1f}%, {row['members_found']:.0%}"
                " of members found)"
                if own
                else ""
            )
            print(
                f"  calibration (direct) {name} {arm}: real {r[arm]:.3f} s, simulated"
                f" {res.makespan:.3f} s ({100 * row['error']:+.1f}%; members"
                f" {max(res.compute_s):.3f} s per worker){replayed}",
                file=sys.stderr,
                flush=True,
            )
    return rows


def _member_tasks(dsk: dict) -> list[Task]:
    """An optimized step graph's members: the tasks its step tasks run (receives of
    another worker's values left out), and the tasks outside them."""
    tasks = []
    for k, node in dsk.items():
        if not isinstance(node, Task):
            continue
        if _is_step(k):
            tasks += [m for m in node.args[0] if m.func is not exchange.receive]
        elif node.func not in (operator.getitem, _item_after):
            tasks.append(node)
    return tasks


def _members_found(dsk: dict, measured: dict[str, float]) -> float:
    """The share of an optimized step graph's members whose seconds ``measured`` has."""
    tasks = _member_tasks(dsk)
    return sum(member_id(t.key) in measured for t in tasks) / max(len(tasks), 1)


def simulate_all(
    measured: dict,
    ns: Sequence[int],
    names: Sequence[str],
    calibrate: bool = True,
    dump: str | None = None,
    command: str = "",
    design: str = "direct",
    scale_out: dict | None = None,
) -> dict:
    """Calibration (if ``calibrate``) and strong and weak scaling of ``names`` from a
    :func:`measure` file (written to ``dump`` after each workload, if given), for the
    ``design`` "direct" (each worker's share of a step one task, values exchanged
    directly: the engine's default; calibrated against ``scale_out``, a
    ``bench/scale_out.py`` result) or "stages" (a task per worker and stage, calibrated
    against the measure file's real runs).

    Example:
        >>> out = simulate_all(measured, [1, 2, 4], ["resnet50"])  # doctest: +SKIP
    """
    model = fit(map(tuple, measured["task_records"]))
    over = Overheads(**measured["overheads"])
    out: dict = {
        "command": command,
        "design": design,
        "overheads": asdict(over),
        "networks": {k: asdict(v) for k, v in NETWORKS.items()},
        "duration_model": model.coef,
    }
    if design == "stages":
        out["what_if_overheads"] = asdict(WHAT_IF)
    out["fit_check"] = _fit_check(measured, model)
    if calibrate and design == "direct" and scale_out is not None:
        out["calibration"] = calibration_direct(scale_out, measured, model, over)
    elif calibrate and design == "stages":
        out["calibration"] = calibration(measured, model, over)
    nets = {k: NETWORKS[k] for k in ("ib100", "eth25")}
    out["scaling"] = {}
    for name in names:
        cfg = workloads()[name]
        out["scaling"][name] = {
            mode: scaling(name, cfg, mode, ns, model, over, nets, WHAT_IF, design)
            for mode in ("strong", "weak")
        }
        if dump:
            with open(dump, "w") as f:
                json.dump(out, f, indent=1)
    return out


def _fit_check(measured: dict, model: DurationModel) -> list[dict]:
    """Per timed plan: the measured seconds of its tile tasks and the model's sum."""
    rows = []
    recs = [tuple(r) for r in measured["task_records"]]
    i = 0
    for name, batch, n, total, count in measured["task_totals"]:
        chunk = recs[i : i + count]
        i += count
        predicted = sum(model(Cost(k, f, b, 0.0)) for k, f, b, _ in chunk)
        rows.append(
            {
                "workload": name,
                "batch": batch,
                "n": n,
                "measured_s": total,
                "model_s": predicted,
                "error": predicted / total - 1 if total else 0.0,
            }
        )
    return rows


def _table(out: dict) -> str:
    lines = ["calibration (real vs simulated, this machine; with the run's own task times):"]
    for r in out.get("calibration", []):
        replayed = (
            f"  ({r['simulated_real_durations_s']:.3f} s {100 * r['error_real_durations']:+.1f}%)"
            if "simulated_real_durations_s" in r
            else ""
        )
        lines.append(
            f"  {r['workload']:12s} N={r['workers']}x{r.get('threads', 1)}"
            f"  real {r['real_step_s']:.3f} s"
            f"  simulated {r['simulated_step_s']:.3f} s  {100 * r['error']:+.1f}%" + replayed
        )
    for name, modes in out["scaling"].items():
        for mode, rows in modes.items():
            lines.append(
                f"{name} {mode} scaling: N, batch, stages, step s and efficiency"
                " (ib100 | eth25 | what-if or parts only)"
            )
            for r in rows:
                cells = [
                    f"{r[k]['step_s']:.3f} {100 * r[k].get('efficiency', 0):5.1f}%"
                    for k in ("ib100", "eth25", "what_if", "parts_only")
                    if k in r
                ]
                lines.append(
                    f"  {r['n']:4d} {r['batch']:6d} {r['stages']:4d}  " + " | ".join(cells)
                )
    return "\n".join(lines)


def markdown(out: dict) -> str:
    """The result's tables as Markdown (for ``docs/design/scale-sim.md``).

    Example:
        >>> markdown({"scaling": {}}).splitlines()[0].startswith("| workload |")
        True
    """
    direct = out.get("design") == "direct"
    if direct:
        lines = [
            "| workload | workers x threads | real s/step | simulated | error |"
            " busiest worker's compute s | messages | MB sent |"
            " simulated, the run's member times | error |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in out.get("calibration", []):
            replay = (
                f" {r['simulated_real_durations_s']:.3f} |"
                f" {100 * r['error_real_durations']:+.1f}% |"
                if "error_real_durations" in r
                else " - | - |"
            )
            lines.append(
                f"| {r['workload']} | {r['workers']} x {r['threads']} | {r['real_step_s']:.3f} |"
                f" {r['simulated_step_s']:.3f} | {100 * r['error']:+.1f}% |"
                f" {r['compute_per_worker_s']:.3f} | {r['messages']} |"
                f" {r['message_bytes'] / 1e6:.0f} |" + replay
            )
        labels: tuple = (
            "ib100",
            "eth25",
            "parts_only",
            "no_scheduler_cpu",
            "no_send_software",
            "tenth_send_software",
            "no_fetch_software",
            "no_wire",
        )
    else:
        lines = [
            "| workload | workers | real s/step | simulated (fitted durations) | error |"
            " simulated (the run's task times) | error |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in out.get("calibration", []):
            lines.append(
                f"| {r['workload']} | {r['workers']} | {r['real_step_s']:.3f} |"
                f" {r['simulated_step_s']:.3f} | {100 * r['error']:+.1f}% |"
                f" {r['simulated_real_durations_s']:.3f} |"
                f" {100 * r['error_real_durations']:+.1f}% |"
            )
        labels = ("ib100", "eth25", "what_if", "no_scheduler_cpu", "no_fetch_software", "no_wire")
    old = out.get("stage_design", {})
    extra = ["stage design, ib100"] if direct and old else []
    for mode in ("strong", "weak"):
        lines += ["", f"{mode} scaling: efficiency (step s)", ""]
        lines.append("| workload | N | batch | stages | " + " | ".join([*labels, *extra]) + " |")
        lines.append("|---" * (4 + len(labels) + len(extra)) + "|")
        for name, modes in out["scaling"].items():
            before = {r["n"]: r for r in old.get(name, {}).get(mode, [])}
            for r in modes[mode]:
                cells = [
                    f"{100 * r[k]['efficiency']:.0f}% ({r[k]['step_s']:.3g})" if k in r else "-"
                    for k in labels
                ]
                if extra:
                    b = before.get(r["n"])
                    cells.append(f"{100 * b['efficiency']:.0f}% ({b['step_s']:.3g})" if b else "-")
                lines.append(
                    f"| {name} | {r['n']} | {r['batch']} | {r['stages']} | "
                    + " | ".join(cells)
                    + " |"
                )
    return "\n".join(lines)


def stage_figures(old: dict, path: str) -> dict:
    """The 100 Gb/s figures of a stage-design result, for comparison: ``{workload:
    {mode: [{n, batch, step_s, efficiency}]}}`` and where they come from.

    Example:
        >>> stage_figures({"scaling": {}}, "x.json")
        {'from': 'x.json'}
    """
    out: dict = {"from": path}
    for name, modes in old.get("scaling", {}).items():
        out[name] = {
            mode: [
                {
                    "n": r["n"],
                    "batch": r["batch"],
                    "step_s": r["ib100"]["step_s"],
                    "efficiency": r["ib100"].get("efficiency"),
                }
                for r in rows
            ]
            for mode, rows in modes.items()
        }
    return out


def plot(out: dict, path: str) -> None:
    """The efficiency curves of :func:`simulate_all`'s result over 100 Gb/s.

    Example:
        >>> plot(out, "docs/design/scale-sim.svg")  # doctest: +SKIP
    """
    panels = []
    for mode in ("strong", "weak"):
        series = {}
        for name, modes in out["scaling"].items():
            rows = modes[mode]
            series[name] = [(r["n"], r["ib100"]["efficiency"]) for r in rows]
            if name == "resnet50" and "what_if" in rows[0]:
                series["resnet50 (what-if)"] = [(r["n"], r["what_if"]["efficiency"]) for r in rows]
            if name == "resnet50" and "no_send_software" in rows[0]:
                series["resnet50 (no message software)"] = [
                    (r["n"], r["no_send_software"]["efficiency"]) for r in rows
                ]
        old = out.get("stage_design", {}).get("resnet50", {}).get(mode)
        if old:
            series["resnet50 (stage design)"] = [(r["n"], r["efficiency"]) for r in old]
        design = "direct exchange" if out.get("design") == "direct" else "stage design"
        panels.append((f"{mode}, 100 Gb/s InfiniBand, {design} (simulated)", series))
    svg_plot(panels, path)


def main(argv: list[str] | None = None) -> int:
    """``--measure FILE`` measures here; ``--from FILE --json OUT`` simulates (also
    ``--from OUT --replot``: the plot and tables of an earlier simulation).

    Example:
        >>> main(["--from", "measured.json", "--json", "out.json"])  # doctest: +SKIP
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", default=None, help="measure here and write this file")
    ap.add_argument(
        "--parts",
        nargs="+",
        default=["overheads", "send", "real", "tasks"],
        choices=["overheads", "send", "real", "tasks"],
        help="with --measure: what",
    )
    ap.add_argument("--from", dest="source", default=None, help="a --measure file")
    ap.add_argument("--json", default=None, help="write the simulation's results here")
    ap.add_argument("--svg", default=None, help="write the efficiency plot here")
    ap.add_argument("--markdown", default=None, help="write the tables as Markdown here")
    ap.add_argument("--replot", action="store_true", help="--from is a --json result")
    ap.add_argument(
        "--calibration-from",
        default=None,
        help="with --replot: take the calibration from this --json result",
    )
    ap.add_argument(
        "--scaling-from",
        nargs="*",
        default=[],
        help="with --replot: take these results' workloads' scaling too",
    )
    ap.add_argument("--ns", nargs="+", type=int, default=list(NS))
    ap.add_argument("--workloads", nargs="*", default=list(workloads()))
    ap.add_argument("--skip-calibration", action="store_true", help="scaling only")
    ap.add_argument(
        "--design",
        default="direct",
        choices=["direct", "stages"],
        help="direct: each worker's share of a step one task, values exchanged directly"
        " (the engine's default); stages: a task per worker and stage",
    )
    ap.add_argument(
        "--scale-out",
        default=None,
        help="with --design direct: a bench/scale_out.py result to calibrate against",
    )
    ap.add_argument(
        "--send-s",
        type=float,
        default=None,
        help="a direct message's software on the sender's event loop (seconds; if not in"
        " the --from file: --measure ... --parts send measures it)",
    )
    ap.add_argument(
        "--compare-with",
        default=None,
        help="a --design stages result whose 100 Gb/s figures to keep beside these",
    )
    ap.add_argument(
        "--message-s",
        type=float,
        default=None,
        help="the rest of a direct message's software on its way (seconds), likewise",
    )
    args = ap.parse_args(argv)
    if args.measure:
        measure(args.measure, args.parts)
        return 0
    if not args.source:
        ap.error("give --measure FILE or --from FILE")
    with open(args.source) as f:
        measured = json.load(f)
    if args.replot:
        if args.calibration_from:
            with open(args.calibration_from) as f:
                measured["calibration"] = json.load(f)["calibration"]
            measured["command"] = measured.get("command", "")
            measured["command"] += f"; calibration: {args.calibration_from}"
        for path in args.scaling_from:
            with open(path) as f:
                other = json.load(f)
            measured["scaling"].update(other["scaling"])
            shown = ", ".join(other["scaling"])
            measured["command"] += f"; {shown}: {other.get('command', path)}"
        if args.json:
            with open(args.json, "w") as f:
                json.dump(measured, f, indent=1)
        print(_table(measured))
        if args.svg:
            plot(measured, args.svg)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(markdown(measured) + "\n")
        return 0
    if args.send_s is not None:
        measured["overheads"]["send_s"] = args.send_s
    if args.message_s is not None:
        measured["overheads"]["message_s"] = args.message_s
    scale_out = None
    if args.scale_out:
        with open(args.scale_out) as f:
            scale_out = json.load(f)
    load0 = os.getloadavg()
    out = simulate_all(
        measured,
        args.ns,
        args.workloads,
        not args.skip_calibration,
        dump=args.json,
        command="python bench/scale_sim.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        design=args.design,
        scale_out=scale_out,
    )
    out["measured"] = {k: v for k, v in measured.items() if k != "task_records"}
    out["measured"]["real_step_s"] = {
        k: v["step_s"] for k, v in measured.get("real_step_s", {}).items()
    }
    out["machine"] = {"loadavg_simulation": [load0, os.getloadavg()], "cpus": os.cpu_count()}
    if args.compare_with:
        with open(args.compare_with) as f:
            out["stage_design"] = stage_figures(json.load(f), args.compare_with)
    print(_table(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.svg:
        plot(out, args.svg)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
