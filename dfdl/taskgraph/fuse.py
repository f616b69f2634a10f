"""Task fusion: small tile tasks run inside the tasks that read them.

Every Dask task costs scheduler and worker CPU and every dependency a round trip, so
:func:`fuse_into_consumers` turns a lowered graph (:func:`dfdl.taskgraph.lower.lower`)
into fewer, larger tasks:

* a task with one reader runs inside it where the reader's other inputs come from lower
  topological levels (partials of one sum stay apart and run side by side), or where
  the task is light (its tile reads and writes at most :data:`LIGHT_BYTES`);
* contractions (GEMM, convolution) stay tasks, except small ones with a light reader;
* chains collapse: ``a -> b -> u`` becomes one task keyed ``u``, so the dashboard shows
  the absorbed work under the reader's name;
* the finer rules of :class:`FuseRules` (all on by default) carry an activation read
  again later inside its first reader, run a light gradient inside (or once with) the
  two contractions that read it, run a split BatchNorm's per-tile moments inside the
  convolution that produced the tile, and repeat a merge of tiny partials (at most
  :data:`TINY_BYTES`) inside its next readers, for one worker process only;
* on several worker processes (``place``), a tile task runs only inside a task of its
  own worker, so that fusion moves no tile's work, nor what it reads, to another worker.

Guarantees: the requested keys (``keep``) stay keys with the same values, bit for bit;
fusion changes which task runs a function, never its inputs or the order of a sum. A
fused task runs its members in an order fixed when the graph is built (:func:`fused`).
:func:`inline_data` puts data nodes inside their readers the same way.

Example:
    >>> from dask.task_spec import Task, TaskRef
    >>> g = {"a": Task("a", abs, -1), "b": Task("b", abs, TaskRef("a"))}
    >>> out = fuse_into_consumers(g, keep=["b"])
    >>> sorted(out), out["b"]({})
    (['b'], 1)

Measurements: ``docs/design/task-fusion.md``, ``carriers.md``,
``partials-at-producer.md``, ``merges-in-readers.md``, ``fused-order.md``,
``inline-data.md``.
"""

from __future__ import annotations

import graphlib
import operator
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass

from dask.task_spec import DataNode, Task, TaskRef

from dfdl.taskgraph.tile_exec import Outputs, combine

#: a task whose tile reads and writes at most this many bytes is "light" (a few ms of
#: memory traffic, against a task's ~1.3 ms of scheduler and worker CPU on 2 cores)
LIGHT_BYTES = 40 << 20
#: a node whose output tiles take at most this many bytes has "tiny" outputs (a
#: BatchNorm's per-channel moments): a merge of them costs microseconds to run again
TINY_BYTES = 64 << 10
#: the most readers a duplicated task runs in
MAX_COPIES = 2


@dataclass(frozen=True)
class FuseRules:
    """Which of fusion's finer rules apply (all do by default: each measured faster, see
    ``docs/design/task-fusion.md``); one turned off gives the same values with more tasks.

    Attributes:
        carry: a light task with later readers runs inside its first reader
            (``_carriers``).
        duplicate: a light task read by a few tasks at once runs inside each
            (``_duplicated``).
        siblings: a light task read by two contractions right after a merge runs once,
            with both of them, in one task (``_siblings``), instead of inside each.
        partials_at_producer: a light partial of a merge runs inside the task that
            produces its input (``_partials_at_producer``).
        small_partials: a small contraction runs inside its light consumer also where
            that consumer waits for a sibling (partial products of one sum).
        ordered: fused tasks run their members in an order fixed when the graph is built
            (:func:`fused`) rather than through ``dask.task_spec.Task.fuse``.
        merges_in_readers: a merge of tiny partials also runs inside each of its readers
            one level up (:func:`_merges_in_readers`).
    """

    carry: bool = True
    duplicate: bool = True
    siblings: bool = True
    partials_at_producer: bool = True
    small_partials: bool = True
    ordered: bool = True
    merges_in_readers: bool = True


def _levels(deps: Mapping[Hashable, set]) -> tuple[list, dict]:
    """Topological order and level (longest path from a source) of every key."""
    order = list(graphlib.TopologicalSorter(deps).static_order())
    level: dict = {}
    for k in order:
        level[k] = 1 + max((level[d] for d in deps[k]), default=-1)
    return order, level


def structure(dsk: Mapping[Hashable, object]) -> tuple[dict, dict, list, dict]:
    """``(deps, readers, order, level)`` of a graph: each key's dependencies inside it,
    the keys that read it, a topological order and each key's level.

    Example:
        >>> from dask.task_spec import Task, TaskRef
        >>> deps, readers, order, level = structure(
        ...     {"a": Task("a", abs, -1), "b": Task("b", abs, TaskRef("a"))})
        >>> readers["a"], level["b"]
        (['b'], 1)
    """
    deps = {k: {d for d in getattr(v, "dependencies", ()) if d in dsk} for k, v in dsk.items()}
    readers: dict = {k: [] for k in dsk}
    for k, ds in deps.items():
        for d in ds:
            readers[d].append(k)
    order, level = _levels(deps)
    return deps, readers, order, level


def heights(readers: Mapping, level: Mapping, keys: Iterable[Hashable] | None = None) -> dict:
    """Each key's longest path of readers to one that nothing reads, counting only
    readers among ``keys`` (None: all of ``readers``).

    Example:
        >>> heights({"a": ["b"], "b": ["c"], "c": []}, {"a": 0, "b": 1, "c": 2}, ["a", "b"])
        {'b': 0, 'a': 1}
    """
    height: dict = {}
    # a reader sits at a higher level than what it reads: it has its height first
    for k in sorted(readers if keys is None else keys, key=level.__getitem__, reverse=True):
        height[k] = 1 + max((height[r] for r in readers[k] if r in height), default=-1)
    return height


def fuse_into_consumers(
    dsk: Mapping[Hashable, object],
    keep: Iterable[Hashable],
    stays: Callable[[Hashable], bool] | None = None,
    light: Callable[[Hashable], bool] | None = None,
    small: Callable[[Hashable], bool] | None = None,
    tiny: Callable[[Hashable], bool] | None = None,
    rules: FuseRules = FuseRules(),
    place: Callable[[Hashable], int | None] | None = None,
) -> dict:
    """The graph with every single-consumer task absorbed into its consumer (see the
    module docstring); ``keep``: keys that must stay (requested outputs).

    Args:
        dsk: a Dask graph of ``dask.task_spec`` nodes (as :func:`dfdl.taskgraph.lower.lower`
            builds it). Only plain ``Task`` nodes are fused; data and aliases stay.
        keep: keys requested from the graph.
        stays: keys for which it returns True are never absorbed (they may still
            absorb their producers): the trainer passes the tasks of contraction ops.
        light: keys for which it returns True are absorbed whatever the levels of the
            consumer's other inputs (tasks of at most :data:`LIGHT_BYTES`).
        small: keys of tasks that stay for which it returns True (contractions of at
            most :data:`LIGHT_BYTES`) may still run inside a light consumer.
        tiny: keys for which it returns True are tasks whose outputs are a few values
            (per-channel sums): a merge of such partials also runs inside each of its
            readers one level up (:func:`_merges_in_readers`).
        rules: which finer rules apply (:class:`FuseRules`).
        place: on several worker processes, the worker of each task that has one
            (:func:`dfdl.taskgraph.partition.tile_parts`): a task with a worker runs only
            inside a task of the same worker, so that fusion moves no tile's work (nor
            the values it reads) to another worker.

    Returns:
        A new graph with the same requested keys and values and fewer tasks.

    Example:
        >>> from dask.task_spec import Task, TaskRef
        >>> g = {"a": Task("a", abs, -1), "b": Task("b", abs, TaskRef("a"))}
        >>> sorted(fuse_into_consumers(g, keep=["b"]))
        ['b']
    """
    keep = set(keep)
    deps, readers, order, level = structure(dsk)

    at_producer: dict = {}  # light partial -> the task that produces its input
    if light is not None and stays is not None and rules.partials_at_producer:
        at_producer = _partials_at_producer(dsk, keep, deps, readers, level, light, stays)

    absorbed: dict = {}  # task -> the consumer it runs in
    for t in order:
        if t in keep or t in at_producer or type(dsk[t]) is not Task or len(readers[t]) != 1:
            continue
        (u,) = readers[t]
        if type(dsk[u]) is not Task:
            continue
        first = all(level[v] < level[t] for v in deps[u] if v != t)
        if stays is not None and stays(t):
            if (
                (first or rules.small_partials)
                and small is not None
                and small(t)
                and light is not None
                and light(u)
            ):
                absorbed[t] = u
            continue
        if (light is not None and light(t)) or first:
            absorbed[t] = u

    def root(t):  # the task that ``t`` ends up running in
        while t in absorbed:
            t = absorbed[t]
        return t

    def apart(t, u) -> bool:  # running t inside u would move it to another worker
        return place is not None and place(t) is not None and place(t) != place(u)

    while moved := [t for t in absorbed if apart(t, root(t))]:
        for t in moved:
            del absorbed[t]

    for t in [t for t in absorbed if stays is not None and stays(t)]:
        if not light(root(t)):  # it would run inside a heavy task: stays on its own
            del absorbed[t]

    carried = {}
    if light is not None and rules.carry:
        carried = _carriers(dsk, keep, deps, readers, order, level, absorbed, light)
    for p, c in at_producer.items():
        if c not in absorbed and c not in carried:
            carried[p] = c
    if light is not None and stays is not None and rules.siblings:
        pairs = _siblings(dsk, keep, deps, readers, level, absorbed, carried, light, stays)
        for t, (first, other) in pairs.items():
            carried[t] = carried[other] = root(first)

    def carrier(t):  # the task whose value carries ``t``'s
        while t in carried:
            t = carried[t]
        return t

    def task_of(r):  # the key of the task ``r`` runs in
        return carrier(root(r))

    while moved := [t for t in (*absorbed, *carried) if apart(t, task_of(t))]:
        for t in moved:
            absorbed.pop(t, None)
            carried.pop(t, None)

    members: dict = {}  # consumer that stays -> the tasks it absorbs, producers first
    for t in order:
        if t in absorbed:
            members.setdefault(root(t), []).append(t)

    chains: dict = {}  # carrier -> the tasks it carries, producers first
    for t in order:
        if t in carried:
            chains.setdefault(carrier(t), []).append(t)
    packed: dict = {}  # carrier -> the carried tasks its value returns (read outside it)
    slot: dict = {}  # task -> (its carrier, its index in the carrier's value)
    for c, chain in chains.items():
        packed[c] = [m for m in chain if any(task_of(r) != c for r in readers[m])]
        slot[c] = (c, 0)
        slot.update((m, (c, i)) for i, m in enumerate(packed[c], 1))

    twice = set()
    if light is not None and stays is not None and rules.duplicate:
        twice = _duplicated(dsk, keep, deps, readers, level, absorbed, carried, light, stays)
        twice = {t for t in twice if not any(apart(t, task_of(r)) for r in readers[t])}
    out = {}
    for k, node in dsk.items():
        if k in absorbed or k in carried:
            continue
        inner = [dsk[t] for t in members.get(k, ())]
        if k in chains:  # runs the tasks it carries first, returns all their values
            chain = chains[k]
            inner = [dsk[a] for m in chain for a in (*members.get(m, ()), m)] + inner + [node]
            node = Task(_pack_key(k), _pack, TaskRef(k), *(TaskRef(m) for m in packed[k]))
        out[k] = (fused if rules.ordered else Task.fuse)(*inner, node, key=k) if inner else node
    inline: dict = {}  # merge -> the readers that run it again inside their own tasks
    if tiny is not None and rules.merges_in_readers:
        done = twice | set(chains) | set(members)
        inline = _merges_in_readers(out, keep, readers, level, done, tiny)
    if slot or twice or inline:
        subs: dict = {}  # reader -> its substitutions
        for v, (c, i) in slot.items():
            for r in readers[v]:
                if task_of(r) != c:
                    subs.setdefault(r, {})[v] = Task(v, operator.getitem, TaskRef(c), i)
        by_task: dict = {}
        for r, sub in subs.items():
            by_task.setdefault(task_of(r), {}).update(sub)
        for t in (k for k in order if k in twice or k in inline):  # producers first
            node = out.pop(t).substitute(by_task.pop(t, {}))
            inside = inline.get(t, readers[t])
            if len(inside) < len(readers[t]):  # later readers still read its task
                out[t] = node
            for r in inside:
                by_task.setdefault(task_of(r), {})[t] = node
        for r, sub in by_task.items():
            out[r] = out[r].substitute(sub)
    return out


def fused(*tasks: Task, key: Hashable) -> Task:
    """One task ``key`` that runs ``tasks`` (which reduce to one output) in a topological
    order fixed here, dropping each intermediate value after its last reader.

    ``dask.task_spec.Task.fuse`` builds the same subgraph, but its worker-side
    ``execute_graph`` runs ``dask.order`` on it at every execution, holding the GIL
    (measurements: ``docs/design/fused-order.md``).

    Example:
        >>> from operator import add
        >>> t = fused(Task("a", add, TaskRef("x"), 1), Task("b", add, TaskRef("a"), 2),
        ...           key="b")
        >>> t({"x": 0})
        3
    """
    inside = {t.key: t for t in tasks}
    deps = {k: set(t.dependencies) & inside.keys() for k, t in inside.items()}
    order = list(graphlib.TopologicalSorter(deps).static_order())
    leaves = inside.keys() - set().union(*deps.values())
    if len(leaves) != 1:
        raise ValueError(f"fused tasks must reduce to one output, not {sorted(map(str, leaves))}")
    (out,) = leaves
    last = {d: i for i, k in enumerate(order) for d in deps[k]}
    program = tuple(
        (inside[k], tuple(d for d in deps[k] if last[d] == i)) for i, k in enumerate(order)
    )
    outside = tuple(sorted({d for t in tasks for d in t.dependencies} - inside.keys(), key=str))
    return Task(
        key,
        run_fused,
        program,
        out,
        outside,
        *(TaskRef(d) for d in outside),
        _data_producer=any(t.data_producer for t in tasks),
    )


def run_fused(program: tuple, out: Hashable, outside: tuple, *values):
    """Runs the members of a :func:`fused` task: ``program`` is ``(task, keys to drop
    after it)`` in order; ``values`` are those of the ``outside`` keys."""
    cache = dict(zip(outside, values, strict=True))
    for task, drop in program:
        cache[task.key] = task(cache)
        for d in drop:
            del cache[d]
    return cache[out]


def _duplicated(dsk, keep, deps, readers, level, absorbed, carried, light, stays) -> set:
    """Light tasks that each of their few readers runs again inside its own task
    (:func:`_read_at_once`). A gradient that two tasks read at once (a BatchNorm's input
    gradient, read by the convolution's weight and input gradients) then costs a
    second pass over a light tile instead of a round trip before either reader can
    start."""
    return {
        t
        for t in dsk
        if t not in keep
        and t not in absorbed
        and t not in carried
        and t not in carried.values()
        and 2 <= len(readers[t]) <= MAX_COPIES
        and _read_at_once(t, dsk, deps, readers, level, light, stays)
    }


def _merges_in_readers(out, keep, readers, level, done, tiny) -> dict:
    """Merges of tiny partials (``lower``'s ``combine`` of a split BatchNorm's per-tile
    moments or gradient sums) that run again inside each reader one level up:
    ``{merge: those readers}``. Every tile of the next layer then waits for one round
    trip after the last partial, not two (partial -> merge -> reader), and adds a few
    values per channel itself. The merge stays a task of its own where later readers
    (the running statistics, the backward pass) read it too. Not taken for a merge that
    absorbed other tasks (it is no longer tiny) or carries some (``done``)."""
    picked: dict = {}
    for t, node in out.items():
        if t in keep or t in done or type(node) is not Task or node.func is not combine:
            continue
        if not tiny(t):
            continue
        up = [r for r in readers[t] if level[r] == level[t] + 1]
        if up:
            picked[t] = up
    return picked


def _read_at_once(t, dsk, deps, readers, level, light, stays) -> bool:
    """Whether ``t`` is a light task that reads a merge of one level's values
    (``_joins``) and every reader of which is a contraction that comes right after it
    (one level up) and waits for nothing else of its level."""
    return (
        type(dsk[t]) is Task
        and light(t)
        and any(_joins(d, deps, level) for d in deps[t])
        and all(
            type(dsk[r]) is Task
            and stays(r)
            and level[r] == level[t] + 1
            and all(level[v] < level[t] for v in deps[r] if v != t)
            for r in readers[t]
        )
    )


def _siblings(dsk, keep, deps, readers, level, absorbed, carried, light, stays) -> dict:
    """Light tasks ``t`` read by exactly two contractions right after a merge
    (:func:`_read_at_once`): ``{t: (first, other)}``. ``t`` and ``other`` run inside
    ``first``'s task, before it: a split BatchNorm's input gradient, computed once and
    read by the convolution's weight gradient and input gradient in one task, instead of
    computed again inside each of two tasks. ``first`` is the reader whose own readers
    come first (the input gradient, on the critical path)."""
    out: dict = {}
    taken = set(carried)  # carried already (a task may carry several)
    for t in dsk:
        rs = readers[t]
        if (
            t in keep
            or t in absorbed
            or t in taken
            or t in carried.values()
            or len(rs) != 2
            or any(r in keep or r in taken for r in rs)
            or not _read_at_once(t, dsk, deps, readers, level, light, stays)
        ):
            continue
        first, other = sorted(rs, key=lambda r: (min(level[q] for q in readers[r] or [r]), str(r)))
        if other in absorbed:
            continue
        out[t] = (first, other)
        taken |= {t, first, other}
    return out


def _joins(k, deps, level) -> bool:
    """Whether ``k`` merges values of one level (partial sums of several tiles): what
    reads it waits for all of them, with every thread idle at the round trip after."""
    ls = [level[d] for d in deps[k]]
    return len(ls) >= 2 and len(set(ls)) < len(ls)


def _partials_at_producer(dsk, keep, deps, readers, level, light, stays) -> dict:
    """Light partials ``p`` that run inside the task ``c`` producing their input:
    ``{p: c}``. ``p``'s one reader merges it with the partials of the other tiles
    (``_joins``): a BatchNorm's per-tile moments or gradient sums. Absorbed into that
    merge, the partials of all tiles would run one after another on one thread while
    the others wait; inside their producers they run side by side, on a tile that is
    still in cache, and the merge is left with a few values per channel. Taken where
    ``c`` is the one input of ``p`` from the level below (the others are done before),
    and every other reader of ``c`` waits for the merge anyway or comes two levels later,
    so none of them starts later for it."""
    out: dict = {}
    for p, node in dsk.items():
        if p in keep or type(node) is not Task or len(readers[p]) != 1 or not light(p):
            continue
        if stays(p):
            continue
        (m,) = readers[p]
        if type(dsk[m]) is not Task or not _joins(m, deps, level):
            continue
        below = [d for d in deps[p] if level[d] == level[p] - 1]
        if len(below) != 1:
            continue
        (c,) = below
        if c in keep or type(dsk[c]) is not Task or not stays(c):
            continue
        if all(r == p or m in deps[r] or level[r] >= level[c] + 2 for r in readers[c]) and all(
            type(dsk[r]) is Task for r in readers[c]
        ):
            out[p] = c
    return out


def inline_data(dsk: Mapping[Hashable, object], keep: Iterable[Hashable]) -> dict:
    """The graph with its data (embedded batch tiles, a step's learning rate, small
    constants) inside the tasks that read it, not tasks of their own.

    Dask runs a ``DataNode`` as a task (assigned, "computed" and reported before its
    readers start). A data node goes inside its readers where it has one, or where its
    value takes at most :data:`TINY_BYTES` (each reader gets a copy); requested data
    (``keep``) and data read by something other than a plain task stay. Values are
    unchanged. Measurements: ``docs/design/inline-data.md``.

    Example:
        >>> g = {"x": DataNode("x", 2), "y": Task("y", abs, TaskRef("x"))}
        >>> out = inline_data(g, keep=["y"])
        >>> sorted(out), out["y"]({})
        (['y'], 2)
    """
    keep = set(keep)
    readers: dict = {}
    for k, node in dsk.items():
        for d in getattr(node, "dependencies", ()):
            if type(dsk.get(d)) is DataNode:
                readers.setdefault(d, []).append(k)
    inline = {
        d
        for d, rs in readers.items()
        if d not in keep
        and all(type(dsk[r]) is Task for r in rs)
        and (len(rs) == 1 or getattr(dsk[d].value, "nbytes", TINY_BYTES + 1) <= TINY_BYTES)
    }
    out = {}
    for k, node in dsk.items():
        if k in inline:
            continue
        subs = {d: dsk[d] for d in getattr(node, "dependencies", ()) if d in inline}
        out[k] = node.substitute(subs) if subs else node
    return out


def _pack_key(k):
    """The inner key of a carrying task's last step, which packs the values."""
    return ("carried",) + (k if isinstance(k, tuple) else (k,))


def _pack(value, *carried):
    """A task's value and the values of the tasks it carries (see ``_carriers``), sized
    exactly for Dask (:class:`dfdl.taskgraph.tile_exec.Outputs`)."""
    return Outputs((value, *carried))


def _carriers(dsk, keep, deps, readers, order, level, absorbed, light) -> dict:
    """Tasks ``t`` that run inside their first reader ``u`` although later tasks also
    read them: ``{t: u}``. ``u``'s task then returns ``(u's value, t's value, ...)``
    and every reader of either takes its part, so the chain ``t -> u`` costs no round
    trip; ``u`` may itself be carried further, and carry several tasks. Taken where
    ``t`` is light and not requested, ``u`` is the one reader of the lowest level, every
    other reader comes at least two levels after ``u`` (a backward-pass reader of a
    forward activation), and ``u``'s other inputs come from lower levels than ``t``
    (as for single-reader fusion). ``t``'s tile then lives as long as ``u``'s, which
    in a training step is about as long as it lived anyway."""
    carried: dict = {}
    for t in (k for k in order if k not in absorbed):  # producers before readers
        rs = readers[t]
        if t in keep or type(dsk[t]) is not Task or len(rs) < 2 or not light(t):
            continue
        u = min(rs, key=level.__getitem__)
        if u in keep or u in absorbed or u in carried or type(dsk[u]) is not Task:
            continue
        if any(type(dsk[r]) is not Task for r in (*rs, *readers[u])):
            continue  # readers that are not plain tasks (aliases) keep their keys
        if any(level[r] < level[u] + 2 for r in rs if r != u):
            continue
        if all(level[v] < level[t] for v in deps[u] if v != t):
            carried[t] = u
    return carried
