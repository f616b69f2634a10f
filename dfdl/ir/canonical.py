"""Rewrite older-opset node forms into the latest (canonical) one ops are written for.

Ops in ``dfdl.ops`` implement the opset-21 form of each op. Models written for
opsets 13 to 20 differ only in where some parameters live (an ``axes`` attribute
that later became an input, BatchNormalization-9's training outputs);
:func:`canonicalize_node` moves them, so that no op has to know about opset versions.
The rewritten node computes what the original did under its own opset.

Example:
    >>> g = Graph("g", ["x"], ["y"], [])
    >>> node = Node("r", "ReduceMean", ["x"], ["y"], attrs={"axes": [1]})
    >>> canonicalize_node(node, 13, g)[0].inputs, g.initializers["r__axes"]
    (['x', 'r__axes'], array([1]))
"""

from __future__ import annotations

import numpy as np

from dfdl.ir.graph import Graph, Node

#: reductions whose ``axes`` attribute became input 1 at opset 18
_AXES_TO_INPUT_AT_18 = {
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
}


def canonicalize_node(node: Node, version: int, graph: Graph) -> list[Node]:
    """Return the node(s) in canonical form; may add constant initializers to ``graph``.

    Args:
        node: the node as read from the file.
        version: the opset version of the node's domain in the model.
        graph: the graph being built (receives new initializers).
    """
    if node.domain:
        return [node]
    if node.op_type in _AXES_TO_INPUT_AT_18 and version < 18:
        axes = node.attrs.pop("axes", None)
        if axes is not None:
            name = f"{node.name}__axes"
            graph.initializers[name] = np.asarray(axes, dtype=np.int64)
            node.inputs = [node.inputs[0], name]
        # the opset-18 form's attribute, at its default (what the older forms did)
        node.attrs.setdefault("noop_with_empty_axes", 0)
    if node.op_type == "Split" and version < 18 and (len(node.inputs) < 2 or not node.inputs[1]):
        # Split-13 without `split`: as many equal parts as outputs (num_outputs at 18)
        node.attrs["num_outputs"] = len(node.outputs)
    if node.op_type == "BatchNormalization" and version < 14 and len(node.outputs) > 1:
        # BatchNormalization-9: extra outputs meant training mode (saved stats dropped)
        node.attrs["training_mode"] = 1
        node.outputs = node.outputs[:3]
    return [node]
