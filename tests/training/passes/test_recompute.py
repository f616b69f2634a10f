"""Recomputation (dfdl.training.passes.recompute): the segments, the clones and their ordering
edges, and the training step's numbers, which must not change by a bit."""

from __future__ import annotations

import dask
import numpy as np
import pytest

import dfdl
import dfdl.models
from dfdl.ir.onnx_io import to_ir
from dfdl.ops.registry import TensorType
from dfdl.plan.compile import plan_graph
from dfdl.plan.estimate import working_set
from dfdl.taskgraph.lower import lower, tile_regions
from dfdl.taskgraph.tile_exec import ready
from dfdl.training.graph import build_training_graph
from dfdl.training.passes.recompute import PHASE, SUFFIX
from tests.ir.helpers import plan_sources

MODELS = {
    "mlp": dict(sizes=(16, 32, 32, 32, 32, 32, 10)),
    "resnet": dict(image_size=8, stem=4, stages=(4, 8), blocks_per_stage=1, num_classes=3),
    "unet3d": dict(base=2, levels=2, volume=8),
    "transformer": dict(
        vocab=20, d_model=8, heads=2, ff=16, layers=2, seq=6, num_classes=3, dropout=0.5
    ),
}
BATCH = 4


def _training(name: str, **build):
    graph = to_ir(dfdl.models.ZOO[name](**MODELS[name]))
    ((x_name, x),) = dfdl.models.example_inputs(name, batch=BATCH, **MODELS[name]).items()
    logits_shape = _logits_shape(graph, x_name, x)
    y = np.random.default_rng(1).integers(0, logits_shape[1], size=(BATCH, *logits_shape[2:]))
    tg = build_training_graph(
        graph,
        {x_name: TensorType(x.shape, x.dtype)},
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=0.1, momentum=0.9),
        labels=TensorType(y.shape, y.dtype),
        **build,
    )
    values = {x_name: x, tg.labels: y, tg.scalars[0]: np.float32(0.1)}
    for p in tg.params + tg.buffers:
        values[p] = graph.initializers[p]
    return tg, values


def _logits_shape(graph, x_name, x):
    from dfdl.ir.bind import bind

    bound = bind(graph, {x_name: TensorType(x.shape, x.dtype)})
    return bound.types[graph.outputs[0]].shape


def _run(tg, values, tiles, step=3):
    """Every output of one training step, computed by dask's synchronous scheduler."""
    plan = plan_graph(tg, tiles)
    dsk, outs = lower(plan, plan_sources(plan, values), step=step, attrs=tg.seeds(0, step))
    names = [tg.loss, *tg.new.values()]
    # one pass of the scheduler for every output (a pass per output ran the step again)
    wanted = sorted({k for name in names for k, _ in outs[name].values()}, key=str)
    got = dict(zip(wanted, dask.get(dsk, wanted)))
    result = {}
    for name in names:
        t = plan.graph.types[name]
        arr = np.empty(t.shape, t.dtype)
        regions = tile_regions(plan.chunks[name])
        for idx, (k, pos) in outs[name].items():
            arr[regions[idx]] = got[k] if pos is None else got[k][pos]
        result[name] = arr
    return result, plan, dsk


def _assert_same_step(want_tg, got_tg, values, tiles) -> None:
    """One training step of ``got_tg`` gives every output of ``want_tg``'s, bit for bit."""
    want, _, _ = _run(want_tg, values, tiles)
    got, _, _ = _run(got_tg, values, tiles)
    assert want.keys() == got.keys()
    for k in want:
        assert np.array_equal(got[k], want[k], equal_nan=True), k


@pytest.mark.parametrize(
    "name, tiles",
    [(name, {"batch": 2, "model": 2}) for name in sorted(MODELS)]
    + [("mlp", "uneven"), ("unet3d", {"batch": 2, "space": 2})],
)
def test_recomputing_every_segment_changes_no_bit(name, tiles):
    tg, values = _training(name)
    segs = tg.segments()
    assert len(segs) >= 1
    rc = tg.recompute(segs)
    clones = [n for n in rc.graph.nodes if n.phase == PHASE]
    assert clones and len(clones) == len(rc.recomputed)
    want, _, _ = _run(tg, values, tiles)
    got, _, _ = _run(rc, values, tiles)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_backward_pass_reads_no_activation_of_a_recomputed_segment(name):
    tg, _ = _training(name)
    segs = tg.segments()
    rc = tg.recompute(segs)
    acts = {a for s in segs for a in s.activations}
    for n in rc.graph.nodes:
        if n.phase == "bwd":
            assert not acts & set(n.inputs), n.name
    # each clone reads only checkpoints, other clones, parameters and constants
    fwd_out = {o for n in rc.graph.nodes if n.phase == "fwd" for o in n.outputs}
    for n in rc.graph.nodes:
        if n.phase == PHASE:
            assert not acts & set(n.inputs), n.name
            assert n.name.endswith(SUFFIX) and all(o.endswith(SUFFIX) for o in n.outputs if o)
            assert all(
                i in fwd_out
                or i.endswith(SUFFIX)
                or i in rc.graph.inputs
                or i in rc.graph.initializers
                or not i
                for i in n.inputs
            )


@pytest.mark.parametrize("name", sorted(MODELS))
def test_recompute_waits_for_the_gradient_of_its_segment(name):
    """Every clone task depends (through a ``-ready`` task) on a backward task, so the
    scheduler cannot rebuild activations during the forward pass."""
    tg, values = _training(name)
    segs = tg.segments()
    rc = tg.recompute(segs)
    _, plan, dsk = _run(rc, values, {"batch": 2})
    bwd = {n.name for n in rc.graph.nodes if n.phase == "bwd"}
    clone_tasks = [k for k in dsk if isinstance(k, tuple) and f"{SUFFIX}-{PHASE}" in k[0]]
    assert clone_tasks
    for key in clone_tasks:
        waits = [d for d in dsk[key].dependencies if "-ready" in d[0]]
        assert waits, key
        (inner,) = dsk[waits[0]].dependencies
        assert dsk[waits[0]].func is ready
        assert any(inner[0].startswith(f"{b}-bwd") for b in bwd), inner
    # the signals are gradients of each segment's outputs, made before its readers
    order = {n.name: i for i, n in enumerate(rc.graph.nodes)}
    producer = rc.graph.producers()
    for s in segs:
        first_clone = min(order[c] for c, o in rc.recomputed.items() if o in s.nodes)
        assert order[producer[s.signal][0].name] < first_clone


@pytest.mark.parametrize("name", ["resnet", "unet3d"])
def test_recompute_shrinks_the_working_set(name):
    tg, _ = _training(name)
    segs = tg.segments()
    before = working_set(plan_graph(tg, {"batch": 1}))
    after = working_set(plan_graph(tg.recompute(segs), {"batch": 1}))
    saved = sum(s.saved_bytes for s in segs)
    biggest = max(s.saved_bytes for s in segs)
    assert after < before
    # one segment's activations at a time at most: all but the largest are saved
    assert before - after >= saved - biggest


def test_dropout_clones_draw_the_originals_mask():
    tg, _ = _training("transformer")
    rc = tg.recompute(tg.segments())
    dropped = [c for c, o in rc.recomputed.items() if o in tg.dropout]
    assert dropped, "the transformer's Dropout should be rebuilt"
    seeds = rc.seeds(7, 11)
    for clone in dropped:
        assert seeds[clone] == seeds[rc.recomputed[clone]]
    assert seeds != rc.seeds(7, 12)


def test_segment_size_and_no_segments_for_a_single_layer():
    tg, _ = _training("mlp")
    assert len(tg.segments(size=3)) > len(tg.segments()) > len(tg.segments(size=100)) == 0
    # a Gemm and its Relu per segment: every value the backward reads is a checkpoint
    assert tg.segments(size=2) == tg.segments(size=1) == []
    one = build_training_graph(
        to_ir(dfdl.models.mlp((4, 3))),
        {"x": TensorType((2, 4), np.dtype("float32"))},
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=0.1),
        labels=TensorType((2,), np.dtype("int64")),
    )
    assert one.segments() == []
    assert one.recompute([]).graph.nodes == one.graph.nodes
