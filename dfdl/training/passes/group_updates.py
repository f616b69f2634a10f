"""Group the optimizer updates of small parameters into a few nodes per optimizer step.

Every parameter gets its own ``dfdl.SGDUpdate``/``dfdl.AdamUpdate`` node and task per
step, and a network's biases and normalization scales are dozens of updates that take
microseconds against a task's scheduling cost. :func:`group_small_updates` rewrites the
training graph, in place: the update nodes of parameters of at most :data:`GROUP_BYTES`
that share an op, attributes and per-step scalars become ``dfdl.UpdateGroup`` nodes
(:mod:`dfdl.ops.optim`) of up to :data:`GROUP_TOTAL_BYTES` of parameters each. A split
BatchNorm's running statistics updates (``dfdl.BatchNormRunning``) are grouped the same
way by :meth:`dfdl.training.graph.TrainingGraph.split_batch_norms`
(``group_running=True``).

Guarantees: groups run the same kernels member by member, so results are bit for bit
those of the ungrouped graph, and their outputs keep the members' names, so nothing
downstream changes. A group runs once all its members' gradients exist (at the end of
the backward pass) and is one whole task: where it does not fit a small worker's memory
limit, ``plan_training`` plans the ungrouped graph.

Example:
    >>> n = group_small_updates(tg.graph)  # doctest: +SKIP

Measurements: ``docs/design/group-updates.md``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection

from dfdl.ir.graph import Graph, Node
from dfdl.ops.optim import GROUPABLE
from dfdl.ops.registry import DFDL_DOMAIN

#: largest parameter (bytes) whose update joins a group: biases, normalization scales
#: and small kernels; larger updates run long enough for their task's overhead
GROUP_BYTES = 256 << 10
#: most parameter bytes in one group (its task holds each member's param, gradient,
#: state and results whole: a few times this, within the smallest workers' budgets)
GROUP_TOTAL_BYTES = 1 << 20


def group_small_updates(
    graph: Graph,
    max_bytes: int = GROUP_BYTES,
    max_total: int = GROUP_TOTAL_BYTES,
    ops: Collection[str] = ("SGDUpdate", "AdamUpdate"),
) -> int:
    """Replace the update nodes (of the op types ``ops``) of parameters of at most
    ``max_bytes`` by ``dfdl.UpdateGroup`` nodes of at most ``max_total`` parameter
    bytes, in place; returns how many update nodes were grouped.

    Example:
        >>> group_small_updates(tg.graph)  # doctest: +SKIP
        36
    """
    read = {v for n in graph.nodes for v in (*n.inputs, *n.after) if v}
    groups: dict[tuple, list[Node]] = defaultdict(list)
    for n in graph.nodes:
        if n.domain != DFDL_DOMAIN or n.op_type not in GROUPABLE or n.op_type not in ops:
            continue
        if n.after:
            continue
        if graph.types[n.inputs[0]].nbytes > max_bytes:
            continue
        if any(o in read for o in n.present_outputs()) or "" in n.outputs:
            continue  # read within the step (none are, today): keep its place
        shared = tuple(n.inputs[i] if i < len(n.inputs) else "" for i in GROUPABLE[n.op_type])
        key = (n.op_type, repr(sorted(n.attrs.items())), shared, len(n.inputs), len(n.outputs))
        groups[key].append(n)
    chunks: list[tuple[tuple, list[Node]]] = []
    for key, members in groups.items():
        total = 0
        for m in members:
            size = graph.types[m.inputs[0]].nbytes
            if not chunks or chunks[-1][0] != key or total + size > max_total:
                chunks.append((key, []))
                total = 0
            chunks[-1][1].append(m)
            total += size
    grouped: dict[int, Node | None] = {}  # id of a member -> the group (at its last member)
    taken = {n.name for n in graph.nodes}
    for (op_type, _, shared, n_inputs, _), members in chunks:
        if len(members) < 2:
            continue
        shared_at = {i: k for k, i in enumerate(GROUPABLE[op_type]) if i < n_inputs}
        names = [shared[k] for k in sorted(shared_at.values())]
        layout, arity = [], 0
        for i in range(n_inputs):
            if i in shared_at:
                layout.append(-1 - shared_at[i])
            else:
                layout.append(arity)
                arity += 1
        inputs = list(names)
        for m in members:
            inputs += [v for i, v in enumerate(m.inputs) if i not in shared_at]
        prefix = "norms" if op_type == "BatchNormRunning" else "optim"
        name = next(
            f"{prefix}.{op_type}.group{j}"
            for j in range(len(taken) + 1)
            if f"{prefix}.{op_type}.group{j}" not in taken
        )
        taken.add(name)
        node = Node(
            name,
            "UpdateGroup",
            inputs,
            [o for m in members for o in m.outputs],
            {
                **members[0].attrs,
                "update": op_type,
                "layout": layout,
                "arity": arity,
                "n_shared": len(names),
            },
            DFDL_DOMAIN,
            phase=members[0].phase,
        )
        for m in members[:-1]:
            grouped[id(m)] = None
        grouped[id(members[-1])] = node
    if not grouped:
        return 0
    nodes = []
    for n in graph.nodes:
        if id(n) not in grouped:
            nodes.append(n)
        elif grouped[id(n)] is not None:
            nodes.append(grouped[id(n)])
    graph.nodes = nodes
    return len(grouped)
