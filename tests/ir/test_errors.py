"""Bad input fails at plan time with a named dfdl error, and no task reaches the scheduler.

Every failing ``dfdl.run(..., client=client)`` below is followed by a check that the
scheduler saw no ``update_graph`` (counted by a scheduler plugin), no task transition and
no new task, so "errors at plan time, not in a worker" is tested against a real cluster.
"""

from __future__ import annotations

import copy
import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dfdl
import dfdl.models
from dfdl.errors import DfdlError, ModelError, PlanError, ShapeError, UnsupportedOpError
from dfdl.ir.bind import bind, check_node, supported_ops
from dfdl.ir.graph import Graph, Node
from dfdl.ops.registry import TensorType
from tests import scheduler_probe
from tests.ir.helpers import make_model, set_location, unconvertible_model, vi
from tests.scheduler_probe import scheduler_state

SIZES = (4, 8, 3)

#: the probe cluster (counts submissions), overriding the session's client fixture
client = scheduler_probe.client
nothing_submitted = scheduler_probe.nothing_submitted


def run_fails(client, exc, model, inputs, *, tiles=None, match=()):
    """``dfdl.run`` raises ``exc`` (whose message contains every ``match``); returns it."""
    with pytest.raises(exc) as info:
        dfdl.run(model, inputs, client=client, tiles=tiles)
    message = str(info.value)
    for m in match:
        assert m in message, f"{m!r} not in {message!r}"
    return info.value


def x_in(batch: int = 2) -> dict[str, np.ndarray]:
    return {"x": np.ones((batch, SIZES[0]), np.float32)}


@pytest.fixture(scope="module")
def mlp():
    return dfdl.models.mlp(SIZES)


# ---- the measure itself -----------------------------------------------------------------


def test_successful_run_is_seen_by_the_measure(client, mlp):
    """Positive control: a good run does change every counter the other tests compare."""
    before = scheduler_state(client)
    out = dfdl.run(mlp, x_in(), client=client)
    assert out["logits"].shape == (2, SIZES[-1])
    after = scheduler_state(client)
    assert after["update_graph"] > before["update_graph"]
    assert after["plugin_transitions"] > before["plugin_transitions"]
    assert after["transition_counter"] > before["transition_counter"]


# ---- unreadable models ------------------------------------------------------------------


@pytest.mark.usefixtures("nothing_submitted")
def test_truncated_file(client, mlp, tmp_path):
    data = mlp.SerializeToString()
    path = tmp_path / "model.onnx"
    for cut in (1, 10, len(data) // 3, len(data) // 2, len(data) - 20, len(data) - 1):
        path.write_bytes(data[:cut])
        run_fails(client, ModelError, path, x_in(), match=[str(path)])
        run_fails(client, ModelError, data[:cut], x_in(), match=["ONNX"])


@pytest.mark.usefixtures("nothing_submitted")
def test_every_truncation_is_a_model_error(mlp):
    """Whatever the cut, a truncated model is a ModelError, never another exception."""
    data = mlp.SerializeToString()
    for cut in range(0, len(data), 7):
        with pytest.raises(ModelError):
            dfdl.load(data[:cut])


@pytest.mark.usefixtures("nothing_submitted")
def test_not_onnx_bytes_and_missing_path(client, tmp_path):
    run_fails(client, ModelError, b"this is not an ONNX model at all", x_in(), match=["ONNX"])
    missing = tmp_path / "absent.onnx"
    run_fails(client, ModelError, missing, x_in(), match=[str(missing), "does not exist"])
    run_fails(client, ModelError, str(missing), x_in(), match=["does not exist"])
    run_fails(client, ModelError, 42, x_in(), match=["int"])


@pytest.mark.usefixtures("nothing_submitted")
def test_checker_failure_names_node_and_input(client):
    node = helper.make_node("Relu", ["ghost"], ["y"], name="bad_relu")
    model = make_model([node], [vi("x", ["batch", 4])], [vi("y", ["batch", 4])], check=False)
    run_fails(client, ModelError, model, x_in(), match=["onnx.checker", "bad_relu", "ghost"])
    # the same model as bytes
    run_fails(client, ModelError, model.SerializeToString(), x_in(), match=["bad_relu"])


@pytest.mark.usefixtures("nothing_submitted")
def test_checker_failure_unknown_onnx_attribute(client):
    node = helper.make_node("Relu", ["x"], ["y"], name="relu_attr", alpha_typo=1.0)
    model = make_model([node], [vi("x", ["batch", 4])], [vi("y", ["batch", 4])], check=False)
    run_fails(client, ModelError, model, x_in(), match=["relu_attr", "alpha_typo"])


# ---- unsupported ops, domains, opsets, attributes ------------------------------------------


@pytest.mark.usefixtures("nothing_submitted")
def test_unsupported_op(client):
    node = helper.make_node("Det", ["x"], ["y"], name="det0")
    model = make_model([node], [vi("x", ["batch", 3, 3])], [vi("y", ["batch"])])
    err = run_fails(
        client,
        UnsupportedOpError,
        model,
        {"x": np.eye(3, dtype=np.float32)[None].repeat(2, 0)},
        match=["det0", "'Det'", "Supported ops:"],
    )
    assert err.op_type == "Det" and err.node == "det0" and err.domain == ""
    assert err.opset == 21
    listed = str(err).split("Supported ops:")[1]
    assert all(op in listed for op in supported_ops())
    assert {"Gemm", "Conv", "Relu", "Softmax"} <= set(supported_ops())
    assert isinstance(err, DfdlError) and isinstance(err, NotImplementedError)


@pytest.mark.usefixtures("nothing_submitted")
def test_unsupported_op_after_supported_ones_is_refused_before_any_task(client):
    """The refusal comes from planning the whole graph, not from the node reached last."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu_first"),
        helper.make_node("Det", ["r"], ["y"], name="det_last"),
    ]
    model = make_model(nodes, [vi("x", ["batch", 3, 3])], [vi("y", ["batch"])])
    err = run_fails(
        client, UnsupportedOpError, model, {"x": np.ones((2, 3, 3), np.float32)}, match=["det_last"]
    )
    assert err.node == "det_last"


@pytest.mark.usefixtures("nothing_submitted")
def test_every_unsupported_op_in_one_error(client):
    """All ops dfdl lacks (default domain, other domains, control flow) are refused in one
    error naming each op with its first nodes and their count, whatever the graph order."""
    branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["b"])], "branch", [], [vi("b", ["batch", 4])]
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu_ok"),
        helper.make_node("Frobnicate", ["r"], ["f"], name="frob0", domain="com.example"),
        *[helper.make_node("Unique", ["r"], [f"u{i}"], name=f"uniq{i}") for i in range(4)],
        helper.make_node("ReduceSum", ["x"], ["cond_f"], name="sum_all", keepdims=0),
        helper.make_node("Cast", ["cond_f"], ["cond"], name="to_bool", to=TensorProto.BOOL),
        helper.make_node(
            "If", ["cond"], ["branch_out"], name="branch", then_branch=branch, else_branch=branch
        ),
        helper.make_node("Det", ["sq"], ["d"], name="det0"),
    ]
    outputs = [vi("f", ["batch", 4]), vi("branch_out", ["batch", 4]), vi("d", [])]
    outputs += [vi(f"u{i}", ["n"]) for i in range(4)]
    model = make_model(
        nodes,
        [vi("x", ["batch", 4]), vi("sq", [3, 3])],
        outputs,
        extra_opsets={"com.example": 1},
    )
    graph = dfdl.load(model)  # loading keeps them: planning lists them all
    assert [n.op_type for n in graph.nodes][-1] == "Det"
    feeds = {**x_in(), "sq": np.eye(3, dtype=np.float32)}
    err = run_fails(
        client,
        UnsupportedOpError,
        model,
        feeds,
        match=[
            "4 ops of the model are not supported by dfdl (default-domain opset 21)",
            "'com.example.Frobnicate' (node 'frob0')",
            "'Unique' (4 nodes: 'uniq0', 'uniq1', 'uniq2' and 1 more)",
            "'If' (node 'branch')",
            "'Det' (node 'det0')",
            "If: dfdl does not support control flow",
            "Supported ops:",
        ],
    )
    assert err.ops == {
        "com.example.Frobnicate": ["frob0"],
        "Unique": ["uniq0", "uniq1", "uniq2", "uniq3"],
        "If": ["branch"],
        "Det": ["det0"],
    }
    # the fields name the first unsupported node in graph order
    assert (err.op_type, err.node, err.domain, err.opset) == (
        "Frobnicate",
        "frob0",
        "com.example",
        21,
    )


def test_old_opset_is_converted_and_runs(client):
    """An opset-11 model loads through onnx.version_converter and runs (no refusal)."""
    node = helper.make_node("Relu", ["x"], ["y"], name="relu0")
    model = make_model([node], [vi("x", ["batch", 4])], [vi("y", ["batch", 4])], opset=11)
    x = np.array([[-1, 2, -3, 4]] * 2, np.float32)
    out = dfdl.run(model, {"x": x}, client=client)
    np.testing.assert_array_equal(out["y"], np.maximum(x, 0))


@pytest.mark.usefixtures("nothing_submitted")
def test_old_opset_the_converter_cannot_convert(client):
    """Pad-1 (``paddings`` attribute) has no version_converter adapter: a ModelError naming
    the op, its nodes and what to do, instead of the converter's C++ assertion."""
    err = run_fails(
        client,
        ModelError,
        unconvertible_model(),
        {"x": np.ones((2, 4), np.float32)},
        match=[
            "from default-domain opset 1 to 13",
            "no adapter that takes Pad (2 nodes: 'pad_first', 'Pad_1') past opset 1",
            "opset_version=18",
        ],
    )
    assert "Assertion" not in str(err) and ".h:" not in str(err)


@pytest.mark.usefixtures("nothing_submitted")
def test_opset_newer_than_onnx_knows(client):
    """An opset beyond the installed onnx's newest keeps its clear refusal."""
    from dfdl.ir.onnx_io import MAX_OPSET

    node = helper.make_node("Relu", ["x"], ["y"], name="relu0")
    model = make_model(
        [node], [vi("x", ["batch", 4])], [vi("y", ["batch", 4])], opset=MAX_OPSET + 1
    )
    err = run_fails(
        client,
        UnsupportedOpError,
        model,
        x_in(),
        match=[f"opset {MAX_OPSET + 1}", f"up to {MAX_OPSET}", "Upgrade onnx"],
    )
    assert err.opset == MAX_OPSET + 1


@pytest.mark.usefixtures("nothing_submitted")
def test_unsupported_domain(client):
    node = helper.make_node("Frobnicate", ["x"], ["y"], name="frob0", domain="com.example")
    model = make_model(
        [node],
        [vi("x", ["batch", 4])],
        [vi("y", ["batch", 4])],
        extra_opsets={"com.example": 1},
    )
    err = run_fails(
        client, UnsupportedOpError, model, x_in(), match=["frob0", "Frobnicate", "com.example"]
    )
    assert (err.op_type, err.node, err.domain) == ("Frobnicate", "frob0", "com.example")


@pytest.mark.usefixtures("nothing_submitted")
def test_unsupported_attribute_value(client):
    """Valid ONNX (the checker accepts it) with an attribute value dfdl does not implement."""
    # stash_type 16 = bfloat16, a floating-point precision ONNX allows and dfdl lacks
    node = helper.make_node(
        "LayerNormalization", ["x", "scale"], ["y"], name="norm_bf16", axis=-1, stash_type=16
    )
    model = make_model(
        [node],
        [vi("x", [1, 1, 4, 4])],
        [vi("y", [1, 1, 4, 4])],
        {"scale": np.ones(4, np.float32)},
    )
    err = run_fails(
        client,
        UnsupportedOpError,
        model,
        {"x": np.ones((1, 1, 4, 4), np.float32)},
        match=["norm_bf16", "stash_type=16"],
    )
    assert err.node == "norm_bf16" and err.op_type == "LayerNormalization"


def test_attribute_not_accepted_by_the_op():
    """An attribute name dfdl's op does not take (unreachable through the ONNX checker for
    default-domain ops, so built as IR) is an UnsupportedOpError listing what it accepts."""
    node = Node("relu_extra", "Relu", ["x"], ["y"], attrs={"slope": 0.1})
    with pytest.raises(UnsupportedOpError, match="relu_extra") as info:
        check_node(node, 21)
    assert "slope" in str(info.value) and info.value.node == "relu_extra"
    graph = Graph(inputs=["x"], outputs=["y"], nodes=[node])
    graph.declared["x"] = ((2,), np.dtype(np.float32))
    with pytest.raises(UnsupportedOpError, match="slope"):
        bind(graph, {"x": TensorType((2,), np.float32)})
    gemm = Node("fc", "Gemm", ["a", "b"], ["y"], attrs={"alpha": 1.0, "transC": 1})
    with pytest.raises(UnsupportedOpError, match=r"transC.*alpha") as info:
        check_node(gemm)
    assert info.value.op_type == "Gemm"


@pytest.mark.usefixtures("nothing_submitted")
def test_reshape_of_runtime_computed_shape(client):
    """A shape computed from input *values* cannot be folded: refused naming the Reshape."""
    nodes = [
        helper.make_node("Cast", ["shape_f"], ["shape"], name="to_int", to=TensorProto.INT64),
        helper.make_node("Reshape", ["data", "shape"], ["y"], name="dyn_reshape"),
    ]
    model = make_model(nodes, [vi("data", [2, 3]), vi("shape_f", [2])], [vi("y", [3, 2])])
    feeds = {"data": np.ones((2, 3), np.float32), "shape_f": np.array([3, 2], np.float32)}
    err = run_fails(client, UnsupportedOpError, model, feeds, match=["dyn_reshape", "'shape'"])
    assert err.op_type == "Reshape" and err.node == "dyn_reshape"


# ---- inputs that do not match the model -------------------------------------------------


@pytest.mark.usefixtures("nothing_submitted")
def test_wrong_shape(client, mlp):
    err = run_fails(
        client, ShapeError, mlp, {"x": np.ones((2, 5), np.float32)}, match=["'x'", "axis 1"]
    )
    assert err.name == "x" and err.given == (2, 5)
    err = run_fails(
        client, ShapeError, mlp, {"x": np.ones((2, 4, 1), np.float32)}, match=["'x'", "rank"]
    )
    assert err.name == "x"


@pytest.mark.usefixtures("nothing_submitted")
def test_wrong_dtype(client, mlp):
    err = run_fails(
        client,
        ShapeError,
        mlp,
        {"x": np.ones((2, 4), np.float64)},
        match=["'x'", "float32", "float64"],
    )
    assert err.name == "x" and err.expected == np.float32 and err.given == np.float64
    tokens = {"tokens": np.ones((2, 8), np.int32)}
    model = dfdl.models.transformer(vocab=10, d_model=8, heads=2, ff=16, layers=1, seq=8)
    run_fails(client, ShapeError, model, tokens, match=["'tokens'", "int64", "int32"])


@pytest.mark.usefixtures("nothing_submitted")
def test_missing_and_unknown_inputs(client, mlp):
    err = run_fails(client, ShapeError, mlp, {}, match=["missing", "'x'"])
    assert err.name == "x"
    err = run_fails(client, ShapeError, mlp, {**x_in(), "y": np.ones(2)}, match=["unknown", "'y'"])
    assert err.name == "y"
    run_fails(client, ShapeError, mlp, [np.ones((2, 4), np.float32)], match=["dict", "x"])


@pytest.mark.usefixtures("nothing_submitted")
def test_bad_tiles(client, mlp):
    for tiles, what in [
        ("even", "'even'"),
        ([4, 2], "[4, 2]"),
        ({"rows": 2}, "rows"),
        ({"batch": 0}, "batch"),
        ({"batch": -1}, "batch"),
        ({"model": 2.5}, "model"),
        ({"batch": "4"}, "batch"),
    ]:
        run_fails(client, PlanError, mlp, x_in(4), tiles=tiles, match=[what])
        with pytest.raises(PlanError):
            dfdl.plan(mlp, batch_size=4, tiles=tiles)


# ---- external data outside the model's folder ---------------------------------------------


@pytest.fixture
def external_model(tmp_path, mlp):
    """``tmp/model/model.onnx`` with its weights in ``tmp/model/w.bin``; ``tmp/outside``."""
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "outside").mkdir()
    # save_model moves the weights out of the proto it is given: save a copy
    onnx.save_model(
        copy.deepcopy(mlp),
        str(folder / "model.onnx"),
        save_as_external_data=True,
        location="w.bin",
        size_threshold=0,
    )
    assert (folder / "w.bin").is_file()
    return folder / "model.onnx"


def _relocate(path, location: str) -> None:
    model = onnx.load(path, load_external_data=False)
    onnx.save_model(set_location(model, location), path)


@pytest.mark.usefixtures("nothing_submitted")
def test_external_data_absolute_path(client, external_model):
    _relocate(external_model, str(external_model.parent / "w.bin"))  # exists, but absolute
    run_fails(
        client, ModelError, external_model, x_in(), match=["layers.0.weight", "absolute path"]
    )


@pytest.mark.usefixtures("nothing_submitted")
def test_external_data_dotdot(client, external_model):
    outside = external_model.parent.parent / "outside"
    shutil.copy(external_model.parent / "w.bin", outside / "w.bin")
    for location in ("../outside/w.bin", "sub/../w.bin"):
        _relocate(external_model, location)
        run_fails(client, ModelError, external_model, x_in(), match=["layers.0.weight", "'..'"])


@pytest.mark.usefixtures("nothing_submitted")
def test_external_data_symlink_outside(client, external_model):
    folder = external_model.parent
    outside = folder.parent / "outside"
    shutil.move(folder / "w.bin", outside / "w.bin")
    os.symlink(outside / "w.bin", folder / "w.bin")  # absolute link target
    run_fails(client, ModelError, external_model, x_in(), match=["layers.0.weight", "outside"])
    os.remove(folder / "w.bin")
    os.symlink("../outside/w.bin", folder / "w.bin")  # relative link target
    run_fails(client, ModelError, external_model, x_in(), match=["layers.0.weight", "outside"])
    os.symlink(outside, folder / "data")  # a linked folder
    _relocate(external_model, "data/w.bin")
    run_fails(client, ModelError, external_model, x_in(), match=["layers.0.weight", "outside"])


@pytest.mark.usefixtures("nothing_submitted")
def test_external_data_missing_file(client, external_model):
    os.remove(external_model.parent / "w.bin")
    run_fails(client, ModelError, external_model, x_in(), match=["layers.0.weight", "w.bin"])


@pytest.mark.usefixtures("nothing_submitted")
def test_in_memory_model_with_escaping_external_data(client, external_model):
    """A ModelProto or bytes referring to external data outside the folder is refused too."""
    model = onnx.load(external_model, load_external_data=False)
    for location in (str(external_model.parent / "w.bin"), "../outside/w.bin"):
        set_location(model, location)
        run_fails(client, ModelError, model, x_in(), match=["layers.0.weight"])
        run_fails(client, ModelError, model.SerializeToString(), x_in(), match=["layers.0.weight"])


def test_errors_are_dfdl_errors():
    for exc in (ModelError, UnsupportedOpError, ShapeError, PlanError):
        assert issubclass(exc, DfdlError)
    assert issubclass(ModelError, ValueError) and issubclass(ShapeError, ValueError)


def test_plan_needs_every_symbolic_dimension():
    """``dfdl.plan`` needs every non-batch symbolic dimension: ShapeError naming it."""
    model = dfdl.models.transformer(vocab=10, d_model=8, heads=2, ff=16, layers=1, seq=8)
    with pytest.raises(ShapeError, match="'seq'") as info:
        dfdl.plan(model, batch_size=2)
    assert info.value.name == "tokens"
    with pytest.raises(ShapeError, match="'seq'"):
        dfdl.plan(model, batch_size=2, dims={"batch": 2})
    assert dfdl.plan(model, batch_size=2, dims={"seq": 8}).n_tasks() > 0
