"""Rewrite older-opset node forms into the latest (canonical) one ops are written for.

Ops in ``dfdl.ops`` implement the opset-21 form of each op. Models written for
opsets 13 to 20 differ only in where some parameters live (an ``axes`` attribute
that later became an input, BatchNormalization-9's training outputs);
:func:`canonicalize_node` moves them, so that no op has to know about opset versions.
The rewritten node computes what the original did under its own opset. Models older
than opset 13 reach it through ``onnx.version_converter``
(:func:`dfdl.ir.onnx_io.convert_opset`); :func:`complete_conversion` rewrites what the
converter leaves in an older form.

Example:
    >>> g = Graph(inputs=["x"], outputs=["y"])
    >>> node = Node("r", "ReduceMean", ["x"], ["y"], attrs={"axes": [1]})
    >>> canonicalize_node(node, 13, g)[0].inputs, g.initializers["r__axes"]
    (['x', 'r__axes'], array([1]))
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from dfdl.errors import ModelError
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


def _through_identities(name: str, producers: dict[str, Node]) -> str:
    """The value ``name`` copies through a chain of Identity nodes (itself if none)."""
    while name in producers and producers[name].op_type == "Identity":
        name = producers[name].inputs[0]
    return name


def untie_running_statistics(graph: Graph) -> list[str]:
    """Give each BatchNormalization running statistic that an exporter aliased to another
    initializer its own copy, in place; returns the statistics untied.

    TorchScript's exporter stores equal initializers once: a freshly initialized
    BatchNorm's running mean (zeros) becomes ``Identity(bias)`` and its running variance
    (ones) ``Identity(weight)``. Training updates the statistics and the affine
    parameters apart, so each statistic read through Identity nodes from an initializer
    becomes an initializer of its own with that value, and its Identity goes.

    Example:
        >>> g = Graph(inputs=["x"], outputs=["y"], nodes=[Node("i", "Identity", ["b"], ["m"]),
        ...     Node("bn", "BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])])
        >>> g.initializers.update(s=np.ones(2), b=np.zeros(2), v=np.ones(2))
        >>> untie_running_statistics(g), [n.name for n in g.nodes]
        (['m'], ['bn'])
    """
    producers = {o: n for n in graph.nodes for o in n.outputs}
    untied = []
    for node in graph.nodes:
        if node.op_type != "BatchNormalization" or node.domain or len(node.inputs) < 5:
            continue
        for name in node.inputs[3:5]:
            source = _through_identities(name, producers)
            if source == name or source not in graph.initializers:
                continue
            graph.initializers[name] = np.array(graph.initializers[source], copy=True)
            untied.append(name)
    for name in untied:
        if producers[name] in graph.nodes:
            graph.nodes.remove(producers[name])
    return untied


def tied_initializers(graph: Graph) -> dict[str, str]:
    """Values that are float initializers read through Identity nodes: ``{value: the
    initializer}``. Training trains each such pair as one tensor, as the file says.

    TorchScript's exporter in eval mode stores equal initializers once, so the scales
    (ones) and shifts (zeros) of a fresh network's BatchNorms of one width come out as
    one tensor and Identity copies of it, where PyTorch trains them apart.

    Example:
        >>> g = Graph(inputs=["x"], outputs=["y"], nodes=[
        ...     Node("i", "Identity", ["a.weight"], ["b.weight"]),
        ...     Node("m", "Mul", ["x", "b.weight"], ["y"])])
        >>> g.initializers["a.weight"] = np.ones(2, np.float32)
        >>> tied_initializers(g)
        {'b.weight': 'a.weight'}
    """
    producers = {o: n for n in graph.nodes for o in n.outputs}
    tied = {}
    for node in graph.nodes:
        if node.op_type != "Identity" or node.domain:
            continue
        source = _through_identities(node.inputs[0], producers)
        value = graph.initializers.get(source)
        if value is not None and value.dtype.kind == "f" and source not in graph.constants:
            tied[node.outputs[0]] = source
    return tied


def complete_conversion(model: onnx.ModelProto, version: int) -> None:
    """Rewrite, in place, what ``onnx.version_converter`` leaves in an older form when it
    converts ``model`` from default-domain opset ``version``.

    PRelu before opset 7 applies a 1-D slope of C values per channel (axis 1): PyTorch's
    ``nn.PReLU(C)``. From opset 7 the slope broadcasts numpy-style from the last axis,
    and the converter keeps the slope as it was. Each such slope (an initializer of C > 1
    values, on an input of rank > 2) is replaced by a copy of shape ``(C, 1, ..., 1)``.

    Upsample (opsets 7 to 9) and Resize-10 become Resize nodes that keep their meaning
    (:func:`_old_resizes`).

    Example:
        >>> complete_conversion(converted, 6)  # doctest: +SKIP
    """
    if version < 11:
        _old_resizes(model, version)
    if version >= 7:
        return
    prelus = [n for n in model.graph.node if n.op_type == "PRelu" and n.domain in ("", "ai.onnx")]
    inits = {t.name: t for t in model.graph.initializer}
    slopes = [n for n in prelus if n.input[1] in inits and len(inits[n.input[1]].dims) == 1]
    if not slopes:
        return
    inferred = onnx.shape_inference.infer_shapes(model).graph
    ranks = {
        vi.name: len(vi.type.tensor_type.shape.dim)
        for vi in [*inferred.input, *inferred.value_info, *inferred.output]
        if vi.type.tensor_type.HasField("shape")
    }
    taken = {*inits, *(o for n in model.graph.node for o in n.output)}
    for n in slopes:
        slope, rank = inits[n.input[1]], ranks.get(n.input[0], 0)
        if slope.dims[0] == 1 or rank <= 2:
            continue
        name = f"{slope.name}__per_channel"
        while name in taken:
            name += "_"
        taken.add(name)
        per_channel = numpy_helper.to_array(slope).reshape((-1,) + (1,) * (rank - 2))
        model.graph.initializer.append(numpy_helper.from_array(per_channel, name))
        n.input[1] = name


def _old_resizes(model: onnx.ModelProto, version: int) -> None:
    """Upsample (opsets 7 to 9) and Resize-10 sample output ``i`` at ``i / scale``
    (asymmetric), the nearest pixel rounded down when upsampling and up when downsampling
    (onnxruntime's semantics; Upsample only upsamples). The converter turns them into
    Resize nodes with the half_pixel default, which moves every linear sample: each
    Resize of the converted model gets the attributes that keep its meaning.

    Raises:
        ModelError: a Resize-10 node in mode "nearest" whose scales are not constant, or
            scale up along some axes and down along others.
    """
    consts = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        for a in n.attribute if n.op_type == "Constant" else ():
            if a.name == "value":
                consts[n.output[0]] = a.t
    for n in model.graph.node:
        if n.op_type != "Resize" or n.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if attrs.get("mode", b"nearest") == b"nearest":
            scales = consts.get(n.input[2]) if len(n.input) > 2 else None
            s = None if scales is None else numpy_helper.to_array(scales)
            if version < 10 or (s is not None and np.all(s >= 1)):
                attrs["nearest_mode"] = "floor"
            elif s is not None and np.all(s <= 1):
                attrs["nearest_mode"] = "ceil"
            else:
                raise ModelError(
                    f"Resize node {n.name!r} (opset {version}, mode nearest) rounds down "
                    "where it upsamples and up where it downsamples, which one Resize of "
                    "opset 11 or later cannot express for its scales (not constant, or up "
                    "along some axes and down along others); re-export the model at "
                    "opset 11 or newer"
                )
        attrs["coordinate_transformation_mode"] = "asymmetric"
        del n.attribute[:]
        n.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
