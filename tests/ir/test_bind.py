"""Binding: symbolic dimensions from inputs, static shapes everywhere, constant folding."""

from __future__ import annotations

import tracemalloc
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import dfdl
from dfdl.api import feed_types
from dfdl.errors import MemoryPlanError, ShapeError
from dfdl.ir.bind import FOLD_LIMIT_BYTES, bind
from dfdl.models import ZOO, example_inputs
from dfdl.ops.registry import TensorType
from tests.ir.helpers import F32, I64, fill_model, make_model, vi

#: ops that only ever compute shapes or constants in these models; none may survive binding
SHAPE_PATH_OPS = {
    "Shape",
    "Size",
    "Gather",
    "Concat",
    "Constant",
    "ConstantOfShape",
    "Range",
    "Unsqueeze",
    "Squeeze",
    "CastLike",
    "Cast",
    "Expand",
}

TRANSFORMER = dict(vocab=20, d_model=16, heads=2, ff=32, layers=1, seq=6, num_classes=3)


def ort_run(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def assert_close(out: np.ndarray, ref: np.ndarray) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(ref).max())))


def bound(model, feeds, *, with_values: bool = True):
    graph = dfdl.load(model)
    return bind(graph, feed_types(graph, feeds), values=feeds if with_values else None)


def op_counts(graph) -> Counter:
    return Counter(n.op_type for n in graph.nodes)


# ---- symbolic dimensions --------------------------------------------------------------


def test_batch_and_seq_bound_from_the_input():
    model = ZOO["transformer"](**TRANSFORMER)
    graph = dfdl.load(model)
    assert graph.declared["tokens"][0] == ("batch", "seq")
    for batch, seq in [(3, 5), (1, 6), (4, 2)]:
        g = bind(graph, {"tokens": TensorType((batch, seq), np.int64)})
        assert g.types["tokens"].shape == (batch, seq)
        assert g.types["logits"] == TensorType((batch, 3), np.float32)
        assert g.types["embed"].shape == (batch, seq, 16)
        # every value the graph still computes has a static type
        for n in g.nodes:
            for o in n.present_outputs():
                assert all(isinstance(d, int) for d in g.types[o].shape), o
    # the unbound graph is left as it was
    assert not graph.types


def test_symbols_shared_between_inputs():
    nodes = [helper.make_node("Mul", ["x", "mask"], ["y"], name="masked")]
    model = make_model(
        nodes,
        [vi("x", ["batch", "seq", 4]), vi("mask", ["batch", "seq", 1])],
        [vi("y", ["batch", "seq", 4])],
    )
    graph = dfdl.load(model)
    ok = bind(
        graph, {"x": TensorType((2, 7, 4), np.float32), "mask": TensorType((2, 7, 1), np.float32)}
    )
    assert ok.types["y"].shape == (2, 7, 4)
    with pytest.raises(ShapeError, match="'seq'") as info:
        bind(
            graph,
            {"x": TensorType((2, 7, 4), np.float32), "mask": TensorType((2, 6, 1), np.float32)},
        )
    assert info.value.name == "mask" and "7" in str(info.value) and "6" in str(info.value)
    with pytest.raises(ShapeError, match="'batch'"):
        bind(
            graph,
            {"x": TensorType((2, 7, 4), np.float32), "mask": TensorType((3, 7, 1), np.float32)},
        )
    # fixed dimensions are still checked when symbols agree
    with pytest.raises(ShapeError, match="axis 2"):
        bind(
            graph,
            {"x": TensorType((2, 7, 5), np.float32), "mask": TensorType((2, 7, 1), np.float32)},
        )


def test_plan_binds_batch_size_and_dims():
    model = ZOO["transformer"](**TRANSFORMER)
    p = dfdl.plan(model, batch_size=3, dims={"seq": 4}, tiles={"batch": 1})
    assert p.graph.types["tokens"].shape == (3, 4)
    assert p.graph.types["logits"].shape == (3, 3)


def test_op_shape_error_names_the_node():
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"], name="bad_matmul")]
    model = make_model(nodes, [vi("a", ["n", 3]), vi("b", ["k", 2])], [vi("y", ["n", 2])])
    graph = dfdl.load(model)
    with pytest.raises(ShapeError, match="bad_matmul"):
        bind(graph, {"a": TensorType((4, 3), np.float32), "b": TensorType((5, 2), np.float32)})


# ---- constant folding -------------------------------------------------------------------


def shape_chain_model() -> onnx.ModelProto:
    """``x (batch, 3, 4)`` -> Reshape to ``(batch, 12)`` through a shape chain, plus
    ``x * ConstantOfShape(Shape(x)[1:]) + Cast(Range(0, Shape(x)[2], 1))``."""
    c = helper.make_tensor
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Constant", [], ["zero"], name="zero", value=c("z", I64, [], [0])),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], name="batch_dim", axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes0"], ["batch1"], name="batch_1d"),
        helper.make_node("Constant", [], ["minus1"], name="minus1", value_ints=[-1]),
        helper.make_node("Concat", ["batch1", "minus1"], ["target"], name="target", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"], name="flatten"),
        # ConstantOfShape / Range / Cast on the shape path
        helper.make_node("Shape", ["x"], ["tail"], name="tail_shape", start=1),
        helper.make_node(
            "ConstantOfShape", ["tail"], ["ones"], name="ones", value=c("v", F32, [1], [2.0])
        ),
        helper.make_node("Mul", ["x", "ones"], ["scaled"], name="scale"),
        helper.make_node("Constant", [], ["two"], name="two", value_int=2),
        helper.make_node("Gather", ["tail", "one"], ["width"], name="width"),
        helper.make_node("Range", ["start", "width", "step"], ["ramp_i"], name="ramp"),
        helper.make_node("Cast", ["ramp_i"], ["ramp"], name="ramp_f", to=TensorProto.FLOAT),
        helper.make_node("Add", ["scaled", "ramp"], ["shifted"], name="shift"),
    ]
    inits = {
        "axes0": np.array([0], np.int64),
        "one": np.array(1, np.int64),
        "start": np.array(0, np.int64),
        "step": np.array(1, np.int64),
    }
    return make_model(
        nodes,
        [vi("x", ["batch", 3, 4])],
        [vi("flat", ["batch", 12]), vi("shifted", ["batch", 3, 4])],
        inits,
    )


@pytest.mark.parametrize("with_values", [True, False])
def test_shape_chain_folds_to_compute_ops_only(with_values):
    model = shape_chain_model()
    for batch in (2, 5):
        feeds = {"x": np.arange(batch * 12, dtype=np.float32).reshape(batch, 3, 4)}
        g = bound(model, feeds, with_values=with_values)
        assert op_counts(g) == Counter({"Reshape": 1, "Mul": 1, "Add": 1})
        (reshape,) = [n for n in g.nodes if n.op_type == "Reshape"]
        assert reshape.name == "flatten" and reshape.inputs[0] == "x"
        assert g.initializers[reshape.inputs[1]].tolist() == [batch, -1]
        (mul,) = [n for n in g.nodes if n.op_type == "Mul"]
        ones = g.initializers[mul.inputs[1]]
        assert ones.shape == (3, 4) and ones.dtype == np.float32 and (ones == 2).all()
        (add,) = [n for n in g.nodes if n.op_type == "Add"]
        assert g.initializers[add.inputs[1]].tolist() == [0.0, 1.0, 2.0, 3.0]
        # nothing of the shape path is left behind, neither nodes nor constants
        assert set(g.initializers) == {reshape.inputs[1], mul.inputs[1], add.inputs[1]}
        assert g.types["flat"].shape == (batch, 12)


def test_shape_chain_runs_like_onnxruntime(client):
    model = shape_chain_model()
    feeds = {"x": np.random.default_rng(0).standard_normal((5, 3, 4)).astype(np.float32)}
    out = dfdl.run(model, feeds, client=client, tiles="uneven")
    ref = ort_run(model, feeds)
    for name in ("flat", "shifted"):
        assert_close(out[name], ref[name])


def test_values_do_not_fold_the_compute_behind_a_shape():
    """Regression: Shape(x) read before x's consumers used to turn the input x into a
    plan-time constant when ``dfdl.run`` passed the values, folding all of the model's
    compute into numpy on the client instead of tasks on the cluster."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape_first"),
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "s"], ["y"], name="reshape"),
    ]
    model = make_model(nodes, [vi("x", ["batch", 4])], [vi("y", ["batch", 4])])
    feeds = {"x": np.ones((3, 4), np.float32)}
    g = bound(model, feeds)
    assert op_counts(g) == Counter({"Relu": 1, "Reshape": 1})
    assert "x" not in g.initializers
    assert op_counts(g) == op_counts(bound(model, feeds, with_values=False))


def test_cast_like_of_a_constant_folds():
    nodes = [
        helper.make_node("CastLike", ["c", "x"], ["c_like"], name="cast_like"),
        helper.make_node("Add", ["x", "c_like"], ["y"], name="add"),
    ]
    model = make_model(
        nodes, [vi("x", ["batch", 4])], [vi("y", ["batch", 4])], {"c": np.array(1.5)}
    )
    g = bound(model, {"x": np.ones((2, 4), np.float32)})
    assert op_counts(g) == Counter({"Add": 1})
    c = g.initializers[g.nodes[0].inputs[1]]
    assert c.dtype == np.float32 and c == 1.5
    # CastLike of a runtime value stays a task
    nodes[0] = helper.make_node("CastLike", ["x", "c"], ["c_like"], name="cast_like")
    model = make_model(
        nodes, [vi("x", ["batch", 4])], [vi("y", ["batch", 4])], {"c": np.array(1.5, np.float32)}
    )
    assert op_counts(bound(model, {"x": np.ones((2, 4), np.float32)}))["CastLike"] == 1


def test_reshape_shape_fed_at_run_time_is_taken_as_constant():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")]
    model = make_model(nodes, [vi("x", [2, 6]), vi("shape", [2], I64)], [vi("y", [3, 4])])
    feeds = {"x": np.ones((2, 6), np.float32), "shape": np.array([3, 4], np.int64)}
    g = bound(model, feeds)
    assert g.types["y"].shape == (3, 4) and g.initializers["shape"].tolist() == [3, 4]


# ---- constant folding under the byte cap ----------------------------------------------------

#: a (rows, rows) float32 fill just past FOLD_LIMIT_BYTES, and one just under it
PAST_CAP, UNDER_CAP = 4100, 4000


def test_a_constant_of_shape_under_the_cap_still_folds():
    assert UNDER_CAP**2 * 4 <= FOLD_LIMIT_BYTES < PAST_CAP**2 * 4
    g = bound(fill_model(UNDER_CAP), {"x": np.ones((2, 4), np.float32)})
    assert op_counts(g) == Counter({"Mul": 1})
    (mean,) = [v for k, v in g.initializers.items() if k != "x"]
    assert mean == 0.5


def test_a_constant_of_shape_past_the_cap_is_a_task_not_a_client_array(client):
    """Past the cap, ConstantOfShape is never allocated at plan time: it becomes an Expand
    of its fill value, which the cluster computes in tiles, with onnxruntime's result."""
    model = fill_model(PAST_CAP)
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    g = bound(model, feeds)
    assert op_counts(g) == Counter({"Expand": 1, "ReduceMean": 1, "Mul": 1})
    (expand,) = [n for n in g.nodes if n.op_type == "Expand"]
    assert expand.name == "fill" and g.types["fill"] == TensorType((PAST_CAP,) * 2, np.float32)
    # only the scalar fill and the shape are constants: nothing of the fill's size
    assert max(v.nbytes for v in g.initializers.values()) <= 16
    assert g.initializers[expand.inputs[0]] == 0.5
    out = dfdl.run(model, feeds, client=client)
    assert_close(out["y"], ort_run(model, feeds)["y"])


def test_a_model_with_a_constant_of_shape_past_the_cap_trains(client):
    model = fill_model(PAST_CAP, classes=3)
    rng = np.random.default_rng(1)
    X = rng.standard_normal((8, 4)).astype(np.float32)
    y = rng.integers(0, 3, 8)
    result = dfdl.train(model, (X, y), batch_size=4, client=client, progress=False)
    assert len(result.history["loss"]) == 2 and np.isfinite(result.history["loss"]).all()


@pytest.mark.parametrize("op", ["Expand", "Tile"])
def test_expand_and_tile_of_constants_past_the_cap_stay_tasks(op):
    """Ops with tile rules on constants fold under the cap and stay nodes past it."""
    for rows, folded in ((PAST_CAP, False), (UNDER_CAP, True)):
        if op == "Expand":
            inits = {"c": np.ones((1, rows), np.float32), "arg": np.array([rows, 1], np.int64)}
        else:
            inits = {"c": np.ones((2, 2), np.float32), "arg": np.array([rows // 2] * 2, np.int64)}
        nodes = [
            helper.make_node(op, ["c", "arg"], ["big"], name="big"),
            helper.make_node("ReduceMean", ["big"], ["mean"], name="mean", keepdims=0),
            helper.make_node("Mul", ["x", "mean"], ["y"], name="scale"),
        ]
        model = make_model(nodes, [vi("x", ["batch", 4])], [vi("y", ["batch", 4])], inits)
        g = bound(model, {"x": np.ones((2, 4), np.float32)})
        assert (op_counts(g)[op] == 0) == folded
        assert max(v.nbytes for v in g.initializers.values()) < FOLD_LIMIT_BYTES


def test_range_past_the_cap_is_refused_before_it_is_made():
    """Range cannot run as a task: past the cap, a MemoryPlanError names the node, its
    shape and bytes and the cap, and the shape rule never makes the values."""
    n = FOLD_LIMIT_BYTES // 8 + 1
    nodes = [
        helper.make_node("Range", ["start", "limit", "delta"], ["ramp"], name="ramp"),
        helper.make_node("ReduceMax", ["ramp"], ["top"], name="top", keepdims=0),
        helper.make_node("Cast", ["top"], ["topf"], name="cast", to=F32),
        helper.make_node("Mul", ["x", "topf"], ["y"], name="scale"),
    ]
    inits = {
        "start": np.array(0, np.int64),
        "limit": np.array(n, np.int64),
        "delta": np.array(1, np.int64),
    }
    model = make_model(nodes, [vi("x", ["batch", 4])], [vi("y", ["batch", 4])], inits)
    tracemalloc.start()
    try:
        with pytest.raises(MemoryPlanError) as info:
            bound(model, {"x": np.ones((2, 4), np.float32)})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(info.value)
    assert "'ramp' (Range)" in msg and f"[{n}]" in msg
    assert "64.00 MiB" in msg and "constant-folding cap" in msg
    assert info.value.node == "ramp" and info.value.task_bytes == n * 8
    assert peak < FOLD_LIMIT_BYTES // 4
    # under the cap it still folds to a constant
    inits["limit"] = np.array(5, np.int64)
    model = make_model(nodes, [vi("x", ["batch", 4])], [vi("y", ["batch", 4])], inits)
    g = bound(model, {"x": np.ones((2, 4), np.float32)})
    assert op_counts(g) == Counter({"Mul": 1}) and 4.0 in g.initializers.values()


def test_a_sparse_constant_past_the_cap_is_refused_without_densifying():
    rows = PAST_CAP
    sparse = helper.make_sparse_tensor(
        helper.make_tensor("vals", F32, [1], [3.0]),
        helper.make_tensor("idx", I64, [1], [7]),
        [rows, rows],
    )
    nodes = [
        helper.make_node("Constant", [], ["table"], name="table", sparse_value=sparse),
        helper.make_node("ReduceMax", ["table"], ["top"], name="top", keepdims=0),
        helper.make_node("Mul", ["x", "top"], ["y"], name="scale"),
    ]
    model = make_model(nodes, [vi("x", ["batch", 4])], [vi("y", ["batch", 4])])
    with pytest.raises(MemoryPlanError, match=rf"'table' \(Constant\).*\[{rows}, {rows}\]"):
        bound(model, {"x": np.ones((2, 4), np.float32)})


# ---- real exports ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="torch not installed; export tests skipped")


EXPORT_CASES = {
    "resnet": dict(image_size=8, stem=4, stages=(4, 8), blocks_per_stage=1, num_classes=3),
    "transformer": TRANSFORMER,
}


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("name", EXPORT_CASES)
def test_torch_exports_bind_to_compute_graphs(torch, name, exporter, client):
    from dfdl.models.torch_twins import export, load_onnx_weights, twin

    kw = EXPORT_CASES[name]
    module = load_onnx_weights(twin(name, **kw), ZOO[name](**kw))
    (example,) = example_inputs(name, batch=2, **kw).values()
    exported = export(module, torch.from_numpy(example), exporter=exporter)
    raw = Counter(n.op_type for n in exported.graph.node)
    assert raw.keys() & {"Shape", "Constant", "Identity", "CastLike"}  # there was a chain

    feeds = example_inputs(name, batch=3, seed=1, **kw)
    g = bound(exported, feeds)
    left = op_counts(g)
    assert not (left.keys() & (SHAPE_PATH_OPS - {"Gather"})), left
    (data_input,) = feeds
    for n in g.nodes:
        if n.op_type == "Gather":  # only the token embedding: a table indexed by tokens
            assert n.inputs[0] in g.initializers and n.inputs[1] == data_input, n
    assert left["Conv" if name == "resnet" else "MatMul"] > 0
    # with or without the input values, the same compute is left for the cluster
    assert left == op_counts(bound(exported, feeds, with_values=False))
    out = dfdl.run(exported, feeds, client=client)
    assert_close(out["logits"], ort_run(exported, feeds)["logits"])
