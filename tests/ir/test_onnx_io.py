"""ONNX in and out: path/bytes/ModelProto loading, external data, export, canonical forms."""

from __future__ import annotations

import copy
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import dfdl
from dfdl.errors import ModelError
from dfdl.ir.graph import Graph
from dfdl.ir.onnx_io import from_ir, load_model, mapped_location, tensor_bytes, to_ir
from dfdl.models import ZOO, example_inputs
from tests.ir.helpers import opset9_model, set_location

ZOO_CASES = {
    "mlp": dict(sizes=(16, 32, 5)),
    "resnet": dict(image_size=8, stem=4, stages=(4, 8), blocks_per_stage=1, num_classes=3),
    "unet3d": dict(base=2, levels=2, volume=4),
    "transformer": dict(vocab=20, d_model=16, heads=2, ff=32, layers=1, seq=6, num_classes=3),
}


def ort_run(model: onnx.ModelProto | str, feeds: dict) -> dict[str, np.ndarray]:
    src = model if isinstance(model, str) else model.SerializeToString()
    sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def assert_close(out: np.ndarray, ref: np.ndarray) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(ref).max())))


def assert_same_ir(a: Graph, b: Graph, *, same_opset: bool = True) -> None:
    assert (a.name, a.inputs, a.outputs) == (b.name, b.inputs, b.outputs)
    assert a.opset == b.opset or not same_opset
    assert a.declared == b.declared
    assert [(n.name, n.op_type, n.inputs, n.outputs, n.domain) for n in a.nodes] == [
        (n.name, n.op_type, n.inputs, n.outputs, n.domain) for n in b.nodes
    ]
    for na, nb in zip(a.nodes, b.nodes):
        assert na.attrs.keys() == nb.attrs.keys(), na.name
        for k in na.attrs:
            assert np.array_equal(np.asarray(na.attrs[k]), np.asarray(nb.attrs[k])), (na.name, k)
    assert a.initializers.keys() == b.initializers.keys()
    for k, v in a.initializers.items():
        w = b.initializers[k]
        assert v.dtype == w.dtype and np.array_equal(v, w), k


@pytest.mark.parametrize("name", ZOO_CASES)
def test_path_bytes_and_proto_give_the_same_ir(name, tmp_path):
    model = ZOO[name](**ZOO_CASES[name])
    path = tmp_path / "model.onnx"
    onnx.save_model(model, str(path))
    from_proto = dfdl.load(model)
    for other in (dfdl.load(path), dfdl.load(str(path)), dfdl.load(path.read_bytes())):
        assert_same_ir(from_proto, other)
    assert from_proto.nodes and from_proto.initializers
    # nodes keep the file's names; unnamed nodes get f"{op_type}_{i}"
    assert [n.name for n in from_proto.nodes] == [n.name for n in model.graph.node]


def test_unnamed_nodes_get_unique_names():
    model = ZOO["mlp"](sizes=(4, 4, 4))  # Gemm, Relu, Gemm
    for n in model.graph.node:
        n.name = ""
    model.graph.node[1].name = "Gemm_0"  # the name node 0 is given
    names = [n.name for n in dfdl.load(model).nodes]
    assert names == ["Gemm_0", "Gemm_0_1", "Gemm_2"]


def test_load_does_not_modify_the_proto():
    model = ZOO["transformer"](opset=17, **ZOO_CASES["transformer"])
    before = model.SerializeToString()
    dfdl.load(model)
    assert model.SerializeToString() == before


# ---- external data ----------------------------------------------------------------------


@pytest.fixture
def external(tmp_path):
    """The mlp saved as ``model/model.onnx`` + ``model/w.bin``; returns (path, proto)."""
    model = ZOO["mlp"](**ZOO_CASES["mlp"])
    folder = tmp_path / "model"
    folder.mkdir()
    path = folder / "model.onnx"
    onnx.save_model(
        copy.deepcopy(model),
        str(path),
        save_as_external_data=True,
        location="w.bin",
        size_threshold=0,
    )
    stored = onnx.load(str(path), load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in stored.graph.initializer)
    return path, model


def test_external_data_loads_and_runs(external, client):
    path, model = external
    assert_same_ir(dfdl.load(model), dfdl.load(path))
    feeds = example_inputs("mlp", batch=5, **ZOO_CASES["mlp"])
    out = dfdl.run(path, feeds, client=client, tiles={"batch": 2})
    ref = ort_run(str(path), feeds)
    assert_close(out["logits"], ref["logits"])


def test_mapped_external_data_is_not_read_until_used(external):
    path, model = external
    proto = load_model(path, map_external=True)
    graph = to_ir(proto)
    want = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for name, value in graph.initializers.items():
        assert isinstance(value, np.memmap), name
        assert not value.flags.writeable, name
        np.testing.assert_array_equal(value, want[name], err_msg=name)
    where = {t.name: mapped_location(t) for t in proto.graph.initializer}
    assert all(w is not None and Path(w[0]).is_absolute() for w in where.values())
    assert {Path(w[0]).name for w in where.values()} == {"w.bin"}


def test_mapped_external_data_that_is_too_short_is_a_model_error(external):
    path, _ = external
    proto = load_model(path, map_external=True)
    (path.parent / "w.bin").write_bytes(b"\0" * 16)  # truncated after loading
    with pytest.raises(ModelError, match=r"w.bin ends before the tensor's \d+ bytes"):
        to_ir(proto)


def test_external_data_through_a_symlink_inside_the_folder(external, client):
    path, model = external
    folder = path.parent
    (folder / "data").mkdir()
    shutil.move(folder / "w.bin", folder / "data" / "real.bin")
    os.symlink("data/real.bin", folder / "w.bin")
    assert_same_ir(dfdl.load(model), dfdl.load(path))
    os.remove(folder / "w.bin")
    os.symlink(folder / "data" / "real.bin", folder / "w.bin")  # absolute target, inside
    feeds = example_inputs("mlp", batch=3, **ZOO_CASES["mlp"])
    out = dfdl.run(path, feeds, client=client)
    assert_close(out["logits"], ort_run(model, feeds)["logits"])
    # the file on disk still names the link, not the resolved file
    stored = onnx.load(str(path), load_external_data=False)
    locations = {e.value for t in stored.graph.initializer for e in t.external_data}
    assert "w.bin" in locations


def test_external_data_through_a_symlink_outside_is_refused(external, tmp_path):
    path, _ = external
    folder = path.parent
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.move(folder / "w.bin", outside / "w.bin")
    os.symlink(outside / "w.bin", folder / "w.bin")
    with pytest.raises(ModelError, match="outside the model's folder"):
        dfdl.load(path)


def test_model_file_reached_through_a_symlinked_folder(external, tmp_path):
    """The model's folder may itself be a link: locations are relative to where it points."""
    path, model = external
    link = tmp_path / "link"
    os.symlink(path.parent, link)
    assert_same_ir(dfdl.load(model), dfdl.load(link / "model.onnx"))


def test_external_data_in_a_subfolder(tmp_path):
    model = ZOO["mlp"](**ZOO_CASES["mlp"])
    path = tmp_path / "model.onnx"
    (tmp_path / "weights").mkdir()
    onnx.save_model(
        copy.deepcopy(model),
        str(path),
        save_as_external_data=True,
        location="weights/all.bin",
        size_threshold=0,
    )
    assert_same_ir(dfdl.load(model), dfdl.load(path))
    stored = set_location(onnx.load(str(path), load_external_data=False), "weights//all.bin")
    onnx.save_model(stored, str(path))
    assert_same_ir(dfdl.load(model), dfdl.load(path))


# ---- export: from_ir(to_ir(m)) -----------------------------------------------------------


@pytest.mark.parametrize("opset", [17, 21])
@pytest.mark.parametrize("name", ZOO_CASES)
def test_from_ir_round_trip_runs_in_onnxruntime(name, opset):
    model = ZOO[name](opset=opset, **ZOO_CASES[name])
    graph = to_ir(load_model(model))
    exported = from_ir(graph)
    onnx.checker.check_model(exported, full_check=True)
    assert [i.name for i in exported.graph.input] == [i.name for i in model.graph.input]
    # symbolic input dimensions survive the round trip
    dims = exported.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch"
    assert [n.name for n in exported.graph.node] == [n.name for n in graph.nodes]
    feeds = example_inputs(name, batch=3, **ZOO_CASES[name])
    ref = ort_run(model, feeds)
    got = ort_run(exported, feeds)
    assert got.keys() == ref.keys()
    for k in ref:
        assert_close(got[k], ref[k])
    # and the exported model reads back as the same IR, in the canonical (>= 21) opset
    again = to_ir(load_model(exported))
    assert again.opset == max(21, opset)
    assert_same_ir(graph, again, same_opset=False)


def test_from_ir_static_shapes_after_bind():
    from dfdl.ir.bind import bind
    from dfdl.ops.registry import TensorType

    model = ZOO["mlp"](**ZOO_CASES["mlp"])
    bound = bind(to_ir(load_model(model)), {"x": TensorType((7, 16), np.float32)})
    exported = from_ir(bound, symbolic=False)
    onnx.checker.check_model(exported, full_check=True)
    dims = [d.dim_value for d in exported.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [7, 16]
    out_dims = [d.dim_value for d in exported.graph.output[0].type.tensor_type.shape.dim]
    assert out_dims == [7, 5]
    feeds = example_inputs("mlp", batch=7, **ZOO_CASES["mlp"])
    assert_close(ort_run(exported, feeds)["logits"], ort_run(model, feeds)["logits"])


# ---- canonical (latest-opset) forms --------------------------------------------------------


def test_opset17_transformer_canonicalizes_reduce_mean_axes():
    kw = ZOO_CASES["transformer"]
    old = ZOO["transformer"](opset=17, **kw)
    (pool_proto,) = [n for n in old.graph.node if n.op_type == "ReduceMean"]
    assert [a.name for a in pool_proto.attribute if a.name == "axes"] == ["axes"]
    assert len(pool_proto.input) == 1

    graph = dfdl.load(old)
    assert graph.opset == 17
    (pool,) = [n for n in graph.nodes if n.op_type == "ReduceMean"]
    assert "axes" not in pool.attrs
    assert len(pool.inputs) == 2
    axes = graph.initializers[pool.inputs[1]]
    assert axes.dtype == np.int64 and axes.tolist() == [1]
    # the canonical node matches the opset-21 builder's node in everything but names
    new = dfdl.load(ZOO["transformer"](opset=21, **kw))
    (pool21,) = [n for n in new.nodes if n.op_type == "ReduceMean"]
    assert pool.attrs == pool21.attrs
    # the builder writes its axes as a Constant node (constants never train)
    (const,) = [n for n in new.nodes if n.outputs == [pool21.inputs[1]]]
    assert const.op_type == "Constant"
    assert graph.initializers[pool.inputs[1]].tolist() == const.attrs["value"].tolist()


def test_opset17_transformer_runs_like_onnxruntime(client):
    kw = ZOO_CASES["transformer"]
    model = ZOO["transformer"](opset=17, **kw)
    feeds = example_inputs("transformer", batch=3, **kw)
    out = dfdl.run(model, feeds, client=client, tiles={"batch": 3})
    assert_close(out["logits"], ort_run(model, feeds)["logits"])


# ---- old opsets: converted at load ---------------------------------------------------------


def test_old_opset_model_is_converted_at_load():
    from dfdl.ir.onnx_io import MIN_OPSET, convert_opset, converted_from

    old = opset9_model()
    before = old.SerializeToString()
    model = load_model(old)
    assert old.SerializeToString() == before  # the caller's proto is not touched
    assert converted_from(model) == 9 and converted_from(old) is None
    assert {o.domain: o.version for o in model.opset_import} == {"": MIN_OPSET}
    assert model.ir_version >= 7
    assert {p.key: p.value for p in model.metadata_props} == {
        "author": "zoo",
        "dfdl.converted_from_opset": "9",
    }
    ops = [n.op_type for n in model.graph.node]
    assert "Upsample" not in ops and "Resize" in ops
    # as written, when asked
    assert load_model(old, convert=False) is old
    graph = to_ir(model)
    assert graph.opset == MIN_OPSET
    # then canonicalized as any opset-13 model: ReduceMean's axes became its input
    (pool,) = [n for n in graph.nodes if n.op_type == "ReduceMean"]
    assert "axes" not in pool.attrs and graph.initializers[pool.inputs[1]].tolist() == [2, 3]
    # to_ir converts an unconverted old proto too (callers that skip load_model)
    assert [n.op_type for n in to_ir(old).nodes] == [n.op_type for n in graph.nodes]
    # a current model is returned as is
    current = ZOO["mlp"](**ZOO_CASES["mlp"])
    assert convert_opset(current) is current and converted_from(load_model(current)) is None


def test_old_opset_model_runs_like_onnxruntime(client, tmp_path):
    model = opset9_model()
    path = tmp_path / "zoo9.onnx"
    onnx.save(model, str(path))
    x = np.random.default_rng(1).standard_normal((2, 3, 6, 6)).astype(np.float32)
    out = dfdl.run(path, {"x": x}, client=client)
    assert_close(out["y"], ort_run(model, {"x": x})["y"])


def test_prelu6_slope_stays_per_channel_after_conversion():
    """PRelu-6's slope of C values is per channel (axis 1); onnx.version_converter keeps it
    as is, though PRelu-7 broadcasts from the last axis: the converted model reshapes it."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    slope = np.array([0.1, 0.2, 0.3], np.float32)
    graph = helper.make_graph(
        [helper.make_node("PRelu", ["x", "slope"], ["y"], name="prelu")],
        "prelu6",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 4, 5])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3, 4, 5])],
        [numpy_helper.from_array(slope, "slope")],
    )
    old = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    old.ir_version = 4
    model = load_model(old)
    (node,) = model.graph.node
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert inits[node.input[1]].shape == (3, 1, 1)
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    per_channel = np.where(x > 0, x, x * slope[:, None, None])
    (y,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_array_equal(y, per_channel)
    graph = to_ir(model)
    assert graph.initializers[graph.nodes[0].inputs[1]].shape == (3, 1, 1)


def _marked_model(marks: bool):
    """w (a parameter, marked as torch's exporter marks it), a lifted scalar, a mask of
    -finfo.max and an unmarked tensor (a transposed weight)."""
    from onnx import TensorProto, helper, numpy_helper

    from dfdl.ir.onnx_io import TORCH_INPUT_KIND

    f32 = np.float32
    inits = {
        "w": np.ones((2, 2), f32),
        "half": np.asarray(0.5, f32),
        "mask": np.full((2, 2), np.finfo(f32).min, f32),
        "val_12": np.arange(4, dtype=f32).reshape(2, 2),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"]),
        helper.make_node("Mul", ["a", "half"], ["b"]),
        helper.make_node("Add", ["b", "mask"], ["c"]),
        helper.make_node("MatMul", ["c", "val_12"], ["y"]),
    ]
    vis = []
    if marks:
        vi = helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 2])
        entry = vi.metadata_props.add()
        entry.key, entry.value = TORCH_INPUT_KIND, "PARAMETER"
        vis.append(vi)
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
        value_info=vis,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_exporter_constants_are_the_unmarked_scalars_and_masks():
    from dfdl.ir.onnx_io import exporter_constants

    assert exporter_constants(_marked_model(True)) == ["half", "mask"]
    assert to_ir(_marked_model(True)).constants == {"half", "mask"}


def test_files_without_torch_marks_have_no_exporter_constants():
    from dfdl.ir.onnx_io import exporter_constants

    assert exporter_constants(_marked_model(False)) == []


def test_exporter_folded_are_the_unmarked_tensors():
    from dfdl.ir.onnx_io import exporter_folded

    assert exporter_folded(_marked_model(True)) == ["val_12"]
    # without torch's marks nothing tells a folded copy from a parameter
    assert exporter_folded(_marked_model(False)) == []


@pytest.mark.parametrize("optimize", [True, False])
def test_exporter_folded_finds_what_torchs_optimizer_folds(optimize):
    torch = pytest.importorskip("torch")
    import io

    from dfdl.ir.onnx_io import exporter_folded

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.token = torch.nn.Parameter(torch.randn(1, 1, 8))
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(torch.cat([self.token.expand(x.shape[0], -1, -1), x], 1))

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Net(), (torch.randn(2, 4, 8),), buf, dynamo=True, optimize=optimize)
    folded = exporter_folded(onnx.load_from_string(buf.getvalue()))
    # the optimizer stores the token expanded to the example's batch and the weight
    # transposed, as new initializers; without it the file holds the parameters themselves
    assert (len(folded) == 2) if optimize else (folded == []), folded


def test_tensor_bytes_counts_the_data_without_serializing(tmp_path):
    model = dfdl.models.mlp((64, 32, 10), seed=1)
    weights = sum(len(t.raw_data) for t in model.graph.initializer)
    assert tensor_bytes(model) == weights == (64 * 32 + 32 + 32 * 10 + 10) * 4
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data")
    shell = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    assert tensor_bytes(shell) < weights  # data left in the file counts nothing
    assert tensor_bytes(load_model(tmp_path / "m.onnx")) == weights
