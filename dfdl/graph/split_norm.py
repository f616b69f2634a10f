"""Split training-mode BatchNormalization into passes that tile over batch and space.

As one op, a training-mode BatchNormalization (and ``dfdl.BatchNormalizationGrad``)
keeps the batch and spatial axes whole: every task holds one channel of every sample.
When that does not fit a worker (a 3-D volume's channel alone can be hundreds of MiB),
the planner asks for this rewrite of the bound training graph: each BatchNormalization
becomes ``BatchNormMoments`` (a tree of per-tile moments) + ``BatchNormApply`` (keeps the
node's name) + ``BatchNormRunning``, and each gradient becomes ``BatchNormGradSums`` +
``BatchNormGradApply`` (keeps the name) + ``BatchNormGradParams``
(:mod:`dfdl.ops.batch_norm_split`). Value names the rest of the graph reads do not
change; the math is the same up to the order of sums.

Example:
    >>> n = split_batch_norms(tg.graph)  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from dfdl.graph.fuse_norm_relu import FUSED, unfuse_batch_norm_relu
from dfdl.graph.ir import Graph, Node
from dfdl.ops.registry import DFDL_DOMAIN, TensorType

#: op types whose whole-axis tasks the rewrite removes
SPLITS = ("BatchNormalization", "BatchNormalizationGrad")


def _is_training_bn(n: Node) -> bool:
    return n.op_type == "BatchNormalization" and not n.domain and n.attrs.get("training_mode")


def _is_bn_grad(n: Node) -> bool:
    return n.op_type == "BatchNormalizationGrad" and n.domain == DFDL_DOMAIN and bool(n.inputs[0])


def splittable(graph: Graph, node_name: str) -> bool:
    """Whether ``node_name`` is a node :func:`split_batch_norms` would rewrite (fused
    with its Relu or not: :mod:`dfdl.graph.fuse_norm_relu`)."""
    return any(
        n.name == node_name
        and (
            _is_training_bn(n) or _is_bn_grad(n) or (n.domain == DFDL_DOMAIN and n.op_type in FUSED)
        )
        for n in graph.nodes
    )


def split_batch_norms(graph: Graph) -> int:
    """Rewrite every training-mode BatchNormalization and its gradient, in place.

    Nodes fused with their Relu (:mod:`dfdl.graph.fuse_norm_relu`) are expanded first.

    Returns:
        How many nodes were rewritten.
    """
    unfuse_batch_norm_relu(graph)
    moments: dict[str, str] = {}  # X -> its moments value
    out: list[Node] = []
    count = 0

    def add(like: Node, name: str, op: str, inputs, outputs, attrs=None) -> Node:
        node = Node(
            name, op, list(inputs), list(outputs), dict(attrs or {}), DFDL_DOMAIN, like.phase,
            list(like.after),
        )  # fmt: skip
        out.append(node)
        return node

    def moments_of(like: Node, x: str) -> str:
        if x not in moments:
            m = graph.fresh_name(f"{x}.moments")
            graph.types[m] = TensorType((graph.types[x].shape[1], 3), np.float64)
            add(like, _fresh_node(graph, out, f"{like.name}.moments"), "BatchNormMoments", [x], [m])
            moments[x] = m
        return moments[x]

    for n in graph.nodes:
        eps = {"epsilon": n.attrs.get("epsilon", 1e-5)}
        if _is_training_bn(n):
            x, scale, b, mean, var = n.inputs
            m = moments_of(n, x)
            add(n, n.name, "BatchNormApply", [x, scale, b, m], [n.outputs[0]], eps)
            stats = [*n.outputs[1:3], "", ""][:2]
            if any(stats):
                attrs = {
                    "momentum": n.attrs.get("momentum", 0.9),
                    "x_dtype": helper.np_dtype_to_tensor_dtype(graph.types[x].dtype),
                }
                add(n, f"{n.name}.running", "BatchNormRunning", [m, mean, var], stats, attrs)
            count += 1
        elif _is_bn_grad(n):
            dy, x, scale = n.inputs[:3]
            extra = [*n.inputs[3:5], "", ""][:2]
            m = moments_of(n, x)
            g = graph.fresh_name(f"{n.name}.sums")
            graph.types[g] = TensorType((graph.types[x].shape[1], 2), np.float64)
            add(n, f"{n.name}.sums", "BatchNormGradSums", [dy, x, m], [g], eps)
            dx, ds, db = [*n.outputs, "", ""][:3]
            if dx:
                add(n, n.name, "BatchNormGradApply", [dy, x, scale, m, g, *extra], [dx], eps)
            if ds or db:
                add(n, f"{n.name}.params", "BatchNormGradParams", [g, scale], [ds, db])
            count += 1
        else:
            out.append(n)
    graph.nodes = out
    return count


def _fresh_node(graph: Graph, made: list[Node], base: str) -> str:
    taken = {n.name for n in graph.nodes} | {n.name for n in made}
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    return name
