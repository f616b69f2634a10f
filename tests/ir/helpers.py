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


def fill_model(rows: int, *, classes: int = 0) -> onnx.ModelProto:
    """``y = x * mean(ConstantOfShape([rows, rows], 0.5))``; with ``classes``, logits
    ``x @ w + that`` to train on."""
    value = helper.make_tensor("v", F32, [1], [0.5])
    nodes = [
        helper.make_node("ConstantOfShape", ["dims"], ["fill"], name="fill", value=value),
        helper.make_node("ReduceMean", ["fill"], ["mean"], name="mean", keepdims=0),
    ]
    inits = {"dims": np.array([rows, rows], np.int64)}
    if classes:
        inits["w"] = np.random.default_rng(0).standard_normal((4, classes)).astype(np.float32)
        nodes += [
            helper.make_node("MatMul", ["x", "w"], ["xw"], name="matmul"),
            helper.make_node("Add", ["xw", "mean"], ["y"], name="shift"),
        ]
    else:
        nodes.append(helper.make_node("Mul", ["x", "mean"], ["y"], name="scale"))
    out = ["batch", classes or 4]
    return make_model(nodes, [vi("x", ["batch", 4])], [vi("y", out)], inits)


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


def opset9_model() -> onnx.ModelProto:
    """A model-zoo-style opset-9 network: Conv, BatchNormalization-9, Upsample-9 (Resize
    since opset 10), Dropout-7 (ratio attribute), ReduceMean's axes attribute, Gemm."""
    rng = np.random.default_rng(0)
    inits = {
        "w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "scale": rng.uniform(0.5, 1.5, 4).astype(np.float32),
        "bias": rng.standard_normal(4).astype(np.float32),
        "mean": rng.standard_normal(4).astype(np.float32),
        "var": rng.uniform(0.5, 1.5, 4).astype(np.float32),
        "scales": np.array([1, 1, 2, 2], np.float32),
        "fc": rng.standard_normal((4, 5)).astype(np.float32),
        "fc_bias": rng.standard_normal(5).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"], name="bn"
        ),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("Upsample", ["r", "scales"], ["up"], name="up", mode="nearest"),
        helper.make_node("Dropout", ["up"], ["dr"], name="drop", ratio=0.3),
        helper.make_node("ReduceMean", ["dr"], ["pool"], name="pool", axes=[2, 3], keepdims=0),
        helper.make_node("Gemm", ["pool", "fc", "fc_bias"], ["y"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "zoo9",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3, 6, 6])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 5])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 4
    helper.set_model_props(model, {"author": "zoo"})
    onnx.checker.check_model(model)
    return model


def unconvertible_model() -> onnx.ModelProto:
    """An opset-1 model onnx.version_converter cannot convert: Pad-1 (its ``paddings``
    attribute) has no adapter. Two Pad nodes, the second unnamed (``Pad_1`` in dfdl)."""
    nodes = [
        helper.make_node("Pad", ["x"], ["p"], name="pad_first", paddings=[0, 1, 0, 1]),
        helper.make_node("Pad", ["p"], ["q"], paddings=[0, 1, 0, 1]),
        helper.make_node("Relu", ["q"], ["y"], name="relu0"),
    ]
    return make_model(nodes, [vi("x", [2, 4])], [vi("y", [2, 8])], opset=1)


def torch_marked_model(folded: bool):
    """``y = x @ w @ v`` as torch's exporter writes it: ``w`` marked as a parameter,
    ``v`` marked too, or (``folded``) an unmarked copy the optimizer made."""
    from dfdl.ir.onnx_io import TORCH_INPUT_KIND

    f32 = np.float32
    v_name = "val_12" if folded else "v"
    inits = [
        numpy_helper.from_array(np.eye(4, dtype=f32), "w"),
        numpy_helper.from_array(np.eye(4, dtype=f32) * 0.5, v_name),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"]),
        helper.make_node("MatMul", ["a", v_name], ["y"]),
    ]
    marked = ["w"] if folded else ["w", "v"]
    vis = []
    for name in marked:
        vi = helper.make_tensor_value_info(name, TensorProto.FLOAT, [4, 4])
        entry = vi.metadata_props.add()
        entry.key, entry.value = TORCH_INPUT_KIND, "PARAMETER"
        vis.append(vi)
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        inits,
        value_info=vis,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def token_model(vocab: int = 7, seq: int = 5) -> onnx.ModelProto:
    """A language model: tokens (N, T) -> embedding -> logits (N, T, vocab)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Gather", ["embed", "tokens"], ["h"], name="embed_lookup"),
        helper.make_node("MatMul", ["h", "head"], ["logits"], name="head_matmul"),
    ]
    inits = {
        "embed": rng.standard_normal((vocab, 6)).astype(np.float32),
        "head": rng.standard_normal((6, vocab)).astype(np.float32),
    }
    return make_model(
        nodes, [vi("tokens", ["batch", seq], I64)], [vi("logits", ["batch", seq, vocab])], inits
    )
