"""Small ONNX models built with ``onnx.helper`` for the graph-stage tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64


def vi(name: str, dims: Sequence[int | str] | None, elem: int = F32) -> onnx.ValueInfoProto:
    """A tensor value info; ``None`` dims leave the shape unknown."""
    return helper.make_tensor_value_info(name, elem, None if dims is None else list(dims))


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Mapping[str, np.ndarray] | None = None,
    *,
    opset: int = 21,
    extra_opsets: Mapping[str, int] | None = None,
    check: bool = True,
) -> onnx.ModelProto:
    """A model over ``nodes`` with the default-domain ``opset`` (checked unless told not)."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(list(nodes), "test", list(inputs), list(outputs), inits)
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="dfdl-tests")
    model.ir_version = helper.find_min_ir_version_for(opsets, ignore_unknown=True)
    if check:
        onnx.checker.check_model(model)
    return model


def set_location(model: onnx.ModelProto, location: str) -> onnx.ModelProto:
    """Point every external-data initializer of ``model`` at ``location`` (in place)."""
    for t in model.graph.initializer:
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = location
    return model


def plan_sources(plan, feeds: Mapping[str, np.ndarray] | None = None) -> dict:
    """Source tiles (numpy arrays) for ``dfdl.taskgraph.lower.lower``: inputs and read constants.

    Inputs missing from ``feeds`` are zeros of their planned type.
    """
    from dfdl.taskgraph.lower import split_tiles

    graph = plan.graph
    read = {i for n in graph.nodes for i in n.inputs if i}
    out = {}
    for name in [*graph.inputs, *graph.initializers]:
        if name not in read:
            continue
        if name in graph.initializers:
            value = graph.initializers[name]
        elif feeds is not None and name in feeds:
            value = feeds[name]
        else:
            t = graph.types[name]
            value = np.zeros(t.shape, t.dtype)
        out[name] = split_tiles(np.asarray(value), plan.chunks[name])
    return out
