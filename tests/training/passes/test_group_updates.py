"""Grouped optimizer updates (dfdl.training.passes.group_updates): which updates join a group, the
grouped training step's numbers are bit for bit the ungrouped step's, and the graph
keeps every new parameter and state name."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from dfdl.plan.compile import plan_training
from dfdl.training.graph import TrainingGraph
from dfdl.training.passes import group_updates
from tests.training.passes.test_recompute import _assert_same_step, _run, _training


def _ops(tg) -> Counter:
    return Counter(n.op_type for n in tg.graph.nodes)


@pytest.mark.parametrize("name", ["resnet", "unet3d", "transformer"])
def test_grouped_step_equals_the_ungrouped_step_bit_for_bit(name):
    plain, values = _training(name)
    tg = plain.group_small_updates()
    ops = _ops(tg)
    before = _ops(plain)
    assert ops["UpdateGroup"] >= 1
    assert ops["SGDUpdate"] < before["SGDUpdate"]
    assert tg.new == plain.new  # the same new parameter and state names
    _assert_same_step(plain, tg, values, {"batch": 2})


@pytest.mark.parametrize("name", ["resnet", "unet3d"])
def test_split_norms_update_their_running_statistics_in_a_group(name):
    """One task per step for every split BatchNorm's running mean and variance instead
    of one per normalization, bit for bit the same step."""
    plain, values = _training(name)
    apart = plain.split_batch_norms(group_running=False)
    grouped = plain.split_batch_norms()
    n = _ops(apart)["BatchNormRunning"]
    assert n >= 4
    assert _ops(grouped)["BatchNormRunning"] == 0
    (group,) = [g for g in grouped.graph.nodes if g.op_type == "UpdateGroup"]
    assert group.attrs["update"] == "BatchNormRunning" and group.phase == "fwd"
    assert len(group.outputs) == 2 * n
    assert grouped.new == apart.new
    want, _, _ = _run(apart, values, {"batch": 2})
    got, _, _ = _run(grouped, values, {"batch": 2})
    assert want.keys() == got.keys()
    stats = {o for o in group.outputs}
    for k in want:
        if k in stats:  # the group runs the members' kernels: the same statistics
            assert np.array_equal(got[k], want[k]), k
        else:  # planned from another graph: sums may round otherwise (ResNet: one weight)
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7, err_msg=k)


def test_only_small_parameters_with_the_same_update_join():
    plain, _ = _training("resnet")
    graph = plain.graph.copy()
    sizes = {
        n.inputs[0]: graph.types[n.inputs[0]].nbytes
        for n in graph.nodes
        if n.op_type == "SGDUpdate"
    }
    limit = sorted(sizes.values())[len(sizes) // 2]
    n = group_updates.group_small_updates(graph, max_bytes=limit)
    assert n == sum(1 for v in sizes.values() if v <= limit)
    (group,) = [g for g in graph.nodes if g.op_type == "UpdateGroup"]
    arity = group.attrs["arity"]
    members = group.inputs[group.attrs["n_shared"] :: arity]
    assert sorted(members) == sorted(p for p, v in sizes.items() if v <= limit)
    left = [g.inputs[0] for g in graph.nodes if g.op_type == "SGDUpdate"]
    assert sorted(left) == sorted(p for p, v in sizes.items() if v > limit)
    names = [g.name for g in graph.nodes]
    assert len(names) == len(set(names))


def test_a_lone_small_update_stays_as_it_is():
    plain, _ = _training("mlp")
    graph = plain.graph.copy()
    smallest = min(graph.types[n.inputs[0]].nbytes for n in graph.nodes if n.op_type == "SGDUpdate")
    assert group_updates.group_small_updates(graph, max_bytes=smallest) == 0
    assert not any(n.op_type == "UpdateGroup" for n in graph.nodes)


def _group_bytes(tg) -> list[int]:
    out = []
    for n in tg.graph.nodes:
        if n.op_type == "UpdateGroup":
            params = n.inputs[n.attrs["n_shared"] :: n.attrs["arity"]]
            out.append(sum(tg.graph.types[p].nbytes for p in params))
    return out


def test_the_planner_sizes_groups_to_the_memory_limit(monkeypatch):
    plain, _ = _training("resnet")
    tg, _ = plan_training(plain, {"batch": 2})
    (total,) = _group_bytes(tg)  # no limit: one group of every small parameter
    limit = 8 * total
    tight, _ = plan_training(plain, memory_limit=limit)
    sizes = _group_bytes(tight)
    assert len(sizes) > 1 and max(sizes) <= limit // 64
    # groups that ignore the limit do not fit it: the planner plans the ungrouped graph
    original = TrainingGraph.group_small_updates
    monkeypatch.setattr(TrainingGraph, "group_small_updates", lambda self, _: original(self))
    fallback, _ = plan_training(plain, memory_limit=limit)
    assert _ops(fallback)["UpdateGroup"] == 0
    assert _ops(fallback)["SGDUpdate"] == _ops(plain)["SGDUpdate"]
