"""Task fusion: a tile task whose only consumer is one task runs inside that consumer.

Every task costs the embedded cluster about 3 ms of scheduler and worker CPU, and
every dependency a round trip between them (2.6 ms measured per hop of a chain of
no-op tasks, dfdl's batching included). A training step of the transformer is about
1,000 tile tasks, most of them small, and many feed exactly one consumer: fused, two
steps had 30% fewer tasks (2,125 -> 1,495) and ran 10% faster (20.0 -> 18.0 s, means of
three alternating pairs); ResNet: 1,186 -> 1,030 tasks in four steps, 5% faster.

A task ``t`` is absorbed into its consumer ``u`` when

* ``u`` is the only task that reads ``t``, and ``t``'s key is not requested;
* every other input of ``u`` comes from a task of a lower topological level than
  ``t`` (one that is normally done before ``t``): ``u`` then starts as soon as ``t``
  would have finished, so no parallel work is serialised. Sibling partials of one sum
  (same level) stay separate tasks and still run side by side. The exception is a
  light ``t`` (its tile reads and writes at most :data:`LIGHT_BYTES`): it runs inside
  its consumer even where that serialises it after a sibling (a bias gradient's
  partials, the attention's transposes). On 2 cores the CPU that the scheduler and
  worker spend per task is what the transformer's step waits for: 651 -> 543 tasks per
  step; 2.53 -> 2.43 s with 8 MiB against none light, 2.45 -> 2.39 s with 40 MiB
  against 8 (medians of 4 alternating rounds); MLP, ResNet and U-Net within noise;
* ``t`` is not a contraction (GEMM, convolution: ``OpDef.contraction``). Those tasks
  run for tens of milliseconds, so their overhead is small already, and absorbed into
  their consumers they changed the order the worker ran them in: the MLP's steps got
  15% slower (its weight gradients fused into the optimizer's update). The exception
  is a small contraction (its tile reads and writes at most :data:`LIGHT_BYTES`) whose
  consumer is light: a MatMul and its bias Add, a GEMM and its Relu. It runs inside the
  consumer, unless that consumer itself ends up inside a task that is not light. Steps
  with that, against without (``python bench/ab.py``, medians of 3 alternating rounds,
  same losses): transformer 2.53 -> 2.32 s, U-Net 1.21 -> 1.19 s, ResNet 1.05 -> 1.05
  s. The MLP's GEMM tiles (80 MiB) are not small: absorbed into their Relus, they made
  its step 3% slower (0.805 -> 0.831 s, 4 rounds). Small contractions that are
  siblings (partial products of one light sum, which the level rule keeps apart) run
  inside it one after another too (switch :data:`SMALL_PARTIALS`): the transformer's
  weight-gradient partials inside their Adam updates, the MLP's 4096 x 10 head, a
  ResNet's smallest convolution weight gradients. Tasks per step MLP 73 -> 69,
  transformer 304 -> 287, ResNet 131 -> 124, U-Net 130 -> 120; ``python bench/ab.py
  WORKLOAD dfdl.taskgraph.fuse.SMALL_PARTIALS --b True --fresh`` (3 rounds, same losses,
  B = on): ResNet 0.652 against 0.668 s, MLP 0.757 against 0.774 s, transformer 1.860
  against 1.898 s, U-Net 1.036 against 1.043 s. Counting a contraction's own sum of
  small partials as light as well, so that the partials run inside it one after
  another, measured U-Net 1.321 against 1.115 s and ResNet 0.733 against 0.706 s:
  dropped.

Chains collapse: ``a -> b -> u`` becomes one task keyed ``u``. The fused task keeps
the consumer's key, so the dashboard shows its time under the consumer's name.

A light task ``t`` whose activation the backward pass reads again is *carried* by its
first reader ``u`` (``_carriers``): ``u``'s task runs ``t`` first and returns
``(u's value, t's value)``, and each reader of either takes its part inside its own
task. Without that, every such activation (a normalization's output, which the next
convolution reads now and its weight gradient reads later) is a task of its own and a
round trip before the next layer can start. ``u`` may be carried in turn, so a chain
of them runs as one task that returns all their values. Taken where the other readers
come at least two levels after ``u``, so none of them waits for ``u`` in practice, and
``u``'s other inputs come from lower levels than ``t``. Steps with it against without
(``python bench/ab.py WORKLOAD dfdl.taskgraph.fuse.CARRY --b False``, 3 alternating rounds,
same losses): ResNet 1.130 against 1.196 s, transformer 2.283 against 2.430 s, U-Net
1.367 against 1.411 s, MLP 0.866 against 0.863 s. Tried and dropped: also merging the
per-tile BatchNorm moments inside every reader and carrying each convolution inside
its moments task (one task per layer and tile): U-Net 1.509 against 1.345 s, with 19%
more worker CPU; transformer 2.395 against 2.312; ResNet 1.083 against 1.106.

A light task read at once by two contractions, right after a merge of several tiles'
partial sums (the input gradient of a split BatchNorm, read by the convolution's
weight and input gradients after the per-channel sums of every tile), runs inside
both (``_duplicated``): a second pass over a light tile instead of a round trip at the
point where every thread waits. ``python bench/ab.py WORKLOAD
dfdl.taskgraph.fuse.DUPLICATE --b False``: ResNet 1.022 against 1.079 s, U-Net 1.345
against 1.345 s (the transformer and the MLP have no such task). Without the merge
condition it also took the attention's light gradients in the transformer: 2.316
against 2.169 s, 9% more worker CPU, so it is kept to the point where it pays.

Where such a task has exactly two readers, both contractions (``_siblings``, switch
``SIBLINGS``), it runs once instead: the task and one reader run inside the other
reader's task, which returns both readers' values. A split BatchNorm's input gradient
is then computed once per tile, with the convolution's weight gradient and input
gradient after it in one task; the input gradient is the reader that carries (its
readers come first), so the next layer waits for nothing more than before. Tasks per
step: ResNet 173 -> 145, U-Net 151 -> 139. Alternating fresh clusters (3 rounds each,
same losses): ResNet 0.756 against 0.812 s per step, 1.040 against 1.146 thread-s of
tasks; U-Net 1.172 against 1.168 s (1.859 against 1.871 thread-s). In one cluster
(``python bench/ab.py resnet dfdl.taskgraph.fuse.SIBLINGS --b False --steps 6``): 0.728
against 0.837 s (3 rounds).

A light partial whose one reader merges the partials of several tiles (a split
BatchNorm's per-tile moments) runs inside the contraction that produces its input
(``_partials_at_producer``): the convolution's task returns ``(y, moments of y)``.
Absorbed into the merge, as single-reader fusion would have it, the partials of all
tiles ran one after another on one thread, between two layers, while the other threads
waited; at their producers they run side by side on a tile still in cache, and the
merge only adds a few values per channel. Taken where every other reader of the
contraction waits for the merge anyway or comes two levels later. ``python bench/ab.py
WORKLOAD dfdl.taskgraph.fuse.PARTIALS_AT_PRODUCER --b False`` (3 alternating rounds, same
losses): ResNet 1.000 against 1.040 s and 1.050 against 1.082 s, U-Net 1.340 against
1.355 s; the transformer and the MLP have no such partial. Producers that are not
contractions (a ReluGrad before a BatchNorm's gradient sums) are left out: with them
the U-Net measured 1.325 against 1.316 s and the transformer (its bias gradients'
partial sums) 2.432 against 2.397 s.

A merge of tiny partials (``combine`` of values of at most :data:`TINY_BYTES` per
tile: a split BatchNorm's per-channel moments or gradient sums) also runs inside each
of its readers one level up (``_merges_in_readers``, switch ``MERGES_IN_READERS``):
the next layer's tiles add the few values per channel themselves, so they wait for one
round trip after the last partial instead of two (partial -> merge -> reader). The
merge stays a task where later readers (the running statistics, the backward pass)
read it. A merge that absorbed other work (per-tile sums) is left alone: it is no
longer tiny, and every reader would repeat that work. Running it inside the later
readers too, so that no merge task is left, measured slower (README).
The trainer passes ``tiny`` only for a cluster of one worker process: on several,
every reader would fetch every tile's packed output (the activation with its partial)
where one merge fetched them once. Tasks per step ResNet 122 -> 115, U-Net 118 -> 109,
MLP one fewer (the head's sum of two partial products); ``python bench/ab.py WORKLOAD
dfdl.taskgraph.fuse.MERGES_IN_READERS --b False --steps 6 --fresh`` (B = off), same losses:
ResNet 0.710 against 0.770 s (5 rounds), 0.658 against 0.666 s (6 rounds); U-Net 1.148
against 1.228 s (4 rounds); MLP 0.871 against 0.889 s (6 rounds, within noise).

A fused task runs its members in an order fixed when the graph is built (:func:`fused`),
not through ``Task.fuse``, whose worker-side ``execute_graph`` orders the subgraph again
at every execution while holding the GIL. ``python bench/ab.py WORKLOAD
dfdl.taskgraph.fuse.ORDERED --b False`` (3 alternating rounds, same losses): ResNet 0.708
against 0.715 s (task thread time 1.020 against 1.046 s per step), transformer 2.070
against 2.066 s.

Example:
    >>> dsk = fuse_into_consumers(dsk, keep=wanted)  # doctest: +SKIP
"""

from __future__ import annotations

import graphlib
import operator
from collections.abc import Callable, Hashable, Iterable, Mapping

from dask.task_spec import DataNode, Task, TaskRef

from dfdl.taskgraph.tile_exec import Outputs, combine

#: a task whose tile reads and writes at most this many bytes is "light" (a few ms of
#: memory traffic, against a task's ~1.3 ms of scheduler and worker CPU on 2 cores)
LIGHT_BYTES = 40 << 20
#: a node whose output tiles take at most this many bytes has "tiny" outputs (a
#: BatchNorm's per-channel moments): a merge of them costs microseconds to run again
TINY_BYTES = 64 << 10
#: whether a light task with later readers runs inside its first reader (``_carriers``)
CARRY = True
#: whether a light task read by a few tasks at once runs inside each (``_duplicated``)
DUPLICATE = True
#: the most readers a duplicated task runs in
MAX_COPIES = 2
#: whether a light task read by two contractions right after a merge runs once, with both
#: of them, in one task (``_siblings``), instead of inside each (``_duplicated``)
SIBLINGS = True
#: whether a light partial of a merge runs inside the task that produces its input
#: (``_partials_at_producer``)
PARTIALS_AT_PRODUCER = True
#: whether a small contraction runs inside its light consumer also where that consumer
#: waits for a sibling (partial products of one sum, the head of a model-split MLP)
SMALL_PARTIALS = True
#: whether fused tasks run their members in an order fixed when the graph is built
#: (:func:`fused`) rather than through ``dask.task_spec.Task.fuse``
ORDERED = True
#: whether a merge of tiny partials also runs inside each of its readers one level up
#: (:func:`_merges_in_readers`)
MERGES_IN_READERS = True


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
    if light is not None and stays is not None and PARTIALS_AT_PRODUCER:
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
                (first or SMALL_PARTIALS)
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

    for t in [t for t in absorbed if stays is not None and stays(t)]:
        if not light(root(t)):  # it would run inside a heavy task: stays on its own
            del absorbed[t]

    members: dict = {}  # consumer that stays -> the tasks it absorbs, producers first
    for t in order:
        if t in absorbed:
            members.setdefault(root(t), []).append(t)

    carried = {}
    if light is not None and CARRY:
        carried = _carriers(dsk, keep, deps, readers, order, level, absorbed, light)
    for p, c in at_producer.items():
        if c not in absorbed and c not in carried:
            carried[p] = c
    if light is not None and stays is not None and SIBLINGS:
        pairs = _siblings(dsk, keep, deps, readers, level, absorbed, carried, light, stays)
        for t, (first, other) in pairs.items():
            carried[t] = carried[other] = root(first)

    def carrier(t):  # the task whose value carries ``t``'s
        while t in carried:
            t = carried[t]
        return t

    def task_of(r):  # the key of the task ``r`` runs in
        return carrier(root(r))

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
    if light is not None and stays is not None and DUPLICATE:
        twice = _duplicated(dsk, keep, deps, readers, level, absorbed, carried, light, stays)
    out = {}
    for k, node in dsk.items():
        if k in absorbed or k in carried:
            continue
        inner = [dsk[t] for t in members.get(k, ())]
        if k in chains:  # runs the tasks it carries first, returns all their values
            chain = chains[k]
            inner = [dsk[a] for m in chain for a in (*members.get(m, ()), m)] + inner + [node]
            node = Task(_pack_key(k), _pack, TaskRef(k), *(TaskRef(m) for m in packed[k]))
        out[k] = (fused if ORDERED else Task.fuse)(*inner, node, key=k) if inner else node
    inline: dict = {}  # merge -> the readers that run it again inside their own tasks
    if tiny is not None and MERGES_IN_READERS:
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
    ``execute_graph`` runs ``dask.order`` on the subgraph at every execution, holding
    the GIL that the worker's event loop and the other task threads wait for (py-spy, a
    ResNet step: about 2% of the task threads' samples in ``order`` and its sort key).

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

    Dask runs a ``DataNode`` as a task: the scheduler assigns it, the worker "computes"
    it, reports it, and only then starts its readers, at about 3 ms of scheduler and
    worker CPU per task on the 2-core development machine. A data node goes inside its
    readers where it has one, or where its value takes at most :data:`TINY_BYTES` (each
    reader gets a copy); requested data (``keep``) and data read by something other
    than a plain task stay. Of a ResNet step's, the two label tiles, the learning rate
    and the momentum flag go inside (53 -> 49 tasks per step); its two image tiles,
    read by the forward pass and by the stem's weight gradient, stay.

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
