"""One Dask task per training step on a one-process worker: the step's tile tasks run
in dependency order on the worker's threads, with no scheduler round trip between them.

On one worker process every tile of a step already lives in that process, yet each
dependency between two tasks still costs a round trip through the scheduler (about 4 ms
on the 2-core development machine) and each task milliseconds of event-loop CPU on the
cores the kernels need. :func:`group_steps` makes all plain tasks of a step one task,
:func:`run_local`, which runs them on its own thread and the worker's gang helper
threads: a tile starts as soon as the tiles it reads are computed, the one with the
longest path of readers ahead first (the critical path first; weight gradients and
updates fill the gaps). A value is dropped after its last reader in the step, unless a
task outside the step or the caller reads it: those are the task's outputs, taken by
``operator.getitem`` inside their readers and as tasks of their own for requested keys.

Contract: the same requested keys with the same values; None where no step can be one
task (no step has two tasks within ``budget``, or the steps would form a cycle with the
tasks left outside them), and the optimizer then falls back to gangs
(:mod:`dfdl.taskgraph.gang`). A member's exception is raised on the step task's thread
after the running members finish; it never hangs. Every member's run is recorded in
:data:`dfdl.taskgraph.gang.TRACE` when the benchmarks trace.

Measurements: ``docs/design/step-tasks.md``.

Example:
    >>> from dask.task_spec import Alias, Task, TaskRef
    >>> g = {("a", 0, 0): Task(("a", 0, 0), abs, -1), ("a", 0, 1): Task(("a", 0, 1), abs, -2),
    ...      ("s", 0): Task(("s", 0), max, TaskRef(("a", 0, 0)), TaskRef(("a", 0, 1)))}
    >>> out = group_steps(g, keep=[("s", 0)])
    >>> sorted(map(str, out))
    ["('a', 0, 0)", "('s', 0)"]
    >>> out[("a", 0, 0)]({})
    (2,)
    >>> out[("s", 0)]({("a", 0, 0): out[("a", 0, 0)]({})})
    2
"""

from __future__ import annotations

import contextlib
import graphlib
import heapq
import operator
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

from dask.task_spec import Alias, Task, TaskRef

from dfdl.taskgraph import exchange, gang
from dfdl.taskgraph.fuse import heights, run_fused, structure
from dfdl.taskgraph.tile_exec import Outputs, assemble_task, run_tile

#: the name of the trainer's step tasks (with its token: ``key_split`` shows this)
STEP_NAME = "train-step"
#: on a thread running a step task's members: ``values``, the task's values by key (its
#: inputs and its members' results), where step programs' per-run attributes are read
#: (:class:`dfdl.taskgraph.program.ResolveStep`); set only while the task runs there
STEP_VALUES = threading.local()


@contextlib.contextmanager
def step_values(cache: dict):
    """``cache`` as this thread's :data:`STEP_VALUES` while the block runs, the previous
    ones again after it: a thread that kept them would keep the step's inputs (the last
    weights and optimizer state) alive after Dask released them.

    Example:
        >>> with step_values({"seed": 7}):
        ...     STEP_VALUES.values["seed"]
        7
        >>> getattr(STEP_VALUES, "values", None) is None
        True
    """
    before = getattr(STEP_VALUES, "values", None)
    STEP_VALUES.values = cache
    try:
        yield
    finally:
        STEP_VALUES.values = before


def group_steps(
    dsk: Mapping[Hashable, object],
    keep: Iterable[Hashable],
    name: Callable[[int], Hashable] | None = None,
    weight: Callable[[Hashable], int] | None = None,
    budget: int | None = None,
    place: Callable[[Hashable], int | None] | None = None,
    parts: int = 1,
    strip: Callable[[Hashable], Hashable] = str,
    serial: bool = False,
    peers: Sequence[str] | None = None,
) -> dict | None:
    """The graph with each step's plain tasks run as one task (module docstring).

    Args:
        dsk: a Dask graph of ``dask.task_spec`` nodes with keys ``(name, step, ...)``.
        keep: requested keys; each stays a key of the graph, taken from its step's task.
        name: the key of step ``s``'s task (the trainer's is ``("train-step-<token>",
            s)``, shown as ``train-step`` in the dashboard); steps given the same key run
            as one task (a GPU worker's steps, :class:`dfdl.taskgraph.optimize.GraphOptions`
            ``steps_per_task``). None: the step's first member in ``str`` order that is
            not requested.
        weight: bytes a task uses; with ``budget``, the most bytes a step's tasks may
            use together (a step over it is left as it is).
        budget: see ``weight``; None: no limit.
        place: on ``parts`` worker processes, the worker (``0..parts-1``) of a member,
            or None where it should go with what it reads
            (:func:`dfdl.taskgraph.partition.tile_parts`). Each step then runs as one
            task per worker and *stage*: a member's stage is the number of changes of
            worker on its longest path of readers from the step's start, so the tasks
            form no cycle; the task's key is ``(*name(s), worker, stage)``. Members
            with no worker of their own take the worker of a member they read that
            has none either, or else (the roots of reductions: a summed gradient,
            merged moments, the loss) the workers in turn, in ``strip`` order of the
            step's roots, the same in every step.
        parts: see ``place``.
        strip: with ``place``, a member's key without what changes from step to step
            (:func:`dfdl.taskgraph.partition.stripped`).
        peers: with ``place``, the address of each worker (by its number): then each
            worker's share of a step is ONE task, ``(*name(s), worker, 0)``, whose
            members run one after another in one order common to all workers, sending
            what another worker's members read straight to that worker
            (:mod:`dfdl.taskgraph.exchange`, :func:`run_exchange`); stages otherwise.
            Steps that ``name`` gives the same key run as one share per worker, and
            what a worker reads from another's earlier step of the group (an updated
            weight) passes directly too, so no step waits for the whole previous one.
        serial: run each task's members one after another on its thread
            (:func:`run_serial`: workers of one thread, where a helper thread would
            take turns with another process's kernels) instead of :func:`run_local`.

    Returns:
        A new graph with the same requested keys and values, or None where no step can
        run as one task (no step has two tasks within ``budget``, or the steps would
        form a cycle with the tasks outside them). A step task's value is the tuple of
        the values of its members that are requested or read outside it.

    Example:
        >>> group_steps({}, keep=[]) is None
        True
    """
    keep = set(keep)
    deps, readers, order, level = structure(dsk)
    steps: dict = {}
    for k, node in dsk.items():
        if type(node) is Task and isinstance(k, tuple) and len(k) > 1 and type(k[1]) is int:
            steps.setdefault(k[1], []).append(k)
    steps = {
        s: ms
        for s, ms in steps.items()
        if len(ms) > 1
        and any(k not in keep for k in ms)
        and (weight is None or budget is None or sum(map(weight, ms)) <= budget)
    }
    step_of = {m: s for s, ms in steps.items() for m in ms}
    direct = place is not None and peers is not None
    if place is not None:
        where = _workers(step_of, deps, order, place, parts, strip)
        if direct:
            slot = {m: (*name(step_of[m]), where[m], 0) for m in step_of}
        else:
            stage = _stages(step_of, deps, readers, order, where)
            slot = {m: (*name(step_of[m]), where[m], stage[m]) for m in step_of}
    else:
        slot = {
            m: name(s) if name is not None else min((k for k in ms if k not in keep), key=str)
            for s, ms in steps.items()
            for m in ms
        }

    def peer(m, r):  # r reads m from another worker's task of the same steps
        return (
            direct
            and m in slot
            and r in slot
            and slot[r] != slot[m]
            and slot[r][:-2] == slot[m][:-2]
        )

    # what passes between workers directly is no dependency of the step's tasks
    links = {
        k: {d for d in ds if not (k in slot and d in slot and peer(d, k))} for k, ds in deps.items()
    }
    if not slot or not _acyclic(links, slot):
        return None
    out: dict = {}
    subs: dict = {}  # reader outside a step -> {member: its value from the step's task}
    groups: dict = {}  # step task's key -> (members by priority, exported members)
    tasks_of: dict = {}  # a task's key -> the members of every step it runs
    for ms in steps.values():
        for m in ms:
            tasks_of.setdefault(slot[m], []).append(m)
    sends: dict = {}  # step task's key -> (member, the workers it is sent to)
    received: dict = {}  # step task's key -> the members of other workers it reads
    for g, ms in tasks_of.items():
        height = heights(readers, level, ms)
        members = sorted(ms, key=lambda m: (-height[m], str(m)))
        if direct:
            sends[g] = [
                (m, sorted({slot[r][2] for r in readers[m] if peer(m, r)}))
                for m in members
                if any(peer(m, r) for r in readers[m])
            ]
            received[g] = {d for m in ms for d in deps[m] if peer(d, m)}
        exports = [
            m
            for m in members
            if m in keep or any(slot.get(r) != g and not peer(m, r) for r in readers[m])
        ]
        for i, m in enumerate(exports):
            value = Task(m, operator.getitem, TaskRef(g), i)
            if m in keep or place is not None:
                # several workers: a value of its own, taken where the task ran, so a
                # reader elsewhere fetches that value, not all the task's outputs
                out[m] = value
                if place is not None:
                    continue
            for r in readers[m]:
                if slot.get(r) != g and not peer(m, r):
                    subs.setdefault(r, {})[m] = value
        groups[g] = (members, exports)
    nodes = {k: _substituted(k, v, subs[k]) if k in subs else v for k, v in dsk.items()}
    out.update((k, node) for k, node in nodes.items() if k not in slot)
    for g, (members, exports) in groups.items():
        taken = received.get(g, set())
        if direct:  # after the members: what arrives is taken whenever it does
            members = [*members, *sorted(taken, key=str)]
        index = {m: i for i, m in enumerate(members)}
        tasks = tuple(
            Task(m, exchange.receive, exchange.name(m)) if m in taken else nodes[m] for m in members
        )
        # after the substitution: values of other steps come from their steps' tasks
        outside = tuple(sorted({d for t in tasks for d in t.dependencies} - set(index), key=str))
        member_deps = tuple(
            () if m in taken else tuple(index[d] for d in deps[m] if d in index) for m in members
        )
        head = (tasks, member_deps, tuple(index[m] for m in exports))
        if direct:
            owed = tuple(
                (index[m], tuple(ps), tuple(_parts_read(m, p, readers, slot, nodes) for p in ps))
                for m, ps in sends[g]
            )
            head = (*head, owed, tuple(peers), g[-2])
        out[g] = Task(
            g,
            run_exchange if direct else run_serial if serial else run_local,
            *head,
            outside,
            *(TaskRef(d) for d in outside),
            _data_producer=any(t.data_producer for t in tasks),
        )
    if direct:
        _anchor_silent(out, groups, keep, slot)
    return out


def _parts_read(m, part: int, readers: Mapping, slot: Mapping, nodes: Mapping):
    """The indices of ``m``'s value (a fused task's packed outputs) that the members on
    worker ``part`` take (``getitem(m, i)``), sorted; None where one reads it whole."""
    taken: set = set()
    for r in readers[m]:
        if slot.get(r) is not None and slot[r][2] == part and not _taken(nodes[r], m, taken):
            return None
    return tuple(sorted(taken))


def _taken(node: object, m, taken: set) -> bool:
    """Add to ``taken`` the indices of ``m`` that ``node`` takes; False where it reads
    ``m`` whole."""
    if isinstance(node, TaskRef):
        return node.key != m
    if isinstance(node, Task):
        args = node.args
        if node.func is operator.getitem and args and isinstance(args[0], TaskRef):
            if args[0].key == m and isinstance(args[1], int):
                taken.add(args[1])
                return True
        if node.func in (run_tile, assemble_task) and len(args) > 1 and not node.kwargs:
            return _picked(node.func, args, m, taken)
        if node.func is run_fused and len(args) > 2 and not node.kwargs:
            program, values = args[0], args[3:]
            for a in values:
                if isinstance(a, TaskRef) and a.key == m:
                    # its members read ``m`` by key from the values given: what they take
                    if not all(_taken(t, m, taken) for t, _ in program):
                        return False
                elif not _taken(a, m, taken):
                    return False
            return True
        return all(_taken(a, m, taken) for a in (*args, *node.kwargs.values()))
    if isinstance(node, (tuple, list)):
        return all(_taken(a, m, taken) for a in node)
    if isinstance(node, dict):
        return all(_taken(a, m, taken) for a in node.values())
    return True


def _picked(func, args: tuple, m, taken: set) -> bool:
    """:func:`_taken` for a tile task, whose specs say which output of each input it
    takes (``run_tile``'s ``pick``, ``slice`` and ``assemble``, ``assemble_task``'s
    pieces)."""
    n_meta = 2 if func is assemble_task else 1
    meta, ins = args[:n_meta], args[n_meta:]
    at = {i for i, a in enumerate(ins) if isinstance(a, TaskRef) and a.key == m}
    if not all(isinstance(a, TaskRef) or _taken(a, m, taken) for a in ins):
        return False
    if not at:
        return True
    if func is assemble_task:
        pieces = [(k, pos) for k, pos, *_ in meta[1]]
    else:
        pieces = []
        for spec in meta[0][2]:
            kind = spec[0]
            if kind in ("value", "pick", "slice"):
                pieces.append((spec[1], None if kind == "value" else spec[2]))
            elif kind == "assemble":
                pieces.extend((k, pos) for k, pos, *_ in spec[3])
    for k, pos in pieces:
        if k in at:
            if not isinstance(pos, int):
                return False
            taken.add(pos)
    return True


def _only(value, parts):
    """``value`` with the entries not in ``parts`` left out (None: indices keep their
    places); all of it for ``parts`` None or a value that is no tuple."""
    if parts is None or not isinstance(value, tuple):
        return value
    return type(value)(v if i in parts else None for i, v in enumerate(value))


def _anchor_silent(out: dict, groups: Mapping, keep: set, slot: Mapping):
    """Make a requested value of each step (or group of steps) wait for its tasks whose
    values no task reads (a worker's share that only sends): Dask would drop a task
    nothing needs, and their errors reach the caller this way."""
    silent: dict = {}
    for g, (_, exports) in groups.items():
        if not exports:
            silent.setdefault(g[:-2], []).append(g)
    for s, gs in silent.items():
        anchors = sorted((m for m in keep if m in slot and slot[m][:-2] == s), key=str)
        if not anchors:
            continue
        m = anchors[0]
        g = slot[m]
        i = groups[g][1].index(m)
        out[m] = Task(m, _item_after, TaskRef(g), i, *(TaskRef(x) for x in gs))


def _item_after(values, i: int, *_done):
    """``values[i]``, once the tasks given after it are done (their values unused)."""
    return values[i]


def _workers(step_of: Mapping, deps: Mapping, order: list, place, parts, strip) -> dict:
    """Each member's worker (see :func:`group_steps`'s ``place``)."""
    own = {m: place(m) for m in step_of}

    def unplaced(m):  # the members of m's step it reads that have no worker of their own
        return [d for d in deps[m] if step_of.get(d) == step_of[m] and own[d] is None]

    # members with no worker of their own that read none such: the roots, in turn
    roots: dict = {}
    for m, p in own.items():
        if p is None and not unplaced(m):
            roots.setdefault(step_of[m], []).append(m)
    where: dict = {}
    for ms in roots.values():
        for i, m in enumerate(sorted(ms, key=strip)):
            where[m] = i % parts
    for k in order:
        if k in step_of and k not in where:
            p = own[k]
            # goes with a member it reads that has no worker either
            where[k] = p if p is not None else where[min(unplaced(k), key=strip)]
    return where


def _stages(step_of: Mapping, deps: Mapping, readers: Mapping, order: list, where) -> dict:
    """Each member's stage: a new one after a change of worker, and after a member
    another worker reads (it is there for that worker only once its task ends)."""

    def exported(m):
        return any(where.get(r, where[m]) != where[m] for r in readers[m] if r in step_of)

    stage: dict = {}
    for k in order:
        s = k[1] if isinstance(k, tuple) and len(k) > 1 else None
        inside = [d for d in deps[k] if d in stage and stage[d][0] == s]
        if k not in step_of:  # a node of no step task: a change of worker around it
            stage[k] = (s, 1 + max((stage[d][1] for d in inside), default=-1))
            continue
        p = where[k]
        stage[k] = (
            s,
            max(
                (stage[d][1] + (d not in where or where[d] != p or exported(d)) for d in inside),
                default=0,
            ),
        )
    return {m: stage[m][1] for m in step_of}


def _substituted(key, node, subs: dict):
    """``node``, which reads members of a step, reading their values from the step's
    task instead: an alias of a member becomes the task that takes that value."""
    if isinstance(node, Alias):
        return Task(key, operator.getitem, *subs[node.target].args)
    return node.substitute(subs)


def _acyclic(deps: Mapping, slot: Mapping) -> bool:
    """Whether the graph stays acyclic with each step's members taken as one node."""
    quotient: dict = {}
    for k, ds in deps.items():
        node = slot.get(k, k)
        quotient.setdefault(node, set()).update(slot.get(d, d) for d in ds)
        quotient[node].discard(node)
    try:
        graphlib.TopologicalSorter(quotient).prepare()
    except graphlib.CycleError:
        return False
    return True


class _Schedule:
    """The dependency bookkeeping of one step task's run: ``ready`` holds the tasks whose
    inputs are all there, as a heap by index (the priority order); :meth:`done` stores
    a task's value, drops inputs no one reads any more (unless exported) and releases
    the readers it completes."""

    __slots__ = ("cache", "deps", "kept", "left", "readers", "ready", "tasks", "waiting")

    def __init__(self, tasks: tuple, deps: tuple, exports: tuple, cache: dict):
        self.tasks, self.deps, self.cache = tasks, deps, cache
        self.kept = set(exports)
        self.waiting = [len(d) for d in deps]
        self.readers: list = [[] for _ in deps]
        for i, ds in enumerate(deps):
            for d in ds:
                self.readers[d].append(i)
        self.left = [len(r) for r in self.readers]
        self.ready = [i for i, w in enumerate(self.waiting) if not w]
        heapq.heapify(self.ready)

    def done(self, i: int, value) -> None:
        self.cache[self.tasks[i].key] = value
        for d in self.deps[i]:
            self.left[d] -= 1
            if not self.left[d] and d not in self.kept:
                del self.cache[self.tasks[d].key]
        for r in self.readers[i]:
            self.waiting[r] -= 1
            if not self.waiting[r]:
                heapq.heappush(self.ready, r)


def run_serial(tasks: tuple, deps: tuple, exports: tuple, outside: tuple, *values) -> Outputs:
    """:func:`run_local` on this thread alone: the tasks one after another in priority
    order, each value dropped after its last reader. For a GPU worker, whose kernels
    queue on one stream: threads there would only take turns at the GIL.

    Example:
        >>> from dask.task_spec import Task, TaskRef
        >>> run_serial((Task("b", abs, TaskRef("a")), Task("a", min, TaskRef("x"), 0)),
        ...            ((1,), ()), (0,), ("x",), -5)
        (5,)
    """
    cache = dict(zip(outside, values, strict=True))
    sched = _Schedule(tasks, deps, exports, cache)
    trace = gang.TRACE
    with step_values(cache):
        while sched.ready:
            i = heapq.heappop(sched.ready)
            task = tasks[i]
            start = time.time() if trace is not None else 0.0
            sched.done(i, task(cache))
            if trace is not None:
                trace.append((task.key, threading.current_thread().name, start, time.time()))
    return Outputs(cache[tasks[i].key] for i in exports)


def run_exchange(
    tasks: tuple,
    deps: tuple,
    exports: tuple,
    owed: tuple,
    peers: tuple,
    me: int,
    outside: tuple,
    *values,
) -> Outputs:
    """One worker's share of a step, on this thread, exchanging values with the other
    workers' shares: ``owed`` holds ``(i, workers[, parts])``, the value of ``tasks[i]``
    to send to those workers (their addresses in ``peers``) once computed (of a packed
    value, only the ``parts`` each worker reads, the others left None); the values this share
    reads from them are tasks of :func:`dfdl.taskgraph.exchange.receive` (standing for
    the value to take); ``me`` is this share's worker (``peers[me]``). When a task
    fails, what was still owed is sent as a failure, so no reader waits for it. Values
    are addressed to workers, so a share runs on its own worker only: one that Dask's
    work stealing moved to another asks the scheduler to send it back (``Reschedule``),
    and one whose worker was lost raises
    :class:`~dfdl.taskgraph.exchange.PeerLostError` at once, failing what it owed the
    same way, and the trainer replays the steps since its last anchor.

    Example:
        >>> from dask.task_spec import Task, TaskRef
        >>> run_exchange((Task("a", min, TaskRef("x"), 0), Task("b", abs, TaskRef("a"))),
        ...              ((), (0,)), (1,), ((0, (1,)),), ("w0", "w1"), 0, ("x",), -5)
        (5,)
        >>> exchange.receive("a", timeout=1)
        -5

    The tasks come in priority order (the longest path of readers ahead first); a
    worker runs the first whose inputs are all there, taking what other workers sent
    as it arrives, and waits only when nothing can run: since the step's tasks form no
    cycle, some worker can always run one, and no worker waits for ever.
    """
    exchange.begin()
    here = exchange.address()
    if here is not None and here != peers[me] and exchange.answers(peers[me]):
        # Dask's work stealing moved it off its worker, which is still there: send it home
        # (values are addressed to workers, so it can run nowhere else)
        exchange.reschedule(peers[me])
    cache = dict(zip(outside, values, strict=True))
    sched = _Schedule(tasks, deps, exports, cache)
    # the values other workers send: taken as they arrive, waited for only when nothing
    # here can run (so no two workers' tasks ever wait for each other)
    coming = {i: exchange.name(t.key) for i, t in enumerate(tasks) if t.func is exchange.receive}
    sched.ready = [i for i in sched.ready if i not in coming]
    heapq.heapify(sched.ready)
    # (i, workers[, parts]): what to send to each worker, only the parts it reads
    sends = {i: list(zip(ps, rest[0] if rest else [None] * len(ps))) for i, ps, *rest in owed}
    outbox = exchange.Outbox()
    trace = gang.TRACE
    with step_values(cache):
        try:
            if here is not None and here != peers[me]:
                raise exchange.PeerLostError(
                    f"this share of a step was for the worker at {peers[me]}, which was lost;"
                    f" it reached {here}"
                )
            while True:
                for i, value in exchange.take(coming) if coming else ():
                    sched.done(i, value)
                if not sched.ready:
                    if not coming:
                        break
                    exchange.wait_any(coming)
                    continue
                i = next_to_run(sched.ready, sends)
                task = tasks[i]
                start = time.time() if trace is not None else 0.0
                value = task(cache)
                sched.done(i, value)
                for p, parts in sends.pop(i, ()):
                    outbox.send(peers[p], task.key, _only(value, parts))
                if trace is not None:
                    trace.append((task.key, threading.current_thread().name, start, time.time()))
        except BaseException as e:
            lost = isinstance(e, exchange.PeerLostError)  # its readers replay, as it does
            for j, ps in sends.items():
                for p, _ in ps:
                    outbox.fail(
                        peers[p],
                        tasks[j].key,
                        f"{tasks[j].key!r} failed on another worker: {type(e).__name__}: {e}",
                        lost=lost,
                    )
            with contextlib.suppress(Exception):  # the task's own error is the one to see
                outbox.close()
            raise
        outbox.close()
    return Outputs(cache[tasks[i].key] for i in exports)


#: how many of a share's ready members, in priority order, are looked at for one whose
#: value another worker waits for (0: the first in priority order, always)
SEND_FIRST = 8


def next_to_run(ready: list, sends: dict) -> int:
    """Pops the member a share runs next from ``ready`` (a heap of indices, the priority
    order): of the first :data:`SEND_FIRST`, the first whose value is sent to another
    worker (that worker may be waiting for it), else the first. Only the order of the
    members changes, never a value (``docs/design/worker-shares.md``).

    Example:
        >>> ready = [0, 1, 2]
        >>> next_to_run(ready, {2: [(1, None)]}), sorted(ready)
        (2, [0, 1])
    """
    for i in heapq.nsmallest(SEND_FIRST, ready):
        if i in sends:
            ready.remove(i)
            heapq.heapify(ready)
            return i
    return heapq.heappop(ready)


def run_local(tasks: tuple, deps: tuple, exports: tuple, outside: tuple, *values) -> Outputs:
    """Runs a step's tasks in dependency order on this thread and the worker's gang
    helpers; returns the values of ``tasks[i]`` for ``i`` in ``exports``.

    ``tasks`` come in priority order (the longest path ahead first) and ``deps[i]``
    holds the indices of the tasks that ``tasks[i]`` reads. A task's exception stops
    the claiming of new tasks and is raised here, on the Dask task's own thread, once
    the tasks already running have finished.

    Example:
        >>> from dask.task_spec import Task, TaskRef
        >>> run_local((Task("b", abs, TaskRef("a")), Task("a", min, TaskRef("x"), 0)),
        ...           ((1,), ()), (0,), ("x",), -5)
        (5,)
    """
    n = len(tasks)
    cache = dict(zip(outside, values, strict=True))
    sched = _Schedule(tasks, deps, exports, cache)
    ready = sched.ready
    state = {"todo": n, "running": 0, "error": None}
    cond = threading.Condition()

    def work() -> None:
        with step_values(cache):
            claim()

    def claim() -> None:
        while True:
            with cond:
                while not ready and state["todo"] and state["error"] is None:
                    cond.wait()
                if not ready or state["error"] is not None:
                    return
                i = heapq.heappop(ready)
                state["running"] += 1
            task = tasks[i]
            start = time.time()
            try:
                value = task(cache)
            except BaseException as e:  # raised again on the task's own thread
                with cond:
                    if state["error"] is None:
                        state["error"] = e
                    state["running"] -= 1
                    cond.notify_all()
                return
            if gang.TRACE is not None:
                gang.TRACE.append((task.key, threading.current_thread().name, start, time.time()))
            with cond:
                sched.done(i, value)
                state["todo"] -= 1
                state["running"] -= 1
                cond.notify_all()

    pool = gang._helpers() if n > 1 else None
    if pool is not None:
        for _ in range(gang.HELPERS):
            pool.submit(work)
    work()
    with cond:
        while state["running"]:
            cond.wait()
    if state["error"] is not None:
        raise state["error"]
    return Outputs(cache[tasks[i].key] for i in exports)
