"""Split training-mode BatchNormalization into passes that tile over batch and space.

As one op, a training-mode BatchNormalization (and ``dfdl.BatchNormalizationGrad``)
keeps the batch and spatial axes whole: every task holds one channel of every sample.
When that does not fit a worker or tiles badly, the planner asks for
:func:`split_batch_norms`, which rewrites the bound training graph in place: each
BatchNormalization becomes ``BatchNormMoments`` (a tree of per-tile moments) +
``BatchNormApply`` (keeps the node's name) + ``BatchNormRunning``, and each gradient
becomes ``BatchNormGradSums`` + ``BatchNormGradApply`` (keeps the name) +
``BatchNormGradParams`` (:mod:`dfdl.ops.batch_norm`). With ``fuse_relu`` (the default),
a normalization whose output only a Relu reads (:mod:`dfdl.training.passes.fuse_norm_relu`)
keeps that Relu inside its split ops: ``BatchNormApply`` with ``relu=1``, and the
gradient ops reading ``ReluGrad(dZ, Z)`` as they go. :func:`splittable` says whether a
node can be split.

Guarantees: the value names the rest of the graph reads do not change; the math is the
same up to the order of sums (the moments are merged per tile); keeping the Relu inside
gives bit for bit the step of separate Relu passes.

Example:
    >>> n = split_batch_norms(tg.graph)  # doctest: +SKIP

Measurements: ``docs/design/split-norm.md``, ``split-norm-relu.md``.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from dfdl.ir.graph import Graph, Node
from dfdl.ops.registry import DFDL_DOMAIN, TensorType
from dfdl.training.passes.fuse_norm_relu import FUSED, fuse_batch_norm_relu, unfuse_batch_norm_relu

#: op types whose whole-axis tasks the rewrite removes
SPLITS = ("BatchNormalization", "BatchNormalizationGrad")


def _is_training_bn(n: Node) -> bool:
    return n.op_type == "BatchNormalization" and not n.domain and n.attrs.get("training_mode")


def _is_fused(n: Node, op_type: str) -> bool:
    """Whether ``n`` is the dfdl op ``op_type`` with its first input present."""
    return n.op_type == op_type and n.domain == DFDL_DOMAIN and bool(n.inputs[0])


def _is_bn_grad(n: Node) -> bool:
    return _is_fused(n, "BatchNormalizationGrad")


def splittable(graph: Graph, node_name: str) -> bool:
    """Whether ``node_name`` is a node :func:`split_batch_norms` would rewrite (fused
    with its Relu or not: :mod:`dfdl.training.passes.fuse_norm_relu`)."""
    return any(
        n.name == node_name
        and (
            _is_training_bn(n) or _is_bn_grad(n) or (n.domain == DFDL_DOMAIN and n.op_type in FUSED)
        )
        for n in graph.nodes
    )


def split_batch_norms(graph: Graph, *, fuse_relu: bool = True) -> int:
    """Rewrite every training-mode BatchNormalization and its gradient, in place.

    Normalizations are first fused with the Relu that alone reads them
    (:mod:`dfdl.training.passes.fuse_norm_relu`), and each fused pair splits into ops that
    apply the Relu inside; ``fuse_relu=False`` expands fused pairs instead, so the Relus
    stay ops of their own (the same numbers; for comparisons).

    Returns:
        How many nodes were rewritten.
    """
    if fuse_relu:
        fuse_batch_norm_relu(graph)
    else:
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
        relu = _is_fused(n, "BatchNormalizationRelu")
        relu_grad = _is_fused(n, "BatchNormalizationReluGrad")
        if _is_training_bn(n) or relu:
            x, scale, b, mean, var = n.inputs
            m = moments_of(n, x)
            attrs = {**eps, "relu": 1} if relu else eps
            add(n, n.name, "BatchNormApply", [x, scale, b, m], [n.outputs[0]], attrs)
            stats = [*n.outputs[1:3], "", ""][:2]
            if any(stats):
                attrs = {
                    "momentum": n.attrs.get("momentum", 0.9),
                    "x_dtype": helper.np_dtype_to_tensor_dtype(graph.types[x].dtype),
                }
                add(n, f"{n.name}.running", "BatchNormRunning", [m, mean, var], stats, attrs)
            count += 1
        elif _is_bn_grad(n) or relu_grad:
            # the fused gradient's inputs are (dZ, Z, X, scale, ...): Z goes last
            z = [n.inputs[1]] if relu_grad else []
            dy, x, scale, *rest = [n.inputs[0], *n.inputs[1 + len(z) :]]
            extra = [*rest, "", ""][:2]
            m = moments_of(n, x)
            g = graph.fresh_name(f"{n.name}.sums")
            graph.types[g] = TensorType((graph.types[x].shape[1], 2), np.float64)
            add(n, f"{n.name}.sums", "BatchNormGradSums", [dy, x, m, *z], [g], eps)
            dx, ds, db = [*n.outputs, "", ""][:3]
            if dx:
                inputs = [dy, x, scale, m, g, *extra, *z]
                add(n, n.name, "BatchNormGradApply", inputs, [dx], eps)
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
