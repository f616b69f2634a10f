"""The pre-flight memory estimate (dfdl.graph.estimate): what it counts and how it
spreads over workers. Its agreement with measured worker memory is a benchmark figure
(bench/beyond_memory.py), not a test."""

from __future__ import annotations

import numpy as np
import pytest

import dfdl
import dfdl.models
from dfdl.graph.estimate import DASK_TARGET, estimate_memory, working_set
from dfdl.graph.onnx_io import to_ir
from dfdl.graph.training import build_training_graph
from dfdl.ops.registry import TensorType

SIZES = (64, 128, 128, 10)
BATCH = 32


def _training_plan(memory_limit=None):
    tg = build_training_graph(
        to_ir(dfdl.models.mlp(SIZES)),
        {"x": TensorType((BATCH, SIZES[0]), np.dtype("float32"))},
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=0.1, momentum=0.9),
        labels=TensorType((BATCH,), np.dtype("int64")),
    )
    return tg.plan(memory_limit=memory_limit)


def test_training_working_set_counts_weights_state_gradients_and_kept_activations():
    plan = _training_plan()
    params = 4 * sum(a * b + b for a, b in zip(SIZES, SIZES[1:]))
    batch = BATCH * SIZES[0] * 4 + BATCH * 8
    hidden = BATCH * sum(SIZES[1:-1]) * 4  # the hidden layers' outputs, read by backward
    ws = working_set(plan)
    # weights + momentum + gradients, the batch, at least the hidden activations
    assert ws >= 3 * params + batch + hidden
    # and not every tensor of the step (gradients of activations are not kept)
    everything = sum(t.nbytes for t in plan.graph.types.values())
    assert ws < everything


def test_inference_working_set_is_every_tensor():
    plan = dfdl.plan(dfdl.models.mlp(SIZES), batch_size=BATCH)
    g = plan.graph
    names = set(g.inputs) | set(g.initializers) | {o for n in g.nodes for o in n.outputs if o}
    assert working_set(plan) == sum(g.types[n].nbytes for n in names)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_unlimited_workers_share_the_working_set(workers):
    plan = _training_plan()
    est = estimate_memory(plan, workers, threads_per_worker=2)
    ws = working_set(plan)
    assert est.working_set == ws
    assert est.spilled_per_step == 0
    assert est.peak_per_worker == int(ws / workers + 2 * plan.peak_task()[1])


def test_a_limit_caps_the_share_and_the_rest_spills():
    plan = _training_plan()
    ws = working_set(plan)
    limit = ws // 4  # the working set is twice the two workers' limits together
    est = estimate_memory(plan, 2, memory_limit=limit)
    assert est.memory_limit == limit
    assert est.spilled_per_step == int(ws - 2 * DASK_TARGET * limit) > 0
    assert est.peak_per_worker == int(DASK_TARGET * limit + plan.peak_task()[1])
    roomy = estimate_memory(plan, 2, memory_limit=2**30)
    assert roomy.spilled_per_step == 0


def test_summary_prints_the_estimate():
    plan = _training_plan(memory_limit=2**20)
    text = plan.summary(workers=2)
    times = working_set(plan) / 2**21
    assert (
        f"working set: {working_set(plan) / 1024:.1f} KiB ({times:.1f}x the 2 worker(s)' " in text
    )
    assert "predicted peak tile memory per worker" in text
    assert "predicted bytes spilled per step" in text
    assert "working set" not in plan.summary()
