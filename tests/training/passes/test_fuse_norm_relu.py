"""BatchNormalization + Relu fusion (dfdl.training.passes.fuse_norm_relu): which pairs fuse, the
fused training step's numbers are bit for bit the unfused step's, the planner fuses
only whole normalizations, and unfusing restores the graph the split rewrite needs."""

from __future__ import annotations

from collections import Counter

import pytest

from dfdl.plan.compile import SPLIT_NORMS, plan_training
from dfdl.training.passes.fuse_norm_relu import fuse_batch_norm_relu, unfuse_batch_norm_relu
from tests.training.passes.test_recompute import _assert_same_step, _training


def _ops(graph) -> Counter:
    return Counter(n.op_type for n in graph.nodes)


@pytest.mark.parametrize("name", ["resnet", "unet3d"])
def test_fused_step_equals_the_unfused_step_bit_for_bit(name):
    tg, values = _training(name)
    fused = tg.fuse_batch_norm_relu()
    before, after = _ops(tg.graph), _ops(fused.graph)
    n = after["BatchNormalizationRelu"]
    assert n > 0 and after["BatchNormalizationReluGrad"] == n
    assert after["BatchNormalization"] == before["BatchNormalization"] - n
    assert after["Relu"] == before["Relu"] - n
    assert after["ReluGrad"] == before["ReluGrad"] - n
    _assert_same_step(tg, fused, values, {"batch": 2})


def test_resnet_fuses_the_pairs_without_a_skip_connection_between():
    """A basic block is bn1 -> relu1 (fused) and bn2 -> Add(skip) -> relu2 (not)."""
    tg, _ = _training("resnet")
    fused = tg.fuse_batch_norm_relu()
    names = {n.name for n in fused.graph.nodes if n.op_type == "BatchNormalizationRelu"}
    assert any(name.endswith("bn1") for name in names)
    assert not any(name.endswith("bn2") for name in names)
    relus = [n for n in fused.graph.nodes if n.op_type == "Relu"]
    assert relus and all(fused.graph.types.get(n.inputs[0]) for n in relus)


def test_a_batch_norm_output_read_elsewhere_stays_unfused():
    tg, _ = _training("resnet")
    graph = tg.graph.copy()
    bn = next(n for n in graph.nodes if n.op_type == "BatchNormalization")
    graph.outputs.append(bn.outputs[0])  # Y is now a graph output too
    fuse_batch_norm_relu(graph)
    kept = next(n for n in graph.nodes if n.name == bn.name)
    assert kept.op_type == "BatchNormalization"


def test_unfuse_restores_the_op_counts():
    tg, _ = _training("unet3d")
    graph = tg.graph.copy()
    assert fuse_batch_norm_relu(graph) > 0
    unfuse_batch_norm_relu(graph)
    assert _ops(graph) == _ops(tg.graph)


def test_planner_fuses_whole_norms_and_splits_from_the_unfused_graph():
    tg, _ = _training("unet3d")
    fused_tg, plan = plan_training(tg, {"batch": 2})
    assert _ops(fused_tg.graph)["BatchNormalizationRelu"] > 0
    split_tg, split_plan = plan_training(tg, {"batch": 2, SPLIT_NORMS: 1})
    ops = _ops(split_tg.graph)
    assert ops["BatchNormApply"] > 0
    assert ops["BatchNormalizationRelu"] == ops["BatchNormalizationReluGrad"] == 0
    # a fused graph handed back (train's recompute re-plans from it) still splits
    again, _ = plan_training(fused_tg, {"batch": 2, SPLIT_NORMS: 1})
    assert _ops(again.graph) == ops
