"""Split training-mode BatchNormalization (dfdl.training.passes.split_norm): the rewritten training
step computes the fused one's numbers, tiles over batch and space, and the planner uses
it when whole-channel BatchNorm tasks do not fit or automatic tiles split the batch."""

from __future__ import annotations

import numpy as np
import pytest

import dfdl
from dfdl.errors import MemoryPlanError
from dfdl.ir.onnx_io import to_ir
from dfdl.ops.registry import TensorType
from dfdl.plan.compile import SPLIT_NORMS_GAIN, plan_graph, plan_training
from dfdl.training.graph import build_training_graph
from dfdl.training.passes.split_norm import split_batch_norms
from tests.training.passes.test_recompute import _assert_same_step, _run, _training


def test_split_step_equals_the_fused_step():
    tg, values = _training("unet3d")
    split = tg.split_batch_norms()
    ops = [n.op_type for n in split.graph.nodes]
    assert "BatchNormalization" not in ops and "BatchNormalizationGrad" not in ops
    assert {"BatchNormMoments", "BatchNormApply", "BatchNormGradSums"} <= set(ops)
    want, _, _ = _run(tg, values, {"batch": 2})
    for tiles in ({"batch": 2}, {"batch": 2, "space": 3}):
        got, plan, _ = _run(split, values, tiles)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize(
    "name, tiles", [("resnet", {"batch": 2}), ("unet3d", {"batch": 2, "space": 3})]
)
def test_split_norms_keep_their_relus_inside_bit_for_bit(name, tiles):
    tg, values = _training(name)
    apart = tg.split_batch_norms(fuse_relu=False)
    inside = tg.split_batch_norms()
    ops = [n.op_type for n in inside.graph.nodes]
    relus = [n for n in inside.graph.nodes if n.op_type == "BatchNormApply" and n.attrs.get("relu")]
    masked = [
        n for n in inside.graph.nodes if n.op_type == "BatchNormGradSums" and len(n.inputs) == 4
    ]
    assert relus and len(masked) == len(relus)
    # every Relu and ReluGrad the split graph kept apart is gone
    removed = sum(op in ("Relu", "ReluGrad") for op in (n.op_type for n in apart.graph.nodes))
    assert removed - sum(op in ("Relu", "ReluGrad") for op in ops) == 2 * len(relus)
    _assert_same_step(apart, inside, values, tiles)


def test_split_batch_norm_tasks_split_batch_and_space():
    tg, _ = _training("unet3d")
    plan = plan_graph(tg.split_batch_norms(), {"batch": 2, "space": 2})
    for np_ in plan.nodes:
        if np_.node.op_type in ("BatchNormApply", "BatchNormGradApply"):
            assert np_.n_tiles() >= 4, np_.node.name
        if np_.node.op_type in ("BatchNormMoments", "BatchNormGradSums"):
            assert np_.n_partials() >= 4, np_.node.name
    fused = plan_graph(tg, {"batch": 2, "space": 2})
    bn = [p for p in fused.nodes if p.node.op_type == "BatchNormalization"]
    # each task holds the whole batch and volume of its channels; the channels split
    # by the batch factor instead (dfdl.plan.tiling._channels_for_batch)
    assert bn and all(p.grid_letters() == ["c"] and p.n_tiles() == 2 for p in bn)


def _whole(tg) -> bool:
    """Whether ``tg`` keeps its BatchNormalizations whole (fused with their Relu by the
    planner, dfdl.training.passes.fuse_norm_relu) rather than split."""
    ops = {n.op_type for n in tg.graph.nodes}
    return "BatchNormApply" not in ops and "BatchNormalizationRelu" in ops


def _unet_training(base: int, volume: int):
    """A 2-level 3-D U-Net's training graph for a batch of 2 volumes."""
    graph = to_ir(dfdl.models.unet3d(base=base, levels=2, volume=volume))
    return build_training_graph(
        graph,
        {"x": TensorType((2, 1, volume, volume, volume), np.dtype("float32"))},
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=0.1),
        labels=TensorType((2, volume, volume, volume), np.dtype("int64")),
    )


def test_planner_splits_batch_norm_when_its_channels_do_not_fit():
    tg = _unet_training(base=2, volume=16)
    limit = 512 * 2**10
    with pytest.raises(MemoryPlanError) as err:
        plan_graph(tg, memory_limit=limit)
    assert "BatchNormalization" in err.value.node
    split, plan = plan_training(tg, memory_limit=limit)
    assert split is not tg and plan.peak_task()[1] <= limit // 4
    assert not any(n.op_type == "BatchNormalization" for n in split.graph.nodes)
    assert plan.tiles["split_norms"] == 1
    # the plan's tiles repeat it without a limit; a graph that fits keeps fused BatchNorms
    again, plan2 = plan_training(tg, plan.tiles)
    assert plan2.tiles == plan.tiles
    assert [n.op_type for n in again.graph.nodes] == [n.op_type for n in split.graph.nodes]
    same, free = plan_training(tg)
    assert _whole(same) and "split_norms" not in free.tiles
    with pytest.raises(dfdl.errors.PlanError, match="split_norms"):
        plan_training(tg, {"batch": 1, "split_norms": 2})


def test_split_leaves_inference_batch_norm_alone():
    graph = to_ir(dfdl.models.resnet(image_size=8, stem=4, stages=(4,), blocks_per_stage=1))
    from dfdl.ir.bind import bind

    bound = bind(graph, {"x": TensorType((2, 3, 8, 8), np.dtype("float32"))})
    assert split_batch_norms(bound) == 0


def test_planner_splits_batch_norm_when_whole_channels_would_need_many_more_tasks():
    tg = _unet_training(base=4, volume=32)
    limit = 8 * 2**20
    whole = plan_graph(tg, memory_limit=limit)  # plannable, by splitting the 4 channels apart
    assert whole.tiles["model"] > 1
    split, plan = plan_training(tg, memory_limit=limit)
    assert split is not tg and plan.tiles["split_norms"] == 1
    assert plan.n_tasks() <= SPLIT_NORMS_GAIN * whole.n_tasks()
    assert plan.peak_task()[1] <= limit // 4
    # given back, the tiles repeat the split graph and its plan
    again, replan = plan_training(tg, plan.tiles, memory_limit=limit)
    assert replan.n_tasks() == plan.n_tasks() and again is not tg
    # without a memory limit, or with explicit tiles, the graph is left whole
    assert _whole(plan_training(tg)[0])
    assert _whole(plan_training(tg, {"batch": 2, "model": 4, "space": 2}, memory_limit=limit)[0])


def _resnet_training(batch: int):
    """A one-stage ResNet's training graph for ``batch`` 3x32x32 images (1 MiB a tile
    of its first activation at batch 8)."""
    graph = to_ir(dfdl.models.resnet(image_size=32, stem=8, stages=(8,), blocks_per_stage=1))
    return build_training_graph(
        graph,
        {"x": TensorType((batch, 3, 32, 32), np.dtype("float32"))},
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=0.1, momentum=0.9),
        labels=TensorType((batch,), np.dtype("int64")),
    )


def test_automatic_batch_tiles_split_batch_norm():
    tg = _resnet_training(batch=64)
    one, one_plan = plan_training(tg, cores=1)
    assert _whole(one) and one_plan.tiles["batch"] == 1 and "split_norms" not in one_plan.tiles
    split, plan = plan_training(tg, cores=2)
    assert plan.tiles == {"batch": 2, "model": 1, "split_norms": 1}
    assert not _whole(split) and "BatchNormApply" in {n.op_type for n in split.graph.nodes}
    # every BatchNormalization task now keeps the batch tiles of its activations
    applies = [p for p in plan.nodes if p.node.op_type == "BatchNormApply"]
    assert applies and all(p.n_tiles() == 2 for p in applies)
    # given back, the tiles repeat it; explicit tiles without the key keep it whole
    again, replan = plan_training(tg, plan.tiles, cores=2)
    assert replan.tiles == plan.tiles and not _whole(again)
    assert _whole(plan_training(tg, {"batch": 2}, cores=2)[0])
    assert _whole(plan_training(tg, {"batch": 2, "split_norms": 0}, cores=2)[0])
