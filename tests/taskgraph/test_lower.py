"""Lowering a plan to a Dask graph: key names, reduction trees, regions across tiles."""

from __future__ import annotations

import numpy as np
import pytest
from dask.task_spec import Task, TaskRef
from onnx import helper

import dfdl
from dfdl.api import feed_types
from dfdl.ir.bind import bind
from dfdl.models import ZOO, example_inputs
from dfdl.plan.tiling import REDUCE_FAN_IN, make_plan
from dfdl.taskgraph.lower import lower, offsets, split_tiles, tile_regions
from dfdl.taskgraph.tile_exec import combine
from tests.ir.helpers import make_model, plan_sources, vi

MLP = (8, 64, 64, 4)


def mlp_plan(parts: int, batch: int = 4):
    model = ZOO["mlp"](sizes=MLP)
    return model, dfdl.plan(model, batch_size=batch, tiles={"batch": 2, "model": parts})


def refs(task: Task) -> list:
    """The keys a task reads, in argument order."""
    return [a.key for a in task.args if isinstance(a, TaskRef)]


def mlp_reference(model, x: np.ndarray) -> np.ndarray:
    w = {t.name: np.asarray(dfdl.load(model).initializers[t.name]) for t in model.graph.initializer}
    y = x
    for i in range(len(MLP) - 1):
        y = y @ w[f"layers.{i}.weight"].T + w[f"layers.{i}.bias"]
        if i < len(MLP) - 2:
            y = np.maximum(y, 0)
    return y


# ---- helpers ---------------------------------------------------------------------------------


def test_offsets_regions_and_split():
    assert offsets((2, 2, 1)) == [0, 2, 4, 5]
    regions = tile_regions(((2, 1), (3,)))
    assert regions == {(0, 0): (slice(0, 2), slice(0, 3)), (1, 0): (slice(2, 3), slice(0, 3))}
    a = np.arange(15).reshape(5, 3)
    tiles = split_tiles(a, ((3, 1, 1), (2, 1)))
    assert len(tiles) == 6 and tiles[(0, 1)].tolist() == [[2], [5], [8]]
    assert tiles[(2, 0)].base is None  # a copy: pickles without its parent


# ---- keys -----------------------------------------------------------------------------------


@pytest.mark.parametrize("tiles", [{"batch": 2, "model": 3}, "uneven"])
def test_keys_name_the_onnx_nodes(tiles):
    kw = dict(vocab=20, d_model=16, heads=2, ff=32, layers=1, seq=6)
    model = ZOO["transformer"](**kw)
    p = dfdl.plan(model, batch_size=3, dims={"seq": 6}, tiles=tiles)
    dsk, outputs = lower(p, plan_sources(p), step=7)
    onnx_names = {n.name for n in model.graph.node}
    by_name = {n.node.name: n for n in p.nodes}
    assert set(by_name) <= onnx_names
    finals = {}
    for key, task in dsk.items():
        assert isinstance(key, tuple) and key[1] == 7, key
        assert task.key == key
        base, _, kind = key[0].partition("-fwd")
        assert base in by_name and by_name[base].node.phase == "fwd", key
        assert kind in ("", "-partial", "-sum"), key
        if kind == "":
            finals.setdefault(base, set()).add(key[2:])
    # one final key per output tile, the tile index ranging over the node's grid
    assert set(finals) == set(by_name)
    for name, idx in finals.items():
        np_ = by_name[name]
        grid = [len(np_.letters[c]) for c in np_.grid_letters()]
        assert len(idx) == np_.n_tiles()
        assert all(len(i) == len(grid) and all(0 <= a < g for a, g in zip(i, grid)) for i in idx)
    assert len(dsk) == p.n_tasks()
    # outputs point at final keys of the node producing "logits"
    (last,) = [n for n in p.nodes if "logits" in n.node.outputs]
    assert {ref[0] for ref, _ in outputs["logits"].values()} == {f"{last.node.name}-fwd"}


def test_step_and_phase_are_part_of_every_key():
    _, p = mlp_plan(2)
    src = plan_sources(p)
    a, _ = lower(p, src, step=0)
    b, _ = lower(p, src, step=1)
    assert not set(a) & set(b)
    assert {k[1] for k in b} == {1}
    assert [(k[0], 1, *k[2:]) for k in a] == list(b)
    # the phase word comes from the node
    p.nodes[0].node.phase = "bwd"
    c, _ = lower(p, src, step=1)
    assert {k[0] for k in c} - {k[0] for k in b} == {"layers.0-bwd"}


# ---- reduction trees -----------------------------------------------------------------------


@pytest.mark.parametrize("parts", [2, 4, 5, 9, 16, 17])
def test_tree_reduction_fan_in_is_bounded(parts):
    _, p = mlp_plan(parts)
    dsk, _ = lower(p, plan_sources(p))
    partials = [k for k in dsk if k[0] == "layers.1-fwd-partial"]
    sums = [k for k in dsk if k[0] == "layers.1-fwd-sum"]
    finals = [k for k in dsk if k[0] == "layers.1-fwd"]
    n_tiles = len(finals)
    assert len(partials) == n_tiles * parts
    for k in sums + finals:
        task = dsk[k]
        assert task.func is combine
        assert 0 < len(refs(task)) <= REDUCE_FAN_IN, k
    if parts <= REDUCE_FAN_IN:
        assert not sums
    else:
        assert sums
    # every partial is read by exactly one combine, and each combine by at most one other
    readers: dict = {}
    for k in sums + finals:
        for r in refs(dsk[k]):
            readers.setdefault(r, []).append(k)
    assert all(len(v) == 1 for v in readers.values())
    assert set(partials) <= set(readers)
    assert set(sums) <= set(readers)


def test_tree_reduction_is_deterministic():
    _, p = mlp_plan(9)
    src = plan_sources(p)
    a, out_a = lower(p, src)
    b, out_b = lower(p, src)
    assert list(a) == list(b)
    assert all(refs(a[k]) == refs(b[k]) for k in a)
    assert out_a == out_b
    # partials are summed in index order: level 0 groups 0-3, 4-7, 8; then the groups
    final = ("layers.1-fwd", 0, 0, 0)
    level0 = [("layers.1-fwd-sum", 0, 0, 0, 0, j) for j in range(3)]
    assert refs(a[final]) == level0
    assert refs(a[level0[0]]) == [("layers.1-fwd-partial", 0, 0, 0, c) for c in range(4)]
    assert refs(a[level0[2]]) == [("layers.1-fwd-partial", 0, 0, 0, 8)]


def test_tree_reduction_computes_the_product(client):
    model = ZOO["mlp"](sizes=MLP)
    tiles = {"batch": 1, "model": 6}  # 6 partials: a two-level tree of groups (4, 2)
    x = example_inputs("mlp", batch=4, sizes=MLP)["x"]
    ref = mlp_reference(model, x)
    first = dfdl.run(model, {"x": x}, client=client, tiles=tiles)
    again = dfdl.run(model, {"x": x}, client=client, tiles=tiles)
    np.testing.assert_allclose(first["logits"], ref, rtol=1e-5, atol=1e-6)
    assert np.array_equal(first["logits"], again["logits"]), "not bit-identical"


# ---- regions across producer tiles -----------------------------------------------------------


def two_node_model():
    """``x (5, 7)`` -> Relu (tiled both ways) -> Softmax over axis 1 (needs whole rows)
    -> Neg (tiled both ways again, so it reads slices of the Softmax tiles)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="producer"),
        helper.make_node("Softmax", ["r"], ["s"], name="consumer", axis=1),
        helper.make_node("Neg", ["s"], ["y"], name="after"),
    ]
    return make_model(nodes, [vi("x", [5, 7])], [vi("y", [5, 7])])


def reference(x: np.ndarray) -> np.ndarray:
    r = np.maximum(x, 0)
    e = np.exp(r - r.max(axis=1, keepdims=True))
    return -(e / e.sum(axis=1, keepdims=True))


def test_region_assembled_from_several_producer_tiles():
    model = two_node_model()
    graph = dfdl.load(model)
    x = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    p = make_plan(bind(graph, feed_types(graph, {"x": x})), "uneven")
    assert p.chunks["r"] == ((3, 1, 1), (4, 2, 1))
    assert p.chunks["s"] == ((3, 1, 1), (7,))
    assert p.chunks["y"] == ((3, 1, 1), (4, 2, 1))
    dsk, outputs = lower(p, plan_sources(p, {"x": x}))
    for row in range(3):
        task = dsk[("consumer-fwd", 0, row)]  # the grid is the rows only
        (spec,) = task.args[0][2]
        assert spec[0] == "assemble" and spec[1] == ((3, 1, 1)[row], 7)
        assert len(spec[3]) == 3  # the three column tiles of the producer
        assert refs(task) == [("producer-fwd", 0, row, c) for c in range(3)]
        for col in range(3):
            (spec,) = dsk[("after-fwd", 0, row, col)].args[0][2]
            assert spec[0] == "slice"  # a part of one Softmax tile
            assert refs(dsk[("after-fwd", 0, row, col)]) == [("consumer-fwd", 0, row)]
    assert len(outputs["y"]) == 9


def test_region_assembly_runs_correctly(client):
    model = two_node_model()
    x = np.random.default_rng(1).standard_normal((5, 7)).astype(np.float32)
    for tiles in ("uneven", {"batch": 2}, None):
        out = dfdl.run(model, {"x": x}, client=client, tiles=tiles)
        np.testing.assert_allclose(out["y"], reference(x), rtol=1e-6, atol=1e-7)


def test_lowering_runs_locally_without_a_cluster():
    """The task dict is plain dask: the synchronous scheduler computes it too."""
    import dask

    model = two_node_model()
    graph = dfdl.load(model)
    x = np.random.default_rng(2).standard_normal((5, 7)).astype(np.float32)
    p = make_plan(bind(graph, feed_types(graph, {"x": x})), "uneven")
    dsk, outputs = lower(p, plan_sources(p, {"x": x}))
    keys = sorted({ref for ref, _ in outputs["y"].values()})
    values = dict(zip(keys, dask.get(dsk, keys)))
    y = np.empty((5, 7), np.float32)
    regions = tile_regions(p.chunks["y"])
    for idx, (ref, _) in outputs["y"].items():
        y[regions[idx]] = values[ref]
    np.testing.assert_allclose(y, reference(x), rtol=1e-6, atol=1e-7)


def test_a_region_maps_to_the_tiles_it_overlaps_on_uneven_chunks():
    """Tiles (2, 2, 1) x (3,): a region across the first two tiles gives one piece per
    tile, with the slices inside each tile and inside the region; the same question
    asked again (every step asks it) gives the same answer."""
    from dfdl.taskgraph.lower import _TensorTiles

    tt = _TensorTiles(((2, 2, 1), (3,)), {})
    hits = tt.overlapping((slice(1, 4), slice(0, 3)))
    assert [h[0] for h in hits] == [(0, 0), (1, 0)]
    assert hits[0][1] == (slice(1, 2), slice(0, 3)) and hits[0][2] == (slice(0, 1), slice(0, 3))
    assert hits[1][1] == (slice(0, 2), slice(0, 3)) and hits[1][2] == (slice(1, 3), slice(0, 3))
    assert tt.overlapping((slice(4, 5), slice(1, 2))) == (
        ((2, 0), (slice(0, 1), slice(1, 2)), (slice(0, 1), slice(0, 1))),
    )
    empty = tt.overlapping((slice(2, 2), slice(0, 3)))
    # an empty region takes the first tile's empty slice
    assert [h[0] for h in empty] == [(0, 0)] and empty[0][1][0] == slice(0, 0)
    assert _TensorTiles([[2, 2, 1], [3]], {}).overlapping((slice(1, 4), slice(0, 3))) == hits
