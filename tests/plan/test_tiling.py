"""The tiling planner: chunk helpers, batch/model splits, contractions, summaries."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import helper

import dfdl
from dfdl.errors import MemoryPlanError, PlanError
from dfdl.models import ZOO
from dfdl.plan.compile import plan_graph
from dfdl.plan.tiling import (
    MIN_TILE_BYTES,
    MODEL_SPLIT_BYTES,
    REDUCE_FAN_IN,
    TASK_MEMORY_FRACTION,
    UNEVEN_MAX_TASKS,
    even_chunks,
    format_table,
    format_tiles,
    make_plan,
    uneven_chunks,
)
from tests.ir.helpers import plan_sources

MLP = (16, 32, 32, 5)

PLAN_CASES = {
    "mlp": (dict(sizes=MLP), {}),
    "resnet": (dict(image_size=8, stem=4, stages=(4, 8), blocks_per_stage=1), {}),
    "unet3d": (dict(base=2, levels=2, volume=4), {}),
    "transformer": (dict(vocab=20, d_model=16, heads=2, ff=32, layers=1, seq=6), {"seq": 6}),
}


# ---- chunk helpers ------------------------------------------------------------------------


def test_even_chunks():
    for size in range(0, 40):
        for parts in (1, 2, 3, 4, 7, 64):
            ch = even_chunks(size, parts)
            assert sum(ch) == size
            assert len(ch) == (max(1, min(parts, size)) if size else 1)
            assert max(ch) - min(ch) <= 1
            assert list(ch) == sorted(ch, reverse=True)  # larger chunks first
            assert size == 0 or min(ch) >= 1


def test_uneven_chunks():
    for size in range(0, 40):
        ch = uneven_chunks(size)
        assert sum(ch) == size
        if size < 3:
            assert ch == (size,)
            continue
        assert len(ch) >= 2 and min(ch) >= 1
        assert len(set(ch)) > 1, "the point is unequal chunks"
        assert ch[0] == max(ch) and ch[0] == (size + 1) // 2


def test_chunk_examples():
    assert uneven_chunks(3) == (2, 1)
    assert uneven_chunks(5) == (3, 1, 1)
    assert uneven_chunks(8) == (4, 2, 2)
    assert even_chunks(10, 4) == (3, 3, 2, 2)
    assert even_chunks(3, 8) == (1, 1, 1)


# ---- batch and model splits ----------------------------------------------------------------


def assert_chunks_cover_shapes(plan) -> None:
    for name, ch in plan.chunks.items():
        shape = plan.graph.types[name].shape
        assert tuple(sum(c) for c in ch) == shape, name
        assert all(len(c) >= 1 and min(c) >= 0 for c in ch), name


@pytest.fixture(scope="module")
def mlp_plan():
    return dfdl.plan(ZOO["mlp"](sizes=MLP), batch_size=16, tiles={"batch": 4, "model": 2})


def test_batch_and_model_split_on_the_mlp(mlp_plan):
    p = mlp_plan
    assert_chunks_cover_shapes(p)
    assert p.chunks["x"] == ((4, 4, 4, 4), (16,))
    for act in ("layers.0", "layers.0.relu", "layers.1", "layers.1.relu"):
        assert p.chunks[act] == ((4, 4, 4, 4), (16, 16)), act
    assert p.chunks["logits"] == ((4, 4, 4, 4), (3, 2))
    # weights (out, in): output features split 2-way; input features follow the producer
    assert p.chunks["layers.0.weight"] == ((16, 16), (16,))
    assert p.chunks["layers.1.weight"] == ((16, 16), (16, 16))
    assert p.chunks["layers.2.weight"] == ((3, 2), (16, 16))
    for i, n in enumerate((32, 32, 5)):
        assert p.chunks[f"layers.{i}.bias"] == (even_chunks(n, 2),)


def test_batch_only_and_model_only():
    model = ZOO["mlp"](sizes=MLP)
    p = dfdl.plan(model, batch_size=6, tiles={"batch": 3})
    assert p.chunks["layers.1.relu"] == ((2, 2, 2), (32,))
    assert p.chunks["layers.1.weight"] == ((32,), (32,))
    p = dfdl.plan(model, batch_size=6, tiles={"model": 4})
    assert p.chunks["layers.1.relu"] == ((6,), (8, 8, 8, 8))
    assert p.chunks["x"] == ((6,), (16,))
    p = dfdl.plan(model, batch_size=6, tiles={"batch": 1, "model": 1})
    assert all(len(c) == 1 for ch in p.chunks.values() for c in ch)
    assert p.n_tasks() == len(p.nodes)


def test_more_tiles_than_rows_are_capped():
    p = dfdl.plan(ZOO["mlp"](sizes=MLP), batch_size=3, tiles={"batch": 8})
    assert p.chunks["x"][0] == (1, 1, 1)


def test_contracted_gemm_axes_give_partials_and_sums(mlp_plan):
    p = mlp_plan
    by_name = {n.node.name: n for n in p.nodes}
    first, second = by_name["layers.0"], by_name["layers.1"]
    assert first.spec.contracted() == ["k"] and second.spec.contracted() == ["k"]
    # layer 0 reads x, whose features are not split: one product per output tile
    assert first.letters["k"] == (16,) and first.n_partials() == 1
    assert first.n_tasks() == first.n_tiles() == 4 * 2
    # layer 1 reads model-split activations: 2 partial products + 1 sum per output tile
    assert second.letters["k"] == (16, 16) and second.n_partials() == 2
    assert second.n_tasks() == 8 * (2 + 1)
    assert p.n_tasks() == sum(n.n_tasks() for n in p.nodes) == 8 + 8 + 24 + 8 + 24

    from dfdl.taskgraph.lower import lower

    dsk, _ = lower(p, plan_sources(p))
    partials = [k for k in dsk if k[0] == "layers.1-fwd-partial"]
    finals = [k for k in dsk if k[0] == "layers.1-fwd"]
    assert len(partials) == 16 and len(finals) == 8
    for k in finals:
        assert dsk[k].dependencies == {(f"{k[0]}-partial", *k[1:], c) for c in range(2)}
    assert not [k for k in dsk if k[0] == "layers.0-fwd-partial"]
    assert len(dsk) == p.n_tasks()


@pytest.mark.parametrize("parts", [2, 4, 5, 9, 16, 17])
def test_task_count_includes_the_reduction_tree(parts):
    model = ZOO["mlp"](sizes=(8, 64, 64, 4))
    p = dfdl.plan(model, batch_size=2, tiles={"model": parts})
    (np_,) = [n for n in p.nodes if n.node.name == "layers.1"]
    assert np_.n_partials() == parts
    combines, level = 0, parts
    while level > 1:
        level = math.ceil(level / REDUCE_FAN_IN)
        combines += level
    assert np_.n_tasks() == np_.n_tiles() * (parts + combines)


# ---- summary and sizes ------------------------------------------------------------------------


def test_summary_lists_every_tensor_the_task_count_and_largest_task(mlp_plan):
    p = mlp_plan
    text = p.summary()
    lines = text.splitlines()
    assert f"{p.n_tasks()} tasks" in lines[0] and f"{len(p.nodes)} nodes" in lines[0]
    name, nbytes = p.largest_task()
    assert name in lines[1] and "largest task" in lines[1]
    assert f"{nbytes / 1024:.1f} KiB" in lines[1]
    listed = {line.split()[0] for line in lines[3:]}
    assert listed == set(p.chunks)
    assert len(lines) == 3 + len(p.chunks)
    row = next(line for line in lines if line.startswith("layers.2.weight "))
    assert "[5, 32]" in row and "float32" in row and "(3,2)x2*16" in row
    assert next(line for line in lines if line.startswith("x ")).split()[-1] == "4*4x16"
    assert lines[0].endswith(", tiles batch=4,model=2")  # as --tiles takes it
    assert p.summary(tensors=False).splitlines() == lines[:2]
    assert p.tensor_table().splitlines() == lines[2:]


def test_summary_names_every_tensor_in_full():
    """A column is as wide as its longest cell: no name or shape is cut."""
    long = "encoder.block_11.attention.output.projection.bias_grad_accumulated"
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3, 4, 5, 6, 7])
    y = helper.make_tensor_value_info(long, onnx.TensorProto.FLOAT, ["batch", 3, 4, 5, 6, 7])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], [long])], "long", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    p = dfdl.plan(model, batch_size=100000)
    lines = p.tensor_table().splitlines()
    assert lines[0].split() == ["tensor", "shape", "dtype", "tiles", "chunks"]
    row = next(line for line in lines if line.startswith(long + " "))
    assert "[100000, 3, 4, 5, 6, 7]" in row  # 23 characters: the old column cut it at 22
    # the columns line up: every row's shape starts where the header's does
    assert {line.index("[") for line in lines[1:]} == {lines[0].index("shape")}
    assert all(line == line.rstrip() for line in lines)


def test_format_tiles_and_table():
    assert (
        format_tiles({"batch": 2, "model": 1, "split_norms": 1}) == "batch=2,model=1,split_norms=1"
    )
    assert format_tiles(None) == "auto" and format_tiles("uneven") == "uneven"
    assert format_table(("a", "n", "z"), [("long-name", "7", ""), ("b", "12", "x")], right={1}) == [
        "a           n  z",
        "long-name   7",
        "b          12  x",
    ]


def test_task_bytes_are_the_largest_tile_in_plus_out(mlp_plan):
    p = mlp_plan
    f = 4  # float32
    # layers.0: x tile (4, 16) + weight tile (16, 16) + bias tile (16,) + output (4, 16)
    assert p.task_bytes["layers.0"] == f * (4 * 16 + 16 * 16 + 16 + 4 * 16)
    # layers.2: x tile (4, 16) + weight tile (3, 16) + bias (3,) + output (4, 3)
    assert p.task_bytes["layers.2"] == f * (4 * 16 + 3 * 16 + 3 + 4 * 3)
    assert p.largest_task() == ("layers.0", p.task_bytes["layers.0"])
    untiled = dfdl.plan(ZOO["mlp"](sizes=MLP), batch_size=16, tiles={"batch": 1})
    assert untiled.task_bytes["layers.0"] == f * (16 * 16 + 32 * 16 + 32 + 16 * 32)
    assert untiled.largest_task()[1] > p.largest_task()[1]


def test_uneven_tiling_of_the_mlp():
    p = dfdl.plan(ZOO["mlp"](sizes=MLP), batch_size=5, tiles="uneven")
    assert_chunks_cover_shapes(p)
    assert p.chunks["layers.0"] == ((3, 1, 1), (16, 8, 8))
    assert p.chunks["logits"] == ((3, 1, 1), (3, 1, 1))


def test_uneven_tiling_stops_splitting_letters_at_the_task_cap():
    shape = (3, 5, 6, 6, 5, 3, 4)  # 3**7 = 2187 tasks if every axis split
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, shape)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    p = dfdl.plan(helper.make_model(graph), tiles="uneven")
    assert_chunks_cover_shapes(p)
    split = [c for c in p.chunks["y"] if len(c) > 1]
    assert math.prod(map(len, p.chunks["y"])) <= UNEVEN_MAX_TASKS == 243
    assert p.chunks["y"][:5] == tuple(uneven_chunks(d) for d in shape[:5])  # 3**5 tasks
    assert p.chunks["y"][5:] == ((3,), (4,)) and len(split) == 5


def test_automatic_tiles_follow_cores_and_size():
    model = ZOO["mlp"](sizes=(256, 512, 10))
    graph = dfdl.plan(model, batch_size=1024, tiles={"batch": 1}).graph
    biggest = max(t.nbytes for t in graph.types.values())
    assert biggest // MIN_TILE_BYTES >= 4
    assert make_plan(graph, None, cores=4).chunks["x"][0] == (256,) * 4
    assert make_plan(graph, None, cores=1).chunks["x"][0] == (1024,)
    tiny = dfdl.plan(ZOO["mlp"](sizes=(4, 3)), batch_size=8, workers=8)
    assert tiny.chunks["x"][0] == (8,), "tiles below MIN_TILE_BYTES are not split"


def test_automatic_tiles_split_the_model_when_weights_outweigh_activations():
    model = ZOO["mlp"](sizes=(64, 2048, 2048, 10))  # a 16 MiB weight
    for batch, cores, want in [
        (64, 2, {"batch": 1, "model": 2}),
        (64, 4, {"batch": 1, "model": 2}),  # 2 x 2 tiles of each weight
        (64, 9, {"batch": 1, "model": 3}),
        (64, 1, {"batch": 1, "model": 1}),
        (4096, 2, {"batch": 2, "model": 1}),  # 32 MiB activations: the batch splits
    ]:
        graph = dfdl.plan(model, batch_size=batch, tiles={"batch": 1}).graph
        weights = [n for n in graph.types if n.endswith((".weight", ".bias"))]
        assert max(graph.types[w].nbytes for w in weights) >= MODEL_SPLIT_BYTES
        plan = make_plan(graph, None, cores=cores, weights=weights)
        if want["model"] > 1:  # the automatic tiling keeps small weights' outputs whole
            want = {**want, "min_weight_tile": MIN_TILE_BYTES}
        assert plan.tiles == want, (batch, cores)
        assert_chunks_cover_shapes(plan)
    small = ZOO["mlp"](sizes=(64, 1024, 10))  # 4 MiB: the batch splits as before
    graph = dfdl.plan(small, batch_size=64, tiles={"batch": 1}).graph
    weights = [n for n in graph.types if n.endswith((".weight", ".bias"))]
    assert make_plan(graph, None, cores=2, weights=weights).tiles["model"] == 1


def test_automatic_model_split_keeps_a_small_weights_outputs_whole():
    model = ZOO["mlp"](sizes=(64, 2048, 2048, 10))  # 16 MiB weights, an 80 KiB head
    graph = dfdl.plan(model, batch_size=64, tiles={"batch": 1}).graph
    weights = [n for n in graph.types if n.endswith((".weight", ".bias"))]
    auto = make_plan(graph, None, cores=2, weights=weights)
    explicit = make_plan(graph, {"batch": 1, "model": 2}, cores=2, weights=weights)
    assert auto.tiles == {"batch": 1, "model": 2, "min_weight_tile": MIN_TILE_BYTES}
    for plan in (auto, explicit):
        assert plan.chunks["layers.1.weight"] == ((1024, 1024), (1024, 1024))
    assert auto.chunks["logits"] == ((64,), (10,))
    assert auto.chunks["layers.2.weight"] == ((10,), (1024, 1024))  # K still split
    assert explicit.chunks["logits"] == ((64,), (5, 5))
    assert auto.n_tasks() < explicit.n_tasks()
    # the tiles repeat the plan, and a lower bound splits the head again
    again = make_plan(graph, auto.tiles, cores=2, weights=weights)
    assert again.chunks == auto.chunks
    lower = make_plan(graph, {"batch": 1, "model": 2, "min_weight_tile": 1024}, weights=weights)
    assert lower.chunks == explicit.chunks
    with pytest.raises(PlanError, match="min_weight_tile"):
        make_plan(graph, {"batch": 1, "model": 2, "min_weight_tile": -1}, weights=weights)


@pytest.mark.parametrize("name", PLAN_CASES)
def test_plan_every_zoo_model(name):
    kw, dims = PLAN_CASES[name]
    model = ZOO[name](**kw)
    for tiles in (None, "uneven", {"batch": 2, "model": 2}):
        p = dfdl.plan(model, batch_size=4, tiles=tiles, dims=dims, workers=2)
        assert_chunks_cover_shapes(p)
        assert p.n_tasks() >= len(p.nodes) > 0
        assert set(p.graph.outputs) <= set(p.chunks)
        assert p.graph.types["logits"].shape[0] == 4
        assert p.largest_task()[1] > 0
        assert p.summary().count("\n") == 2 + len(p.chunks)
    split = dfdl.plan(model, batch_size=4, tiles={"batch": 2}, dims=dims)
    (first_input,) = split.graph.inputs
    assert split.chunks[first_input][0] == (2, 2)


def test_plan_errors():
    model = ZOO["mlp"](sizes=MLP)
    with pytest.raises(PlanError, match="unknown key"):
        dfdl.plan(model, batch_size=2, tiles={"batch": 2, "heads": 2})
    with pytest.raises(PlanError, match="positive integer"):
        dfdl.plan(model, batch_size=2, tiles={"model": np.float64(2.0)})
    # numpy integers are fine
    p = dfdl.plan(model, batch_size=4, tiles={"batch": np.int64(2)})
    assert p.chunks["x"][0] == (2, 2)


# ---- training graphs: parameters are not batch data ----------------------------------------


def _training_plan(name: str, batch: int, tiles, cores: int = 2):
    from dfdl.ir.onnx_io import to_ir
    from dfdl.ops.registry import TensorType
    from dfdl.training.graph import build_training_graph

    kw, dims = PLAN_CASES[name]
    graph = to_ir(ZOO[name](**kw))
    declared, dtype = graph.declared[graph.inputs[0]]
    shape = tuple(batch if not isinstance(d, int) else d for d in declared)
    shape = tuple(dims.get(d, d) if isinstance(d, str) else d for d in shape)
    tg = build_training_graph(
        graph,
        {graph.inputs[0]: TensorType(shape, np.dtype(dtype))},
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=0.1, momentum=0.9),
        labels=TensorType((batch,), np.dtype("int64")),
    )
    return tg, plan_graph(tg, tiles, cores=cores)


@pytest.mark.parametrize("tiles", [{"batch": 2}, {"batch": 2, "model": 1}])
def test_training_plan_splits_the_batch_not_the_weights(tiles):
    tg, plan = _training_plan("mlp", 64, tiles)
    x = tg.data[0]
    assert len(plan.chunks[x][0]) == 2
    for p in tg.carried():  # weights, momentum: one tile (model=1), not split like a batch
        assert all(len(c) == 1 for c in plan.chunks[p]), (p, plan.chunks[p])


def test_training_plan_model_split_reaches_weights_given_as_inputs():
    tg, plan = _training_plan("mlp", 64, {"batch": 1, "model": 2})
    w = next(p for p in tg.params if p.endswith("weight"))
    assert any(len(c) == 2 for c in plan.chunks[w])


def test_batch_axis_stays_split_after_a_node_that_keeps_it_whole():
    # BatchNormalization in training keeps the batch whole per channel tile; the
    # convolution after it must still run as batch tiles
    tg, plan = _training_plan("resnet", 8, {"batch": 2})
    g = tg.graph
    bn = [n for n in g.nodes if n.op_type == "BatchNormalization"]
    assert bn
    after = [
        n for n in g.nodes if n.op_type == "Conv" and any(i in bn[0].outputs for i in n.inputs)
    ]
    consumers = [n for n in g.nodes if bn[0].outputs[0] in n.inputs]
    assert consumers
    for n in consumers + after:
        out = n.outputs[0]
        if g.types[out].rank == 4:
            assert len(plan.chunks[out][0]) == 2, (n.name, plan.chunks[out])


def _whole_batch_nodes(plan):
    return [
        p
        for p in plan.nodes
        if p.node.op_type in ("BatchNormalization", "BatchNormalizationGrad")
        and (p.node.op_type != "BatchNormalization" or p.node.attrs.get("training_mode"))
    ]


@pytest.mark.parametrize(
    "batch, tiles, expected",
    [
        (8, {"batch": 2}, 2),
        (8, {"batch": 2, "model": 2}, 4),
        (8, {"batch": 1}, 1),
        (2, {"batch": 4}, 2),
    ],
)
def test_nodes_that_keep_the_batch_whole_split_their_channels_by_the_batch_tiles(
    batch, tiles, expected
):
    # a training BatchNorm (and its gradient) needs whole-batch statistics per channel:
    # its channels split as many times as the batch around it (capped by the batch
    # size), so it does not run as one task while the other threads wait
    tg, plan = _training_plan("resnet", batch, tiles)
    nodes = _whole_batch_nodes(plan)
    assert {p.node.op_type for p in nodes} == {"BatchNormalization", "BatchNormalizationGrad"}
    for p in nodes:
        assert p.grid_letters() == ["c"], p.node.name
        assert p.n_tiles() == min(expected, p.sizes["c"]), (p.node.name, p.letters)
    x = tg.data[0]
    assert len(plan.chunks[x][0]) == min(tiles["batch"], batch)


def test_weight_gradients_larger_than_their_inputs_contract_the_whole_batch():
    # dW = X^T dY of a wide layer: batch partials would each be the weight's size, more
    # bytes than both inputs; one task reads the inputs whole instead. Narrow layers
    # (the first and last here) keep their batch partials.
    import dfdl.models
    from dfdl.ir.onnx_io import to_ir
    from dfdl.ops.registry import TensorType
    from dfdl.training.graph import build_training_graph

    graph = to_ir(dfdl.models.mlp((8, 256, 256, 4)))
    tg = build_training_graph(
        graph,
        {graph.inputs[0]: TensorType((64, 8), np.dtype("float32"))},
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=0.1),
        labels=TensorType((64,), np.dtype("int64")),
    )
    plan = plan_graph(tg, {"batch": 2})
    grads = {
        p.node.name: p for p in plan.nodes if p.node.op_type == "Gemm" and p.node.phase == "bwd"
    }
    partials = {}
    for name, p in grads.items():
        if p.spec.contracted() and all(p.sizes[c] == 64 for c in p.spec.contracted()):
            partials[name] = p.n_partials()  # a weight gradient: sums over the batch
            outs = sum(plan.graph.types[o].nbytes for o in p.node.outputs if o)
            ins = sum(plan.graph.types[i].nbytes for i in p.node.inputs if i)
            assert p.n_partials() == (1 if outs > ins else 2), (name, outs, ins)
    assert sorted(partials.values()) == [1, 2, 2], partials  # 256x256 whole; 8x256, 256x4 not
    assert all(len(plan.chunks[x][0]) == 2 for x in tg.data)  # the batch itself stays split


def test_carried_tensors_take_the_chunks_of_their_next_value():
    # a step's new weights, optimizer state and running statistics feed the next step
    # as they are, with no rechunk tasks in between
    tg, plan = _training_plan("resnet", 8, {"batch": 2})
    for name in tg.carried():
        assert plan.chunks[name] == plan.chunks[tg.new[name]], name
    running = [n for n in tg.buffers if "running" in n]
    assert running and all(len(plan.chunks[n][0]) == 2 for n in running)


# ---- memory-bounded planning ----------------------------------------------------------------

WIDE = (256, 1024, 1024, 10)


def _wide_plan(**kw):
    return dfdl.plan(dfdl.models.mlp(WIDE), batch_size=256, workers=2, **kw)


def test_a_generous_memory_limit_changes_nothing():
    free = _wide_plan()
    bounded = _wide_plan(memory_limit="8GiB")
    assert bounded.chunks == free.chunks
    assert bounded.memory_limit == 8 * 2**30


@pytest.mark.parametrize("limit", [16 * 2**20, 4 * 2**20, 2**20])
def test_every_task_fits_its_share_of_the_memory_limit(limit):
    free = _wide_plan()
    plan = _wide_plan(memory_limit=limit)
    name, need = plan.peak_task()
    assert need <= limit * TASK_MEMORY_FRACTION, (name, need)
    assert all(v <= limit * TASK_MEMORY_FRACTION for v in plan.task_memory.values())
    if free.peak_task()[1] > limit * TASK_MEMORY_FRACTION:  # it had to split further
        assert plan.n_tasks() > free.n_tasks()
    assert "worker memory limit" in plan.summary()


def test_memory_bounded_plan_computes_the_same_numbers(client):
    model = dfdl.models.mlp(WIDE)
    x = np.random.default_rng(0).standard_normal((64, WIDE[0]), dtype=np.float32)
    free = dfdl.run(model, {"x": x}, client=client)
    plan = dfdl.plan(model, batch_size=64, workers=2, memory_limit="2MiB")
    assert plan.tiles != {"batch": 2, "model": 1}  # split beyond the automatic tiling
    bounded = dfdl.run(model, {"x": x}, client=client, tiles=plan.tiles)
    for k in free:
        np.testing.assert_allclose(bounded[k], free[k], rtol=1e-5, atol=1e-6)


def test_an_unplannable_limit_is_a_memory_plan_error_with_the_smallest_limit():
    with pytest.raises(MemoryPlanError) as info:
        _wide_plan(memory_limit="64KiB")
    e = info.value
    assert isinstance(e, PlanError)
    assert e.node and e.node in str(e)
    assert e.memory_limit == 64 * 2**10
    assert e.smallest_limit > e.memory_limit
    assert "Give each worker at least" in str(e)
    # the limit it names is enough, and a bit less is not
    assert _wide_plan(memory_limit=e.smallest_limit).peak_task()[1] <= e.smallest_limit / 4
    assert e.task_bytes <= e.smallest_limit * TASK_MEMORY_FRACTION


def test_explicit_tiles_that_do_not_fit_are_refused_not_changed():
    with pytest.raises(MemoryPlanError, match="tiles="):
        _wide_plan(tiles={"batch": 1, "model": 1}, memory_limit="4MiB")
    plan = _wide_plan(tiles={"batch": 4, "model": 4}, memory_limit="4MiB")
    assert plan.tiles == {"batch": 4, "model": 4}


def test_memory_limit_must_be_a_positive_size():
    from dfdl.errors import ConfigError

    for bad in ("lots", -5, "-1GiB"):
        with pytest.raises(ConfigError, match="memory_limit"):
            _wide_plan(memory_limit=bad)


def test_training_plan_respects_the_memory_limit():
    from dfdl.ir.onnx_io import to_ir
    from dfdl.ops.registry import TensorType
    from dfdl.training.graph import build_training_graph

    graph = to_ir(dfdl.models.mlp(WIDE))
    tg = build_training_graph(
        graph,
        {"x": TensorType((256, WIDE[0]), np.dtype("float32"))},
        loss="cross_entropy",
        optimizer=dfdl.optim.Adam(lr=1e-3),
        labels=TensorType((256,), np.dtype("int64")),
    )
    limit = 8 * 2**20
    plan = plan_graph(tg, None, cores=2, memory_limit=limit)
    assert plan.peak_task()[1] <= limit * TASK_MEMORY_FRACTION
    assert plan_graph(tg, None, cores=2).peak_task()[1] > limit * TASK_MEMORY_FRACTION
