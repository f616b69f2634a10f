"""Sequence ops (SplitToSequence, SequenceAt, ConcatFromSequence, ...) rewritten into tensor
ops at bind time: results against onnx's ReferenceEvaluator, no sequence op left for the
tiler, clear errors where a length is not static, and a torch export with
``torch.chunk``/``torch.split`` (``optimize=False``) that runs and trains."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import dfdl
from dfdl.api import feed_types
from dfdl.errors import ModelError, UnsupportedOpError
from dfdl.ir.bind import bind, unsupported_ops
from dfdl.ir.sequences import SEQUENCE_OPS
from tests.ir.helpers import F32, I64, make_model, vi

X = np.random.default_rng(0).standard_normal((2, 7, 3)).astype(np.float32)


def _i(*v) -> np.ndarray:
    return np.array(v, np.int64)


def _scalar(v: int) -> np.ndarray:
    return np.array(v, np.int64)


def node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, name=f"{op}_{outs[0]}", **attrs)


def model(nodes, outputs, inits=None, inputs=("x",), feeds=None):
    """A checked model; its outputs typed from onnx's ReferenceEvaluator on ``feeds``
    (``{"x": X}`` by default), or declared float and of unknown shape where
    ``outputs`` maps names to ranks (models the reference cannot run)."""
    ins = [vi("x", X.shape)] + [vi(n, [], I64) for n in inputs[1:]]
    if isinstance(outputs, dict):
        outs = [vi(o, ["d"] * rank) for o, rank in outputs.items()]
    else:
        untyped = make_model(nodes, ins, [vi(o, None) for o in outputs], inits, check=False)
        want = _reference(untyped, feeds or {"x": X})
        outs = [
            helper.make_tensor_value_info(
                o, helper.np_dtype_to_tensor_dtype(w.dtype), list(np.shape(w))
            )
            for o, w in zip(outputs, want)
        ]
    return make_model(nodes, ins, outs, inits)


def _bound(m, feeds, values=True):
    graph = dfdl.load(m)
    return bind(graph, feed_types(graph, feeds), values=feeds if values else None)


def _reference(m, feeds):
    return ReferenceEvaluator(m).run(None, feeds)


#: (id, nodes, outputs, constant initializers)
CASES = [
    (
        "chunk_scalar_split_remainder",
        [
            node("SplitToSequence", ["x", "three"], ["s"], axis=1),
            node("SequenceAt", ["s", "zero"], ["a"]),
            node("SequenceAt", ["s", "minus1"], ["b"]),
            node("SequenceLength", ["s"], ["n"]),
        ],
        ["a", "b", "n"],
        {"three": _scalar(3), "zero": _scalar(0), "minus1": _scalar(-1)},
    ),
    (
        "sizes_concat_back",
        [
            node("SplitToSequence", ["x", "sizes"], ["s"], axis=-2),
            node("SequenceAt", ["s", "one"], ["a"]),
            node("Relu", ["a"], ["r"]),
            node("ConcatFromSequence", ["s"], ["c"], axis=1),
        ],
        ["r", "c"],
        {"sizes": _i(2, 4, 1), "one": _scalar(1)},
    ),
    (
        "unit_pieces_nokeepdims_stacked",
        [
            node("SplitToSequence", ["x"], ["s"], axis=2, keepdims=0),
            node("SequenceAt", ["s", "two"], ["a"]),
            node("ConcatFromSequence", ["s"], ["c"], axis=-1, new_axis=1),
            node("SequenceLength", ["s"], ["n"]),
        ],
        ["a", "c", "n"],
        {"two": _scalar(2)},
    ),
    (
        "keepdims_ignored_with_split",
        [
            node("SplitToSequence", ["x", "sizes"], ["s"], axis=0, keepdims=0),
            node("SequenceAt", ["s", "zero"], ["a"]),
        ],
        ["a"],
        {"sizes": _i(1, 1), "zero": _scalar(0)},
    ),
    (
        "construct_insert_erase",
        [
            node("Neg", ["x"], ["nx"]),
            node("SequenceEmpty", [], ["e"], dtype=TensorProto.FLOAT),
            node("SequenceInsert", ["e", "x"], ["s1"]),
            node("SequenceInsert", ["s1", "nx", "zero"], ["s2"]),
            node("SequenceConstruct", ["x", "nx", "x"], ["t"]),
            node("SequenceErase", ["t", "minus2"], ["t1"]),
            node("SequenceErase", ["t1"], ["t2"]),
            node("Identity", ["s2"], ["s3"]),
            node("SequenceAt", ["s3", "zero"], ["a"]),
            node("SequenceAt", ["t2", "zero"], ["b"]),
            node("ConcatFromSequence", ["s3"], ["c"], axis=0, new_axis=1),
            node("SequenceLength", ["t2"], ["n"]),
        ],
        ["a", "b", "c", "n"],
        {"zero": _scalar(0), "minus2": _scalar(-2)},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rewrite_matches_reference(case, client):
    _, nodes, outputs, inits = case
    m = model(nodes, outputs, inits)
    want = _reference(m, {"x": X})
    g = _bound(m, {"x": X})
    assert not [n.op_type for n in g.nodes if n.op_type in SEQUENCE_OPS]
    for tiles in (None, "uneven"):
        got = dfdl.run(m, {"x": X}, client=client, tiles=tiles)
        for name, w in zip(outputs, want):
            np.testing.assert_array_equal(got[name], w, err_msg=f"{name} at tiles={tiles}")


def test_split_and_elements_without_copies():
    """SequenceAt renames the Split's output: one Split node, no Identity between."""
    _, nodes, outputs, inits = CASES[1]
    g = _bound(model(nodes, outputs, inits), {"x": X})
    ops = [n.op_type for n in g.nodes]
    assert ops.count("Split") == 1 and "Identity" not in ops
    split = next(n for n in g.nodes if n.op_type == "Split")
    relu = next(n for n in g.nodes if n.op_type == "Relu")
    assert relu.inputs == [split.outputs[1]]
    assert g.types[split.outputs[1]].shape == (2, 4, 3)


def test_runtime_position_fed_to_run(client):
    """A position that is a graph input is taken from the values dfdl.run is given."""
    m = model(
        [node("SplitToSequence", ["x"], ["s"], axis=1), node("SequenceAt", ["s", "pos"], ["a"])],
        ["a"],
        inputs=("x", "pos"),
        feeds={"x": X, "pos": _scalar(-3)},
    )
    feeds = {"x": X, "pos": _scalar(-3)}
    got = dfdl.run(m, feeds, client=client)["a"]
    np.testing.assert_array_equal(got, _reference(m, feeds)[0])


def test_runtime_position_unknown_is_refused():
    m = model(
        [node("SplitToSequence", ["x"], ["s"], axis=1), node("SequenceAt", ["s", "pos"], ["a"])],
        {"a": 3},
        inputs=("x", "pos"),
    )
    with pytest.raises(UnsupportedOpError, match="SequenceAt_a.*position.*'pos'.*not static"):
        _bound(m, {"x": X, "pos": _scalar(0)}, values=False)


def test_runtime_split_unknown_is_refused():
    m = make_model(
        [
            node("SplitToSequence", ["x", "sizes"], ["s"], axis=1),
            node("SequenceAt", ["s", "z"], ["a"]),
        ],
        [vi("x", X.shape), vi("sizes", [2], I64)],
        [vi("a", ["d"] * 3)],
        {"z": _scalar(0)},
    )
    with pytest.raises(UnsupportedOpError, match="SplitToSequence_s.*split input") as e:
        _bound(m, {"x": X, "sizes": _i(3, 4)}, values=False)
    assert e.value.node == "SplitToSequence_s"


def test_sequence_graph_output_is_refused():
    nodes = [node("SplitToSequence", ["x"], ["s"], axis=1)]
    out = helper.make_tensor_sequence_value_info("s", F32, None)
    m = make_model(nodes, [vi("x", X.shape)], [out])
    with pytest.raises(UnsupportedOpError, match="graph output 's'.*SplitToSequence_s.*sequence"):
        _bound(m, {"x": X})


def test_other_op_reading_a_sequence_is_refused():
    nodes = [node("SplitToSequence", ["x"], ["s"], axis=1), node("Relu", ["s"], ["r"])]
    m = make_model(nodes, [vi("x", X.shape)], [vi("r", X.shape)], check=False)
    with pytest.raises(UnsupportedOpError, match="Relu_r.*reads the sequence 's'") as e:
        _bound(m, {"x": X})
    assert e.value.node == "Relu_r"


@pytest.mark.parametrize(
    ("nodes", "inits", "message"),
    [
        (
            [node("SplitToSequence", ["x"], ["s"], axis=1), node("SequenceAt", ["s", "p"], ["a"])],
            {"p": _scalar(7)},
            r"position \[7\] is out of range \[-7, 6\]",
        ),
        (
            [
                node("SplitToSequence", ["x", "p"], ["s"], axis=1),
                node("SequenceAt", ["s", "z"], ["a"]),
            ],
            {"p": _i(3, 3), "z": _scalar(0)},
            r"sizes \[3, 3\] do not add up to 7",
        ),
        (
            [
                node("SequenceEmpty", [], ["s"], dtype=TensorProto.FLOAT),
                node("ConcatFromSequence", ["s"], ["a"], axis=0),
            ],
            {},
            "the sequence is empty",
        ),
    ],
    ids=["position_out_of_range", "sizes_do_not_add_up", "concat_of_empty"],
)
def test_bad_sequences_are_model_errors(nodes, inits, message):
    with pytest.raises(ModelError, match=message):
        _bound(model(nodes, {"a": 3}, inits), {"x": X})


def test_sequence_ops_are_not_listed_as_unsupported():
    m = model(
        [
            node("SplitToSequence", ["x"], ["s"], axis=1),
            node("SequenceAt", ["s", "z"], ["a"]),
            node("Det", ["a"], ["d"]),
        ],
        {"d": 3},
        {"z": _scalar(0)},
    )
    graph = dfdl.load(m)
    assert unsupported_ops(graph.nodes) == {"Det": ["Det_d"]}
    with pytest.raises(UnsupportedOpError, match="'Det'") as e:
        bind(graph, feed_types(graph, {"x": X}))
    assert e.value.op_type == "Det"


# ---- a real torch export -----------------------------------------------------------------


def _torch_module():
    import torch

    class ChunkNet(torch.nn.Module):
        """torch.chunk (with a short last chunk), torch.split with sizes, one piece unused."""

        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 7)
            self.out = torch.nn.Linear(8, 3)

        def forward(self, x):
            a, b, c = torch.chunk(self.lin(x), 3, dim=1)  # 3, 3, 1 wide
            d, e = torch.split(x, [2, 4], dim=1)
            f, _ = torch.split(torch.tanh(self.lin(x)), [4, 3], dim=1)
            z = torch.cat([a * torch.sigmoid(b), c + d[:, :1], e + f], dim=1)
            return self.out(z)

    torch.manual_seed(0)
    return ChunkNet()


def _export(module, x):
    import torch

    with torch.no_grad():
        program = torch.onnx.export(
            module.eval(), (torch.from_numpy(x),), dynamo=True, optimize=False, verbose=False
        )
    module.train()
    return program.model_proto


def test_torch_chunk_split_export_runs_and_trains(client):
    torch = pytest.importorskip("torch", reason="the export test needs PyTorch")
    pytest.importorskip("onnxscript", reason="torch's dynamo ONNX exporter needs onnxscript")
    import onnxruntime as ort

    batch, steps, lr = 4, 3, 0.1
    rng = np.random.default_rng(3)
    X_all = rng.standard_normal((batch * steps, 6)).astype(np.float32)
    y_all = rng.integers(0, 3, size=batch * steps).astype(np.int64)
    module = _torch_module()
    m = _export(module, X_all[:batch])
    ops = {n.op_type for n in m.graph.node}
    assert {"SplitToSequence", "SequenceAt"} <= ops, sorted(ops)

    (name,) = [i.name for i in m.graph.input if i.name not in {t.name for t in m.graph.initializer}]
    feeds = {name: X_all[:batch]}
    want = ort.InferenceSession(m.SerializeToString()).run(None, feeds)[0]
    for tiles in (None, "uneven"):
        got = next(iter(dfdl.run(m, feeds, client=client, tiles=tiles).values()))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    result = dfdl.train(
        m,
        (X_all, y_all),
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=lr),
        batch_size=batch,
        epochs=1,
        shuffle=False,
        client=client,
        progress=False,
    )
    opt = torch.optim.SGD(module.parameters(), lr=lr)
    losses = []
    for k in range(steps):
        opt.zero_grad()
        xb = torch.from_numpy(X_all[k * batch : (k + 1) * batch])
        yb = torch.from_numpy(y_all[k * batch : (k + 1) * batch])
        loss = torch.nn.functional.cross_entropy(module(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    np.testing.assert_allclose(result.history["loss"], losses, rtol=1e-5)
    assert losses[-1] != losses[0]
    # the first Linear is reached only through the rewritten Splits: it trained as in torch
    for key, p in module.named_parameters():
        np.testing.assert_allclose(result.params[key], p.detach().numpy(), rtol=1e-4, atol=1e-6)
