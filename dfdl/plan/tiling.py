"""The tiling planner: chunks for every tensor, a tile grid for every node.

Each node's tile rule (:class:`dfdl.ops.registry.TileSpec`) names the node's axes with
letters. :func:`make_plan` gives every letter a chunking (tuple of chunk sizes, as in
dask) and returns a :class:`Plan`:

* ``tiles="uneven"`` (for tests): every letter axis of size >= 3 gets uneven chunks
  (``5 -> (3, 1, 1)``), so every tile rule is exercised off the easy path, up to
  :data:`UNEVEN_MAX_TASKS` tasks per node (the node's later letters stay whole);
* a dict ``{"batch": b, "model": m}``: axes descending from a graph input's axis 0 are
  split into ``b`` chunks, axes indexed by a weight (features, channels) into ``m``;
* ``None``: automatic, from the batch size, the tensor sizes and the cluster's cores.

With a worker ``memory_limit``, every task's memory (inputs + outputs + temporaries,
estimated as the outputs once more) stays under ``task_fraction`` of it: automatic
tilings split further until every task fits; one that cannot, or an explicit ``tiles=``
that does not, raises :class:`~dfdl.errors.MemoryPlanError` naming the node and the
smallest memory limit that would work. Tensors get the chunks of the letters on their
axes; graph inputs and initializers take the chunks their first consumer asks for.
Guarantee: a consumer needing a region that is not one tile gets it assembled from the
producer's tiles, so a mismatch costs copies but never changes results.

Example:
    >>> from dfdl.ir.bind import TensorType, bind
    >>> from dfdl.ir.onnx_io import load_model, to_ir
    >>> from dfdl.models import mlp
    >>> g = bind(to_ir(load_model(mlp((4, 3)))), {"x": TensorType((8, 4), "float32")})
    >>> make_plan(g, tiles={"batch": 2}).chunks["x"]
    ((4, 4), (4,))
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dfdl.errors import MemoryPlanError, PlanError
from dfdl.ir.graph import Graph, Node
from dfdl.ops import lookup
from dfdl.ops.common import whole_tile
from dfdl.ops.registry import TensorType, TileContext, TileSpec
from dfdl.plan.estimate import (
    estimate_memory,
    format_bytes,
    smallest_limit,
    spill_threshold,
    task_budget,
    worker_footprint,
)

Chunks = tuple[tuple[int, ...], ...]

#: below this many bytes per tile, automatic planning does not split further
MIN_TILE_BYTES = 256 * 2**10
#: automatic planning splits the model instead of the batch when a weight is at least
#: this big and bigger than every activation (see :func:`_auto_tiles`)
MODEL_SPLIT_BYTES = 16 * 2**20
#: the keys of a ``tiles=`` dict. ``min_weight_tile`` (bytes): a weight whose model tiles
#: would be smaller keeps the model axes of its outputs whole (fewer tasks and dependency
#: hops); the automatic tiling sets it to ``MIN_TILE_BYTES``, tiles refined for a memory
#: limit split every weight again (``docs/design/model-tiles.md``)
TILES_KEYS = ("batch", "model", "space", "min_weight_tile")
#: most partial results one combine task sums (bounded fan-in, tree order fixed)
REDUCE_FAN_IN = 4
#: share of a worker's memory limit one task may use: the rest holds other tasks' tiles
#: (one task per worker thread runs at a time) and the worker process itself
TASK_MEMORY_FRACTION = 0.25
#: memory-bounded planning gives up beyond this many tasks per pass (at about a
#: millisecond of scheduling each, more would take longer to schedule than to compute)
MAX_PLAN_TASKS = 100_000


def even_chunks(size: int, parts: int) -> tuple[int, ...]:
    """``size`` split into ``parts`` near-equal chunks, larger ones first."""
    parts = max(1, min(parts, size)) if size else 1
    q, r = divmod(size, parts)
    return tuple(q + 1 if i < r else q for i in range(parts))


#: ``tiles="uneven"``: the most tasks of one node (3 chunks on each of 5 letters); the
#: letters past it stay whole, so that a rank-7 tensor is not 3**7 tiles
UNEVEN_MAX_TASKS = 243


def uneven_chunks(size: int) -> tuple[int, ...]:
    """Deliberately unequal chunks for sizes >= 3: 3 -> (2, 1), 5 -> (3, 1, 1)."""
    if size < 3:
        return (size,)
    first = (size + 1) // 2
    rest = size - first
    return (first,) + even_chunks(rest, min(2, rest))


@dataclass
class NodePlan:
    """Tiling of one node: its spec and the chunks of every letter it uses."""

    node: Node
    spec: TileSpec
    letters: dict[str, tuple[int, ...]]
    sizes: dict[str, int]
    #: the roles ("batch", "model", "space") of each letter: where tiles of a step go on
    #: several workers (:mod:`dfdl.taskgraph.partition`)
    roles: dict[str, frozenset[str]] = field(default_factory=dict)

    def grid_letters(self) -> list[str]:
        seen: list[str] = []
        for _, s in present_outputs(self.node, self.spec):
            for ch in s:
                if ch != "." and ch not in seen:
                    seen.append(ch)
        return seen

    def n_tiles(self) -> int:
        return math.prod(len(self.letters[c]) for c in self.grid_letters())

    def n_partials(self) -> int:
        return math.prod(len(self.letters[c]) for c in self.spec.contracted())

    def n_tasks(self) -> int:
        parts = self.n_partials()
        combines = 0
        while parts > 1:
            parts = math.ceil(parts / REDUCE_FAN_IN)
            combines += parts
        return self.n_tiles() * (self.n_partials() + combines)


@dataclass
class Plan:
    """A graph with a chunking for every tensor and a tiling for every node."""

    graph: Graph
    chunks: dict[str, Chunks]
    nodes: list[NodePlan]
    tiles: object = None  # the tiling used: {"batch": b, "model": m} or "uneven"
    task_bytes: dict[str, int] = field(default_factory=dict)
    task_memory: dict[str, int] = field(default_factory=dict)
    output_bytes: dict[str, int] = field(default_factory=dict)  # largest task's outputs
    memory_limit: int | None = None
    footprint: int = 0  # the worker process's own bytes, counted against memory_limit

    def n_tasks(self) -> int:
        """Number of compute tasks of one forward pass (sources excluded)."""
        return sum(n.n_tasks() for n in self.nodes)

    def largest_task(self) -> tuple[str, int]:
        """(node name, bytes) of the task with the most input + output bytes."""
        if not self.task_bytes:
            return ("", 0)
        name = max(self.task_bytes, key=self.task_bytes.get)
        return name, self.task_bytes[name]

    def peak_task(self) -> tuple[str, int]:
        """(node name, bytes) of the task with the largest memory estimate (inputs +
        outputs + temporaries)."""
        if not self.task_memory:
            return ("", 0)
        name = max(self.task_memory, key=self.task_memory.get)
        return name, self.task_memory[name]

    def estimate(self, workers: int, threads_per_worker: int = 1):
        """The pre-flight memory estimate on ``workers`` processes (see
        :func:`dfdl.plan.estimate.estimate_memory`).

        Example:
            >>> plan.estimate(workers=2).spilled_per_step  # doctest: +SKIP
        """
        return estimate_memory(self, workers, threads_per_worker=threads_per_worker)

    def summary(
        self, workers: int | None = None, threads_per_worker: int = 1, *, tensors: bool = True
    ) -> str:
        """Human-readable text: the task count, the tiling (as ``dfdl plan --tiles``
        takes it), the largest task; with ``workers`` (processes) the memory estimate
        (:func:`dfdl.plan.estimate.estimate_memory`); with ``tensors`` then each
        tensor's tiling (:meth:`tensor_table`).

        Example:
            >>> print(plan.summary(tensors=False))  # doctest: +SKIP
            plan for 'mlp': 3 nodes, 6 tasks, tiles batch=2,model=1
            largest task: layers.0 (1.1 KiB in + out)
        """
        lines = [
            f"plan for {self.graph.name!r}: {len(self.nodes)} nodes, {self.n_tasks()} tasks,"
            f" tiles {format_tiles(self.tiles)}"
        ]
        name, nbytes = self.largest_task()
        lines.append(f"largest task: {name} ({format_bytes(nbytes)} in + out)")
        if self.memory_limit:
            name, nbytes = self.peak_task()
            lines.append(
                f"largest task memory: {name} ({format_bytes(nbytes)} with temporaries; "
                f"worker memory limit {format_bytes(self.memory_limit)})"
            )
        if workers:
            lines.extend(self.estimate(workers, threads_per_worker).lines())
        if tensors:
            lines.append(self.tensor_table())
        return "\n".join(lines)

    def tensor_table(self) -> str:
        """One row per tensor: name, shape, dtype, tile count and chunks (``4*4x16``:
        four chunks of 4 rows, one of 16 columns; ``(3,2)`` uneven). Every column is as
        wide as its longest entry, so nothing is cut.

        Example:
            >>> print(plan.tensor_table())  # doctest: +SKIP
            tensor  shape    dtype    tiles  chunks
            x       [16, 8]  float32      4  4*4x8
        """
        rows = []
        for name, ch in self.chunks.items():
            t = self.graph.types[name]
            ntiles = math.prod(len(c) for c in ch) if ch else 1
            shown = "x".join(_fmt_chunks(c) for c in ch) if ch else "scalar"
            rows.append((name, str(list(t.shape)), str(t.dtype), str(ntiles), shown))
        header = ("tensor", "shape", "dtype", "tiles", "chunks")
        return "\n".join(format_table(header, rows, right={3}))


def format_tiles(tiles) -> str:
    """A tiling as ``dfdl plan --tiles`` and ``dfdl train --tiles`` take it.

    Example:
        >>> format_tiles({"batch": 2, "model": 1})
        'batch=2,model=1'
        >>> format_tiles(None), format_tiles("uneven")
        ('auto', 'uneven')
    """
    if tiles is None:
        return "auto"
    if isinstance(tiles, Mapping):
        return ",".join(f"{k}={v}" for k, v in tiles.items())
    return str(tiles)


def format_table(
    header: Sequence[str], rows: Iterable[Sequence[str]], right: Collection[int] = ()
) -> list[str]:
    """Lines of a text table whose columns are as wide as their widest cell (two spaces
    apart; the columns numbered in ``right`` aligned right; no trailing blanks).

    Example:
        >>> for line in format_table(("name", "n"), [("a", "1"), ("bcd", "10")], right={1}):
        ...     print(line)
        name   n
        a      1
        bcd   10
    """
    table = [tuple(header), *(tuple(r) for r in rows)]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    return [
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in table
    ]


def _fmt_chunks(c: tuple[int, ...]) -> str:
    """One axis's chunks: ``16`` (whole), ``4*4`` (four chunks of 4), ``(3,2)`` (uneven)."""
    if len(set(c)) == 1:
        return f"{c[0]}" if len(c) == 1 else f"{len(c)}*{c[0]}"
    return "(" + ",".join(map(str, c)) + ")"


def node_spec(node: Node, graph: Graph) -> TileSpec:
    """The node's TileSpec from its op's tile rule (untiled when the op has none)."""
    op = lookup(node.op_type, node.domain)
    consts = graph.initializers
    ctx = TileContext(
        inputs=tuple(graph.types.get(i) if i else None for i in node.inputs),
        outputs=tuple(graph.types[o] if o else None for o in _trimmed(node.outputs)),
        consts=tuple(consts.get(i) if i else None for i in node.inputs),
        attrs=node.attrs,
    )
    spec = (op.tile or whole_tile)(ctx)
    n_out = len(ctx.outputs)
    if len(spec.outputs) < n_out or len(spec.inputs) < len([i for i in node.inputs]):
        raise PlanError(
            f"node {node.name!r} ({node.op_type}): tile rule returned "
            f"{len(spec.inputs)} input / {len(spec.outputs)} output specs for "
            f"{len(node.inputs)} inputs / {n_out} outputs"
        )
    return spec


def _trimmed(outputs: list[str]) -> list[str]:
    """Output names without trailing absent ones (middle ones stay, as "")."""
    out = list(outputs)
    while out and not out[-1]:
        out.pop()
    return out


def present_outputs(node: Node, spec: TileSpec) -> list[tuple[str, str]]:
    """(output name, its spec) for every output the node produces."""
    return [(o, spec.outputs[p]) for p, o in enumerate(node.outputs) if o]


def _letter_sizes(node: Node, spec: TileSpec, graph: Graph) -> dict[str, int]:
    sizes: dict[str, int] = {}
    pairs = [(i, n, s) for i, (n, s) in enumerate(zip(node.inputs, spec.inputs))]
    pairs += [(None, n, s) for n, s in present_outputs(node, spec)]
    for i, name, s in pairs:
        if not name or s is None:
            continue
        t = graph.types[name]
        if len(s) != t.rank:
            raise PlanError(
                f"node {node.name!r} ({node.op_type}): tile spec {s!r} for {name!r} does "
                f"not match its rank {t.rank}"
            )
        for axis, (ch, d) in enumerate(zip(s, t.shape)):
            if ch == "." or (i, axis) in spec.windows:  # a halo read does not size a letter
                continue
            prev = sizes.get(ch)
            if prev is None or prev == 1:
                sizes[ch] = d
            elif d != 1 and d != prev:
                raise PlanError(
                    f"node {node.name!r} ({node.op_type}): tile letter {ch!r} has sizes "
                    f"{prev} and {d}"
                )
    return sizes


def _cap_uneven(letters: dict[str, tuple[int, ...]]) -> None:
    """Keep whole the letters past :data:`UNEVEN_MAX_TASKS` tasks of one node, in the
    order its inputs, then its outputs, name them."""
    tasks = 1
    for ch, chunks in letters.items():
        if tasks * len(chunks) > UNEVEN_MAX_TASKS:
            letters[ch] = (sum(chunks),)
        else:
            tasks *= len(chunks)


@dataclass
class _Policy:
    mode: str  # "uneven" | "split"
    batch: int = 1
    model: int = 1
    space: int = 1
    # bytes: a weight whose model tiles would be smaller keeps its outputs' model axes whole
    min_weight_tile: int = 0

    def tiles(self) -> dict[str, int] | str:
        """The tiling as ``tiles=`` spells it ("space" only when it splits,
        "min_weight_tile" only where the model splits)."""
        if self.mode == "uneven":
            return "uneven"
        out = {"batch": self.batch, "model": self.model}
        if self.space > 1:
            out["space"] = self.space
        if self.model > 1 and self.min_weight_tile:
            out["min_weight_tile"] = self.min_weight_tile
        return out

    def grown(self, batch: int, model: int, space: int) -> _Policy:
        # finer tiles for a memory limit split every weight again
        return _Policy("split", self.batch * batch, self.model * model, self.space * space)

    def splits_weight(self, nbytes: int) -> bool:
        """Whether a weight of ``nbytes`` splits the model axes of the outputs it feeds."""
        return nbytes >= self.model * self.min_weight_tile

    def chunks(self, size: int, roles: set[str]) -> tuple[int, ...]:
        if self.mode == "uneven":
            return uneven_chunks(size)
        parts = 1
        for role, n in (("batch", self.batch), ("model", self.model), ("space", self.space)):
            if role in roles:
                parts *= n
        return even_chunks(size, parts)


def _auto_tiles(graph: Graph, cores: int, weights: set[str]) -> dict[str, int]:
    """Batch tiles from the cores and the activation sizes; model tiles stay 1, except
    for a graph whose weights outweigh its activations.

    Batch tiles leave each large weight's gradient and update one task, on one core,
    while the others wait for the updated weight; model tiles (along both of a weight's
    axes, so ``model ** 2 >= cores`` tiles) spread every GEMM and update over the cores.
    Measurements: ``docs/design/model-tiles.md``.
    """
    batch = 0
    for name in graph.inputs:
        t = graph.types[name]
        if name in weights:
            continue
        if t.rank:
            batch = max(batch, t.shape[0])
    if batch <= 1:
        return {"batch": 1, "model": 1}
    biggest = max((t.nbytes for t in graph.types.values()), default=0)
    heaviest = max((graph.types[w].nbytes for w in weights if w in graph.types), default=0)
    activations = max(
        (
            t.nbytes
            for name, t in graph.types.items()
            if name not in weights and t.rank and t.shape[0] == batch
        ),
        default=0,
    )
    if cores > 1 and heaviest >= MODEL_SPLIT_BYTES and heaviest > activations:
        return {"batch": 1, "model": math.isqrt(cores - 1) + 1}
    by_size = max(1, biggest // MIN_TILE_BYTES)
    return {"batch": int(max(1, min(cores, batch, by_size))), "model": 1}


def _policy(tiles, graph: Graph, cores: int, weights: set[str]) -> _Policy:
    if tiles == "uneven":
        return _Policy("uneven")
    if tiles is None:
        auto = _auto_tiles(graph, cores, weights)
        return _Policy("split", auto["batch"], auto["model"], 1, MIN_TILE_BYTES)
    if not isinstance(tiles, Mapping):
        raise PlanError(
            "tiles must be None, 'uneven' or a dict like {'batch': 4, 'model': 2, 'space': 2}, "
            f"not {tiles!r}"
        )
    bad = [k for k in tiles if k not in TILES_KEYS]
    if bad:
        raise PlanError(f"tiles: unknown key(s) {bad}; use {', '.join(map(repr, TILES_KEYS))}")
    for k, v in tiles.items():
        if not isinstance(v, int | np.integer) or v < (0 if k == "min_weight_tile" else 1):
            kind = "a non-negative" if k == "min_weight_tile" else "a positive"
            raise PlanError(f"tiles[{k!r}] must be {kind} integer, not {v!r}")
    return _Policy(
        "split",
        int(tiles.get("batch", 1)),
        int(tiles.get("model", 1)),
        int(tiles.get("space", 1)),
        int(tiles.get("min_weight_tile", 0)),
    )


def make_plan(
    graph: Graph,
    tiles=None,
    *,
    cores: int = 1,
    weights: Collection[str] = (),
    memory_limit: int | None = None,
    task_fraction: float = TASK_MEMORY_FRACTION,
    footprint: int | None = None,
    carry: Mapping[str, str] | None = None,
) -> Plan:
    """Plan the tiling of a bound graph (see the module docstring).

    Args:
        graph: a graph after :func:`dfdl.ir.bind.bind` (static types everywhere).
        tiles: ``None`` (automatic), ``"uneven"``, or ``{"batch": b, "model": m}``.
        cores: worker threads of the target cluster (used by automatic planning).
        weights: graph inputs that are parameters or optimizer state, not data (the
            training graph's carried tensors): their axis 0 is not a batch axis, and
            the axes they index are model axes, as for initializers.
        memory_limit: the smallest worker's memory limit in bytes (None: unbounded).
        task_fraction: share of ``memory_limit`` one task may use.
        footprint: the worker process's own resident bytes, counted against
            ``memory_limit`` (default: :func:`dfdl.plan.estimate.worker_footprint`, 0
            when Dask's process-memory thresholds are off). With one, a task also fits
            between Dask's spill threshold and :data:`~dfdl.plan.estimate.HEADROOM`
            (:func:`dfdl.plan.estimate.task_budget`), and the footprint with one task
            must fit under the spill threshold.
        carry: carried input -> the output with its next value (a training graph's
            ``new``): the input gets the output's chunks, so a step's tiles feed the
            next step as they are (readers with other tile grids slice or assemble
            them) instead of through rechunk tasks every step.

    Returns:
        The :class:`Plan`.

    Raises:
        MemoryPlanError: no tiling (or not the given ``tiles``) keeps every task under
            ``task_fraction * memory_limit``.

    Example:
        >>> plan = make_plan(graph, memory_limit=2**30)  # doctest: +SKIP
    """
    weights = set(weights)
    carry = dict(carry or {})
    policy = _policy(tiles, graph, cores, weights)
    plan = _build(graph, policy, weights, carry)
    if memory_limit is None or policy.mode == "uneven":
        return plan
    if not task_fraction > 0 or memory_limit <= 0:
        raise PlanError(
            f"memory_limit ({memory_limit!r}) and task_fraction ({task_fraction!r}) must be "
            "positive"
        )
    if footprint is None:
        footprint = worker_footprint()
    budget = task_budget(memory_limit, footprint, task_fraction)
    if footprint and footprint + budget > spill_threshold() * memory_limit:
        # budget and spill line both grow with the limit: F + f * L <= spill * L
        room = spill_threshold() - budget / memory_limit
        smallest = (math.ceil(footprint / room / 2**20) + 1) * 2**20 if room > 0 else 0
        raise MemoryPlanError(
            f"the worker memory limit {format_bytes(memory_limit)} leaves no room for tiles: "
            f"a worker process takes about {format_bytes(footprint)} of its own, and Dask "
            f"spills everything it can at {spill_threshold():g} of the limit. Give each "
            f"worker at least {format_bytes(smallest)} (or set dask config "
            "dfdl.memory.worker-footprint to an idle worker's measured resident memory).",
            memory_limit=int(memory_limit),
            smallest_limit=smallest,
        )
    if tiles is None:
        plan = _refine(graph, policy, weights, plan, budget, carry)
    plan.memory_limit = int(memory_limit)
    plan.footprint = int(footprint)
    name, need = plan.peak_task()
    if need > budget:
        smallest = smallest_limit(need, footprint, task_fraction)
        how = (
            f"the tiles={tiles!r} given"
            if tiles is not None
            else f"the finest batch and model tiling dfdl makes ({plan.tiles}, "
            f"{plan.n_tasks()} tasks; at most {MAX_PLAN_TASKS})"
        )
        raise MemoryPlanError(
            f"node {name!r} needs about {format_bytes(need)} per task with {how}, more than "
            f"the {format_bytes(budget)} a task may use under the worker memory limit "
            f"{format_bytes(memory_limit)}"
            + f" ({budget / memory_limit:g} of it). "
            + f"Give each worker at least {format_bytes(smallest)}"
            + (", or split further with tiles=" if tiles is not None else ", or a smaller batch")
            + ".",
            node=name,
            task_bytes=need,
            memory_limit=int(memory_limit),
            smallest_limit=smallest,
        )
    return plan


def _refine(
    graph: Graph,
    policy: _Policy,
    weights: set[str],
    plan: Plan,
    budget: int,
    carry: Mapping[str, str],
) -> Plan:
    """Split an automatic tiling further until the largest task fits ``budget``.

    Each round doubles the batch, the model or the spatial tiles: the one that fits with
    fewer tasks, else the one that shrinks the largest task more; all at once only when
    none alone shrinks it (several nodes at the top, one per role). Stops when nothing
    shrinks the largest task.
    """

    def grown(*factors: int) -> tuple[int, int, _Policy, Plan]:
        p = policy.grown(*factors)
        built = _build(graph, p, weights, carry)
        return built.peak_task()[1], built.n_tasks(), p, built

    def shrinking(candidates) -> list:
        now = plan.peak_task()[1]
        return [c for c in candidates if c[0] < now and c[1] <= MAX_PLAN_TASKS]

    while plan.peak_task()[1] > budget:
        better = shrinking(grown(*f) for f in ((2, 1, 1), (1, 2, 1), (1, 1, 2)))
        if not better:
            better = shrinking([grown(2, 2, 2)])
        if not better:
            break
        fitting = [c for c in better if c[0] <= budget]
        _, _, policy, plan = (
            min(fitting, key=lambda c: c[1]) if fitting else min(better, key=lambda c: c[:2])
        )
    return plan


def _build(graph: Graph, policy: _Policy, weights: set[str], carry: Mapping[str, str]) -> Plan:
    """The plan of one tiling policy."""
    roles: dict[tuple[str, int], set[str]] = {}
    for name in graph.inputs:
        if graph.types[name].rank and name not in weights:
            roles[(name, 0)] = {"batch"}
    chunks: dict[str, Chunks] = {}
    shape_roles: dict[tuple, dict[int, set[str]]] = {}
    node_plans: list[NodePlan] = []
    task_bytes: dict[str, int] = {}
    task_memory: dict[str, int] = {}
    output_bytes: dict[str, int] = {}
    for node in graph.nodes:
        spec = node_spec(node, graph)
        sizes = _letter_sizes(node, spec, graph)
        letter_roles: dict[str, set[str]] = {c: set() for c in sizes}
        out_letters = set("".join(spec.outputs))
        for i, (name, s) in enumerate(zip(node.inputs, spec.inputs)):
            if not name or s is None:
                continue
            is_weight = name in graph.initializers or name in weights
            splits = is_weight and policy.splits_weight(graph.types[name].nbytes)
            for axis, ch in enumerate(s):
                if ch == "." or (i, axis) in spec.windows:
                    continue
                if graph.types[name].shape[axis] != sizes[ch]:
                    continue
                letter_roles[ch] |= roles.get((name, axis), set())
                if splits and ch in out_letters:
                    letter_roles[ch].add("model")
        if spec.spatial[:1] in letter_roles:
            letter_roles[spec.spatial[0]].add("space")  # slabs along the outermost axis
        if not any(letter_roles.values()):
            # a node fed by no tiled tensor (the loss gradient broadcast from a scalar):
            # its axes play the roles of the first tensor seen with its output's shape
            for name, s in present_outputs(node, spec):
                seen = shape_roles.get(graph.types[name].shape, {})
                for axis, ch in enumerate(s):
                    if ch != ".":
                        letter_roles[ch] |= seen.get(axis, set())
        letters: dict[str, tuple[int, ...]] = {}
        for ch, size in sizes.items():
            letters[ch] = policy.chunks(size, letter_roles[ch])
        if policy.mode == "uneven":
            _cap_uneven(letters)
        wide = _channels_for_batch(node, spec, graph, roles, letter_roles, policy)
        if wide is not None:
            ch, factor = wide
            letters[ch] = even_chunks(sizes[ch], len(letters[ch]) * factor)
        for ch in _whole_contraction(node, spec, graph, letters, letter_roles):
            letters[ch] = (sizes[ch],)
        for i, (name, s) in enumerate(zip(node.inputs, spec.inputs)):
            if not name or name in chunks:
                continue
            t = graph.types[name]
            if s is None:
                chunks[name] = tuple((d,) for d in t.shape)
            else:
                chunks[name] = tuple(
                    (d,)
                    if ch == "."
                    else even_chunks(d, len(letters[ch]))  # a halo'd input: as many slabs
                    if (i, axis) in spec.windows
                    else (d,)
                    if d != sizes[ch]
                    else letters[ch]
                    for axis, (ch, d) in enumerate(zip(s, t.shape))
                )
        for name, s in present_outputs(node, spec):
            t = graph.types[name]
            chunks[name] = tuple((d,) if ch == "." else letters[ch] for ch, d in zip(s, t.shape))
            if t.shape not in shape_roles and any(letter_roles[ch] for ch in s if ch != "."):
                shape_roles[t.shape] = {a: letter_roles[ch] for a, ch in enumerate(s) if ch != "."}
            same = _same_shape_input(node, graph, t)
            for axis, ch in enumerate(s):
                if ch != ".":
                    roles[(name, axis)] = letter_roles[ch]
                elif same is not None and (same, axis) in roles:
                    # an axis this node keeps whole (BatchNorm's batch) is still the
                    # batch axis for the consumers, which may split it again
                    roles[(name, axis)] = roles[(same, axis)]
        np_ = NodePlan(
            node, spec, letters, sizes, {c: frozenset(r) for c, r in letter_roles.items()}
        )
        node_plans.append(np_)
        ins, outs = _max_task_bytes(np_, graph)
        task_bytes[node.name] = ins + outs
        task_memory[node.name] = ins + 2 * outs  # temporaries: about the outputs again
        output_bytes[node.name] = outs
    for name in graph.outputs:
        if name not in chunks:
            chunks[name] = tuple((d,) for d in graph.types[name].shape)
    for name, new in carry.items():
        if name in chunks and new in chunks and graph.types[name].shape == graph.types[new].shape:
            chunks[name] = chunks[new]
    return Plan(graph, chunks, node_plans, policy.tiles(), task_bytes, task_memory, output_bytes)


def _channels_for_batch(
    node: Node,
    spec: TileSpec,
    graph: Graph,
    roles: Mapping[tuple[str, int], set[str]],
    letter_roles: Mapping[str, set[str]],
    policy: _Policy,
) -> tuple[str, int] | None:
    """(model letter, factor) for a node that keeps a batch axis whole: its channels
    split ``factor`` times more, as many as the batch tiles around it; None for every
    other node.

    A training-mode BatchNormalization (and its gradient) needs each channel's
    statistics over the whole batch, so its tile grid has only the channel axis: with
    ``model=1`` it is one task that one worker thread runs while the others wait.
    Per-channel math does not change with the channel tiles. Measurements:
    ``docs/design/channels-for-batch.md``.
    """
    if policy.mode != "split" or policy.batch <= 1:
        return None
    grid = [ch for _, s in present_outputs(node, spec) for ch in s if ch != "."]
    if any("batch" in letter_roles.get(ch, ()) for ch in grid):
        return None
    batch = max(
        (
            graph.types[name].shape[axis]
            for name, s in zip(node.inputs, spec.inputs)
            if name and s is not None
            for axis, ch in enumerate(s)
            if ch == "." and "batch" in roles.get((name, axis), ())
        ),
        default=0,
    )
    factor = len(even_chunks(batch, policy.batch))
    wide = next((ch for ch in grid if "model" in letter_roles.get(ch, ())), None)
    return None if wide is None or factor <= 1 else (wide, factor)


def _whole_contraction(
    node: Node,
    spec: TileSpec,
    graph: Graph,
    letters: Mapping[str, tuple[int, ...]],
    letter_roles: Mapping[str, set[str]],
) -> list[str]:
    """The batch letters a GEMM-class node contracts whole, reading its inputs whole:
    those of a node whose outputs outweigh its inputs; [] for every other node.

    A dense layer's weight gradient ``X^T @ dY`` with the batch split in ``b`` tiles
    makes ``b`` partial products of the whole weight's size and a task summing them; one
    product over the whole batch writes the weight's tile once, while the other threads
    run the input gradient's batch tiles. Convolution weight gradients (small weights,
    large activations) and every non-contraction keep their partials. Measurements:
    ``docs/design/whole-contraction.md``.
    """
    op = lookup(node.op_type, node.domain)
    split = [ch for ch in spec.contracted() if len(letters.get(ch, ())) > 1]
    if op is None or not op.contraction or not split:
        return []
    if any(letter_roles.get(ch) != {"batch"} for ch in split):
        return []
    outs = sum(graph.types[o].nbytes for o, _ in present_outputs(node, spec))
    ins = sum(graph.types[i].nbytes for i in node.inputs if i)
    return split if outs > ins else []


def _same_shape_input(node: Node, graph: Graph, t: TensorType) -> str | None:
    """The first input of ``node`` with the shape of output type ``t``, if any."""
    for name in node.inputs:
        if name and name in graph.types and graph.types[name].shape == t.shape:
            return name
    return None


def _max_task_bytes(np_: NodePlan, graph: Graph) -> tuple[int, int]:
    """(input bytes, output bytes) of the node's largest tile task."""
    node, spec = np_.node, np_.spec
    totals = [0, 0]
    named = [(0, i, n, s) for i, (n, s) in enumerate(zip(node.inputs, spec.inputs))]
    named += [(1, None, n, s) for n, s in present_outputs(node, spec)]
    for side, i, name, s in named:
        if not name:
            continue
        t: TensorType = graph.types[name]
        if s is None:
            totals[side] += t.nbytes
            continue
        n = t.dtype.itemsize
        for axis, (ch, d) in enumerate(zip(s, t.shape)):
            window = spec.windows.get((i, axis)) if side == 0 else None
            if ch != "." and window is not None:
                n *= _widest_slab(window, np_.letters[ch], d)
            else:
                n *= d if ch == "." or d != np_.sizes.get(ch) else max(np_.letters[ch])
        totals[side] += n
    return totals[0], totals[1]


def _widest_slab(window, chunks: tuple[int, ...], size: int) -> int:
    """The longest input slab (clipped to ``size``) a halo read takes over the tiles."""
    widest, lo = 0, 0
    for c in chunks:
        start, stop = window(lo, lo + c)
        widest = max(widest, min(stop, size) - max(start, 0))
        lo += c
    return max(widest, 1)
