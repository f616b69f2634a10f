"""Which of several worker processes runs each tile task of a training step.

On a cluster of one worker process a step runs as one task
(:mod:`dfdl.taskgraph.step_tasks`). On several processes the step's tiles are shared
out instead: :func:`tile_parts` gives each tile task the worker (its *part*, ``0 <= p <
n``) that its leading parallel axis says: the batch tile for data parallelism, else the
spatial slab, else the model (channel/feature) tile, ``index * n // tiles``, so that a
worker keeps the same batch shard, slab or weight shard step after step. Split by the
model alone, a partial product goes with its largest input (a weight tile's rows, which
its gradient and update follow): the input gradient ``dY @ W`` is then summed across
the workers instead of ``W`` and ``dY`` being gathered (:func:`_cheapest`). Tasks with no
such axis (a weight's summed gradient, its optimizer update, BatchNorm's merged
moments, the loss) get None: :func:`dfdl.taskgraph.step_tasks.group_steps` places them
with what they read, spreading the reductions' roots over the workers (ZeRO-style: each
worker updates the weights it owns and keeps their optimizer state).

Contract: the answer depends only on the plans, the key and ``n``, so every step of a
plan puts the same tile on the same worker; it changes where tasks run, never a value.

Example:
    >>> from dfdl.models import mlp
    >>> from dfdl.plan.compile import compile_step
    >>> sp = compile_step(mlp((8, 4, 2)), batch_size=4, tiles={"batch": 2})  # doctest: +SKIP
    >>> part = tile_parts([sp], token="", n=2)  # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping

from dask.task_spec import Task, TaskRef

from dfdl.plan.compile import StepPlan
from dfdl.plan.tiling import REDUCE_FAN_IN, NodePlan
from dfdl.taskgraph.lower import task_name

#: the axis roles that share a step's tiles out, the first split one of a node leading
ROLE_ORDER = ("batch", "space", "model")

#: workers that compute a replicated merge from its inputs; every further worker that
#: reads it takes a copy from one of the workers before it, each sending to this many
#: at most (a tree of depth log(N) instead of a few workers each sending to all N - 1:
#: a message costs a worker's event loop about 0.6 ms of software, docs/design/scale-sim.md)
BROADCAST_FAN_OUT = 4


def _leading(np_: NodePlan, letters: Iterable[str]) -> str | None:
    """The first of ``letters`` (by :data:`ROLE_ORDER`) that is split and has a role."""
    letters = [c for c in letters if len(np_.letters.get(c, ())) > 1]
    for role in ROLE_ORDER:
        for c in letters:
            if role in np_.roles.get(c, ()):
                return c
    return None


def _share(i: int, tiles: int, n: int) -> int:
    """The worker of tile ``i`` of ``tiles`` along an axis: contiguous runs per worker."""
    return i * n // tiles


def _cheapest(np_: NodePlan, types: Mapping, candidates: list[str]) -> str:
    """Of the model letters ``candidates``, the one whose worker moves the fewest bytes
    for a partial product: each input tile comes from the worker of its first split
    letter (where its tile task, or a weight's update, runs), and the partial sum goes
    to its output tile's worker unless the letter is one of the output's. The first of
    those that tie."""
    grid = set(np_.grid_letters())
    out = sum(types[o].nbytes for o in np_.node.outputs if o in types)
    n_out = math.prod(len(np_.letters[c]) for c in grid)
    cost = {c: 0.0 if c in grid else out / n_out for c in candidates}
    for name, spec in zip(np_.node.inputs, np_.spec.inputs):
        t = types.get(name) if name else None
        if t is None or spec is None:
            continue
        split = [c for c in spec if len(np_.letters.get(c, ())) > 1]
        if not split:
            continue  # read whole by every tile: where the product runs does not matter
        size = t.nbytes / math.prod(len(np_.letters[c]) for c in split)
        for c in candidates:
            if split[0] != c:
                cost[c] += size
    return min(candidates, key=lambda c: (cost[c], candidates.index(c)))


class _Rule:
    """The part of the tasks of one node: tiles by the grid, partials by their combo."""

    def __init__(self, np_: NodePlan, n: int, types: Mapping | None = None):
        self.n = n
        self.grid = np_.grid_letters()
        contracted = np_.spec.contracted()
        self.combos = list(itertools.product(*(range(len(np_.letters[c])) for c in contracted)))
        self.tiles = {c: len(np_.letters[c]) for c in np_.letters}
        self.grid_lead = _leading(np_, self.grid)
        lead = _leading(np_, [*self.grid, *contracted])
        if lead is not None and np_.roles.get(lead) == {"model"} and types is not None:
            # split by the model only: a partial product runs where the fewest bytes
            # move (dX = dY @ W summed over W's rows: on the rows' worker, which has
            # dY's tile and W's, and sends the partial sum, not on the columns')
            others = [
                c
                for c in [*self.grid, *contracted]
                if c != lead and np_.roles.get(c) == {"model"} and len(np_.letters[c]) > 1
            ]
            lead = _cheapest(np_, types, [lead, *others])
        self.partial_lead = lead
        self.contracted = contracted

    def tile(self, idx: tuple) -> int | None:
        if self.grid_lead is None or len(idx) < len(self.grid):
            return None
        c = self.grid_lead
        return _share(idx[self.grid.index(c)], self.tiles[c], self.n)

    def partial(self, idx: tuple) -> int | None:
        """A partial ``(*grid, combo)`` or a sum-tree node ``(*grid, level, j)``."""
        c = self.partial_lead
        if c is None:
            return None
        if c in self.grid:
            return self.tile(idx)
        if len(idx) == len(self.grid) + 1:
            combo = self.combos[idx[-1]]
        elif len(idx) == len(self.grid) + 2:  # a sum over partials j*F**(level+1)...
            level, j = idx[-2], idx[-1]
            first = j * REDUCE_FAN_IN ** (level + 1)
            if first >= len(self.combos):
                return None
            combo = self.combos[first]
        else:
            return None
        return _share(combo[self.contracted.index(c)], self.tiles[c], self.n)


def tile_parts(plans: Iterable[StepPlan], token: str, n: int) -> Callable[[Hashable], int | None]:
    """The part (worker ``0..n-1``) of each tile task key of the plans' steps, or None
    where no split axis decides (see the module docstring).

    Args:
        plans: the step plans a submission was lowered from.
        token: the run token in the keys (:func:`dfdl.taskgraph.lower.new_token`).
        n: the number of worker processes.

    Returns:
        A function of a task key ``(name, step, *index)``.

    Example:
        >>> tile_parts([], token="ab12cd34", n=2)(("x-fwd-ab12cd34", 0, 1))
    """
    table: dict[str, tuple[_Rule, str]] = {}
    for sp in plans:
        for np_ in sp.plan.nodes:
            base = f"{np_.node.name}-{np_.node.phase}"
            if task_name(base, token) in table:
                continue
            rule = _Rule(np_, n, sp.plan.graph.types)
            table[task_name(base, token)] = (rule, "tile")
            table[task_name(f"{base}-partial", token)] = (rule, "partial")
            table[task_name(f"{base}-sum", token)] = (rule, "partial")

    def part(key: Hashable) -> int | None:
        if not (isinstance(key, tuple) and len(key) > 1):
            return None
        hit = table.get(key[0])
        if hit is None:
            return None
        rule, kind = hit
        return rule.tile(key[2:]) if kind == "tile" else rule.partial(key[2:])

    return part


def stripped(key: Hashable, token: str) -> tuple:
    """``key`` without its run token and step: the same for a tile in every step.

    Example:
        >>> stripped(("w-update-ab12cd34", 3, 0, 1), "ab12cd34")
        ('w-update', 0, 1)
    """
    name = key[0]
    suffix = f"-{token}"
    if token and isinstance(name, str) and name.endswith(suffix):
        name = name[: -len(suffix)]
    return (name, *key[2:])


def replicate_merges(
    dsk: Mapping[Hashable, object],
    keep: Collection[Hashable],
    place: Callable[[Hashable], int | None],
    tiny: Callable[[Hashable], bool],
) -> tuple[dict, Callable[[Hashable], int | None]]:
    """The graph with each tiny merge that workers read (BatchNormalization's merged
    moments and gradient sums: a task with no worker of its own that reads only tasks
    with one) computed again on every worker that reads it, from the same inputs in the
    same order; and ``place`` extended to the copies.

    A worker then waits for the others' partial sums only, not also for one worker's
    merge of them: one exchange per merge instead of two. On more than
    :data:`BROADCAST_FAN_OUT` readers' workers, only that many (those holding inputs
    first) compute it; the others take it from a copy before them in a tree of fan-out
    :data:`BROADCAST_FAN_OUT`, so that no worker sends it to all the others. The
    copies' values are the same bits as the merge's.

    Args:
        dsk: a graph of ``dask.task_spec`` nodes with keys ``(name, step, ...)``.
        keep: requested keys (never removed).
        place: the worker of a task, or None (:func:`tile_parts`).
        tiny: whether a task's output is tiny.

    Returns:
        ``(graph, place)``: a copy's key is the merge's with ``f"on{p}"`` appended.

    Example:
        >>> from dask.task_spec import Task, TaskRef
        >>> g = {("a", 0, 0): Task(("a", 0, 0), abs, -1), ("a", 0, 1): Task(("a", 0, 1), abs, -2),
        ...      ("m", 0): Task(("m", 0), max, TaskRef(("a", 0, 0)), TaskRef(("a", 0, 1))),
        ...      ("b", 0, 0): Task(("b", 0, 0), abs, TaskRef(("m", 0))),
        ...      ("b", 0, 1): Task(("b", 0, 1), abs, TaskRef(("m", 0)))}
        >>> out, where = replicate_merges(g, [], lambda k: k[2] if k[0] != "m" else None,
        ...                               lambda k: True)
        >>> sorted(k for k in out if k[0] == "m"), where(("m", 0, "on1"))
        ([('m', 0, 'on0'), ('m', 0, 'on1')], 1)
    """
    keep = set(keep)
    readers: dict = {}
    for k, node in dsk.items():
        for d in getattr(node, "dependencies", ()):
            readers.setdefault(d, []).append(k)
    out = dict(dsk)
    copies: dict = {}
    for k, node in dsk.items():
        if not (type(node) is Task and _in_step(k) and place(k) is None and tiny(k)):
            continue
        ins = [d for d in node.dependencies if d in dsk]
        if not ins or any(place(d) is None for d in ins):
            continue
        by_part: dict = {}
        for r in readers.get(k, ()):
            p = place(r)
            if p is not None and _in_step(r):
                by_part.setdefault(p, []).append(r)
        if len(by_part) < 2:
            continue
        # the workers holding inputs first (they read the fewest values from others)
        owners = {place(d) for d in ins}
        parts = sorted(by_part, key=lambda p: (p not in owners, p))
        for i, p in enumerate(parts):
            ck = (*k, f"on{p}")
            copies[ck] = p
            if i < BROADCAST_FAN_OUT:
                out[ck] = node.substitute({}, key=ck)
            else:  # a copy of a copy: each worker sends to BROADCAST_FAN_OUT others at most
                parent = (*k, f"on{parts[i // BROADCAST_FAN_OUT - 1]}")
                out[ck] = Task(ck, _same, TaskRef(parent))
            for r in by_part[p]:
                out[r] = out[r].substitute({k: ck})
        if k not in keep and all(place(r) is not None for r in readers[k]):
            del out[k]

    def where(key: Hashable) -> int | None:
        p = copies.get(key)
        return p if p is not None else place(key)

    return out, where


def _same(value):
    """A merge's value, taken from another worker's copy of it (the same bits)."""
    return value


def _in_step(key: Hashable) -> bool:
    return isinstance(key, tuple) and len(key) > 1 and type(key[1]) is int
