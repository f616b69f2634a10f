"""dfdl.ir.torch_folds: what torch's optimizing exporter folded, undone from its metadata.

The synthetic files carry the metadata torch's exporter writes (parameter marks, program
nodes, module scopes, folded_from lists) on a few nodes each; the last tests export a
real network with torch and train it against PyTorch.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dfdl
import dfdl.models
from dfdl.ir.onnx_io import exporter_constants, exporter_folded
from dfdl.ir.torch_folds import (
    FOLDED_FROM,
    FX_NODE,
    NAME_SCOPES,
    ORIGINAL_NAME,
    RULE_NAME,
    TORCH_INPUT_KIND,
    is_state_name,
    unfold,
    unfolded,
)

F32 = np.float32


def _meta(proto, **props) -> None:
    for k, v in props.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = k, v


def _node(op, inputs, outputs, fx="", scopes=(), rule="", **attrs):
    """A node with the program node ``fx`` read and module ``scopes`` (outermost first)."""
    node = helper.make_node(op, inputs, outputs, name=f"node_{outputs[0]}", **attrs)
    props = {FX_NODE: fx, NAME_SCOPES: repr(["", *scopes, outputs[0]])}
    if rule:
        props[RULE_NAME] = rule
    _meta(node, **props)
    return node


def _param(name: str, shape) -> onnx.ValueInfoProto:
    vi = helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))
    program = "p_" + name.replace(".", "_").lower()
    _meta(vi, **{TORCH_INPUT_KIND: "PARAMETER", ORIGINAL_NAME: program})
    return vi


def _folded(name: str, shape, sources) -> onnx.ValueInfoProto:
    vi = helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))
    _meta(vi, **{FOLDED_FROM: repr(list(sources))})
    return vi


def _model(nodes, inits: dict, value_info, x_shape, y_shape) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))
    _meta(x, **{TORCH_INPUT_KIND: "USER_INPUT"})
    graph = helper.make_graph(
        nodes,
        "g",
        [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
        value_info=value_info,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _layer_norms(shared_module: bool) -> onnx.ModelProto:
    """Two LayerNorms reading ``a.ln``'s scale and shift; the second's program node read
    ``b.ln``'s (merged by the optimizer), or (``shared_module``) ``a.ln``'s too."""
    second = "a.ln" if shared_module else "b.ln"
    p2 = second.replace(".", "_")
    nodes = [
        _node(
            "LayerNormalization",
            ["x", "a.ln.weight", "a.ln.bias"],
            ["h"],
            fx="%h = call_function[target=aten.layer_norm](args = (%x, [4], %p_a_ln_weight, "
            "%p_a_ln_bias, 1e-05))",
            scopes=("a", "a.ln"),
        ),
        _node(
            "LayerNormalization",
            ["h", "a.ln.weight", "a.ln.bias"],
            ["y"],
            fx=f"%y = call_function[target=aten.layer_norm](args = (%h, [4], %p_{p2}_weight, "
            f"%p_{p2}_bias, 1e-05))",
            scopes=(second.split(".")[0], second),
        ),
    ]
    inits = {"a.ln.weight": np.ones(4, F32), "a.ln.bias": np.zeros(4, F32)}
    vis = [_param("a.ln.weight", [4]), _param("a.ln.bias", [4])]
    return _model(nodes, inits, vis, [2, 4], [2, 4])


def test_merged_parameters_get_their_own_copy_named_as_in_pytorch():
    model = _layer_norms(shared_module=False)
    out = unfold(model)
    second = out.graph.node[1]
    assert list(second.input[1:]) == ["b.ln.weight", "b.ln.bias"]
    assert list(out.graph.node[0].input[1:]) == ["a.ln.weight", "a.ln.bias"]
    inits = _inits(out)
    np.testing.assert_array_equal(inits["b.ln.weight"], np.ones(4, F32))
    assert unfolded(out)["b.ln.weight"] == "untied: from a.ln.weight"
    assert len(model.graph.initializer) == 2  # the file given is left as it was
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(F32)
    np.testing.assert_array_equal(_ort(out, x), _ort(model, x))


def test_a_module_applied_twice_keeps_its_one_parameter():
    model = _layer_norms(shared_module=True)
    assert unfold(model) is model


def test_files_without_torch_marks_are_returned_as_they_are():
    model = dfdl.models.mlp((4, 3))
    assert unfold(model) is model


def _linear_parts(weight_name: str = "val_3", tie: bool = False) -> onnx.ModelProto:
    """``y = Gemm(MatMul(x, W^T) + b, head)``: W stored transposed as ``val_3`` (folded
    from ``lin.weight``; with ``tie``, ``lin.weight`` is also read by a Gather), b merged
    into nothing, and the head's zero bias dropped by the rewriter."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 4)).astype(F32)  # PyTorch's (out, in)
    head = rng.standard_normal((2, 3)).astype(F32)
    linear = "%h = call_function[target=torch.ops.aten.linear.default](args = (%x, %p_lin_weight))"
    nodes = [
        _node("MatMul", ["x", weight_name], ["h"], fx=linear, scopes=("lin",)),
        _node(
            "Gemm",
            ["h", "head.weight"],
            ["y"],
            fx="%y = call_function[target=aten.linear](args = (%h, %p_head_weight, %p_head_bias))",
            scopes=("head",),
            rule="RemoveOptionalBiasFromGemm",
            transB=1,
        ),
    ]
    inits = {weight_name: w.T.copy(), "head.weight": head}
    vis = [_param("head.weight", [2, 3]), _folded(weight_name, [4, 3], ["lin.weight"])]
    if tie:
        inits["lin.weight"] = w
        vis.append(_param("lin.weight", [3, 4]))
        nodes.append(helper.make_node("Gather", ["lin.weight", "idx"], ["g"], name="emb"))
        inits["idx"] = np.zeros(1, np.int64)
    return _model(nodes, inits, vis, [2, 4], [2, 2])


def test_a_transposed_weight_is_stored_as_pytorchs_and_a_dropped_bias_restored():
    model = _linear_parts()
    assert exporter_folded(model) == ["val_3"]
    out = unfold(model)
    inits = _inits(out)
    assert "val_3" not in inits
    np.testing.assert_array_equal(inits["lin.weight"], _inits(model)["val_3"].T)
    transpose = out.graph.node[0]
    assert (transpose.op_type, list(transpose.input), list(transpose.output)) == (
        "Transpose",
        ["lin.weight"],
        ["val_3"],
    )
    np.testing.assert_array_equal(inits["head.bias"], np.zeros(2, F32))
    assert list(out.graph.node[2].input) == ["h", "head.weight", "head.bias"]
    assert exporter_folded(out) == []
    x = np.random.default_rng(2).standard_normal((2, 4)).astype(F32)
    np.testing.assert_allclose(_ort(out, x), _ort(model, x), rtol=1e-6)


def test_a_transposed_copy_of_a_parameter_in_the_file_reads_that_parameter():
    # GPT-2's tied head: the embedding reads lin.weight, the head a folded transpose
    out = unfold(_linear_parts(tie=True))
    assert "val_3" not in _inits(out)
    assert [n.input[0] for n in out.graph.node if n.op_type == "Transpose"] == ["lin.weight"]
    assert unfolded(out)["val_3"] == "transposed: reads lin.weight"


def test_a_transposed_copy_that_is_not_the_parameters_transpose_is_left():
    model = _linear_parts(tie=True)
    val = next(t for t in model.graph.initializer if t.name == "val_3")
    val.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(val) + 1, "val_3"))
    assert "val_3" in _inits(unfold(model))


def _expanded(token: np.ndarray, name: str = "expand", sources=("token", "val_6")):
    """``y = Concat(token expanded to the batch of 3, x)``, the expansion folded."""
    batch = np.broadcast_to(token, (3, 1, 4)).copy()
    nodes = [_node("Concat", [name, "x"], ["y"], fx="%y = cat([%expand, %x], 1)", axis=1)]
    return _model(nodes, {name: batch}, [_folded(name, [3, 1, 4], sources)], [3, 2, 4], [3, 3, 4])


@pytest.mark.parametrize("value", ["random", "zeros"])
def test_an_expanded_parameter_is_stored_once_behind_an_expand(value):
    token = np.zeros((1, 1, 4), F32)
    if value == "random":
        token = np.random.default_rng(3).standard_normal((1, 1, 4)).astype(F32)
    model = _expanded(token)
    out = unfold(model)
    inits = _inits(out)
    # only the leading (batch) axis is folded back, even where the token is all zeros
    np.testing.assert_array_equal(inits["token"], token)
    assert "expand" not in inits
    assert out.graph.node[0].op_type == "Expand"
    assert unfolded(out)["token"] == "expanded: to (3, 1, 4), was expand"
    x = np.random.default_rng(4).standard_normal((3, 2, 4)).astype(F32)
    np.testing.assert_array_equal(_ort(out, x), _ort(model, x))


def test_an_expanded_value_from_several_sources_keeps_a_name_of_its_own():
    token = np.random.default_rng(5).standard_normal((1, 1, 4)).astype(F32)
    out = unfold(_expanded(token, "embedding_1", ("expand", "emb.weight", "emb.ids")))
    assert "embedding_1__once" in _inits(out)


def test_distinct_entries_train_as_they_are_and_repeated_ones_are_reported():
    rows = np.random.default_rng(6).standard_normal((1, 3, 4)).astype(F32)
    for value, left in ((rows, []), (np.zeros_like(rows), ["embedding_1"])):
        nodes = [_node("Add", ["x", "embedding_1"], ["y"], fx="%y = add(%x, %embedding_1)")]
        vis = [_folded("embedding_1", [1, 3, 4], ["pos.weight", "arange", "val_2"])]
        out = unfold(_model(nodes, {"embedding_1": value}, vis, [2, 3, 4], [2, 3, 4]))
        assert exporter_folded(out) == left
        assert ("embedding_1" in unfolded(out)) == (not left)


def test_values_folded_from_program_nodes_alone_are_constants():
    nodes = [_node("Add", ["x", "val_9"], ["y"], fx="%y = add(%x, %mask)")]
    vis = [_folded("val_9", [2, 4], ["arange_2", "ge", "unsqueeze_6", "val_3"])]
    model = _model(nodes, {"val_9": np.zeros((2, 4), F32)}, vis, [2, 4], [2, 4])
    assert exporter_constants(model) == ["val_9"]
    assert exporter_folded(model) == []


def test_state_names_are_told_from_program_nodes():
    assert [is_state_name(n) for n in ("class_token", "emb.weight", "cls")] == [True] * 3
    names = ("arange_2", "val_12", "expand", "convert_element_type_default", "bitwise_and_1")
    assert [is_state_name(n) for n in names] == [False] * 5


# ------------------------------------------------------------------ torch's own exports


def _torch_net():
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        """A class token, two fresh LayerNorms, a Linear with a zero bias, a head."""

        def __init__(self):
            super().__init__()
            self.token = torch.nn.Parameter(torch.randn(1, 1, 8) * 0.1)
            self.ln1 = torch.nn.LayerNorm(8)
            self.lin = torch.nn.Linear(8, 8)
            torch.nn.init.zeros_(self.lin.bias)
            self.ln2 = torch.nn.LayerNorm(8)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, x):
            h = torch.cat([self.token.expand(x.shape[0], -1, -1), x], 1)
            h = self.ln2(torch.relu(self.lin(self.ln1(h))))
            return self.head(h[:, 0])

    torch.manual_seed(0)
    return torch, Net()


def _export(torch, net, x, optimize: bool = True) -> onnx.ModelProto:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net.eval(), (torch.from_numpy(x),), buf, dynamo=True, optimize=optimize)
    return onnx.load_from_string(buf.getvalue())


def test_torchs_default_export_unfolds_to_pytorchs_parameters():
    torch, net = _torch_net()
    x = np.random.default_rng(7).standard_normal((4, 5, 8)).astype(F32)
    model = _export(torch, net, x)
    assert len(exporter_folded(model)) == 2  # the expanded token and the transposed weight
    out = unfold(model)
    assert exporter_folded(out) == []
    names = {t.name for t in out.graph.initializer}
    assert {n for n, _ in net.named_parameters()} <= names
    np.testing.assert_allclose(_ort(out, x), _ort(model, x), rtol=1e-6, atol=1e-7)


def test_a_default_export_trains_as_pytorch_does(client):
    torch, net = _torch_net()
    rng = np.random.default_rng(8)
    X = rng.standard_normal((8, 5, 8)).astype(F32)
    y = rng.integers(0, 3, 8)
    model = _export(torch, net, X[:4])
    with warnings.catch_warnings():
        warnings.simplefilter("error", dfdl.errors.FoldedParametersWarning)
        result = dfdl.train(
            model,
            (X, y),
            loss="cross_entropy",
            optimizer=dfdl.optim.SGD(lr=0.1),
            batch_size=4,
            epochs=1,
            shuffle=False,
            client=client,
            progress=False,
        )
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    losses = []
    for k in range(2):
        opt.zero_grad()
        out = net(torch.from_numpy(X[4 * k : 4 * k + 4]))
        loss = torch.nn.functional.cross_entropy(out, torch.from_numpy(y[4 * k : 4 * k + 4]))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    np.testing.assert_allclose(result.history["loss"], losses, rtol=1e-5)
    trained = dict(net.named_parameters())
    for name in ("token", "ln1.weight", "ln2.weight", "ln2.bias", "lin.bias", "lin.weight"):
        np.testing.assert_allclose(
            result.params[name], trained[name].detach().numpy(), rtol=1e-4, atol=1e-6
        )
