"""Fuse a training-mode BatchNormalization with the Relu that alone reads its output.

Unfused, ``Conv -> BatchNormalization -> Relu`` makes two passes over the activation in
each direction. :func:`fuse_batch_norm_relu` rewrites the differentiated, bound training
graph, in place, and returns the number of pairs it fused:

* ``BatchNormalization(X, ...) -> Y`` and ``Relu(Y) -> Z``, where nothing else reads
  ``Y``, become ``dfdl.BatchNormalizationRelu(X, ...) -> Z`` (the node keeps the
  BatchNormalization's name and running-statistics outputs);
* ``ReluGrad(dZ, Z) -> dY`` and ``BatchNormalizationGrad(dY, X, scale, ...)``, where
  nothing else reads ``dY``, become ``dfdl.BatchNormalizationReluGrad(dZ, Z, X, scale,
  ...)`` (keeping the gradient node's name and outputs).

Guarantees: the kernels compute the same arithmetic in one pass, so results are bit for
bit those of the unfused graph; :func:`unfuse_batch_norm_relu` undoes it. The split form
of the normalization (:mod:`dfdl.training.passes.split_norm`) fuses the same pairs first
and keeps each Relu inside its split ops.

Example:
    >>> n = fuse_batch_norm_relu(tg.graph)  # doctest: +SKIP

Measurements: ``docs/design/fuse-norm-relu.md``.
"""

from __future__ import annotations

from collections import defaultdict

from dfdl.ir.graph import Graph, Node
from dfdl.ops.registry import DFDL_DOMAIN

#: the fused op types, and the op each stands for (what split_norm rewrites)
FUSED = {
    "BatchNormalizationRelu": "BatchNormalization",
    "BatchNormalizationReluGrad": "BatchNormalizationGrad",
}


def fuse_batch_norm_relu(graph: Graph) -> int:
    """Fuse every eligible BatchNormalization/Relu pair and its gradient pair, in place.

    Returns:
        How many forward pairs were fused (their gradient pairs are fused with them
        where the backward graph has the expected shape).
    """
    readers: dict[str, list[Node]] = defaultdict(list)
    for n in graph.nodes:
        for v in {*n.inputs, *n.after}:
            if v:
                readers[v].append(n)
    producer = {o: n for n in graph.nodes for o in n.present_outputs()}
    kept = set(graph.outputs)

    def only_reader(value: str) -> Node | None:
        rs = readers.get(value, [])
        return rs[0] if len(rs) == 1 and value not in kept else None

    replace: dict[int, Node] = {}  # id of a node -> its fused replacement
    drop: set[int] = set()
    fused_x: dict[str, tuple[str, str]] = {}  # Z -> (X, scale) of its fused normalization
    for relu in graph.nodes:
        if relu.op_type != "Relu" or relu.domain or not relu.outputs[0]:
            continue
        y = relu.inputs[0]
        bn = producer.get(y)
        if (
            bn is None
            or bn.op_type != "BatchNormalization"
            or bn.domain
            or not bn.attrs.get("training_mode")
            or bn.outputs[0] != y
            or only_reader(y) is not relu
            or relu.after  # the fused node takes the BatchNormalization's place in order
        ):
            continue
        attrs = {k: bn.attrs[k] for k in ("epsilon", "momentum") if k in bn.attrs}
        z = relu.outputs[0]
        replace[id(bn)] = Node(
            bn.name,
            "BatchNormalizationRelu",
            list(bn.inputs),
            [z, *bn.outputs[1:]],
            attrs,
            DFDL_DOMAIN,
            bn.phase,
            list(bn.after),
        )
        drop.add(id(relu))
        graph.types.pop(y, None)
        fused_x[z] = (bn.inputs[0], bn.inputs[1])
    for grad in graph.nodes:
        if grad.op_type != "ReluGrad" or grad.domain != DFDL_DOMAIN:
            continue
        dz, z = grad.inputs[:2]
        if z not in fused_x or float(grad.attrs.get("alpha", 0.0)) != 0.0:
            continue
        dy = grad.outputs[0]
        bng = only_reader(dy) if dy else None
        if (
            bng is None
            or bng.op_type != "BatchNormalizationGrad"
            or bng.domain != DFDL_DOMAIN
            or bng.inputs[0] != dy
            or tuple(bng.inputs[1:3]) != fused_x[z]
        ):
            continue
        replace[id(bng)] = Node(
            bng.name,
            "BatchNormalizationReluGrad",
            [dz, z, *bng.inputs[1:]],
            list(bng.outputs),
            dict(bng.attrs),
            DFDL_DOMAIN,
            bng.phase,
            sorted({*bng.after, *grad.after}),
        )
        drop.add(id(grad))
        graph.types.pop(dy, None)
    graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in drop]
    return sum(1 for n in replace.values() if n.op_type == "BatchNormalizationRelu")


def unfuse_batch_norm_relu(graph: Graph) -> int:
    """Undo :func:`fuse_batch_norm_relu`, in place (before a rewrite that knows only the
    unfused ops, such as :func:`dfdl.training.passes.split_norm.split_batch_norms`).

    Returns:
        How many fused nodes were expanded.
    """
    out: list[Node] = []
    count = 0
    for n in graph.nodes:
        if n.domain != DFDL_DOMAIN or n.op_type not in FUSED:
            out.append(n)
            continue
        count += 1
        if n.op_type == "BatchNormalizationRelu":
            z = n.outputs[0]
            y = graph.fresh_name(f"{n.name}.y")
            graph.types[y] = graph.types[z]
            attrs = {**n.attrs, "training_mode": 1}
            out.append(Node(n.name, "BatchNormalization", list(n.inputs), [y, *n.outputs[1:]],
                            attrs, "", n.phase, list(n.after)))  # fmt: skip
            out.append(Node(f"{n.name}.relu", "Relu", [y], [z], {}, "", n.phase))
        else:
            dz, z, *rest = n.inputs
            dy = graph.fresh_name(f"{n.name}.dy")
            graph.types[dy] = graph.types[dz]
            out.append(Node(f"{n.name}.relu_grad", "ReluGrad", [dz, z], [dy], {}, DFDL_DOMAIN,
                            n.phase, list(n.after)))  # fmt: skip
            out.append(Node(n.name, "BatchNormalizationGrad", [dy, *rest], list(n.outputs),
                            dict(n.attrs), DFDL_DOMAIN, n.phase))  # fmt: skip
    graph.nodes = out
    return count
