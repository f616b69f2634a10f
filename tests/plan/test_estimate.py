"""The pre-flight memory estimate (dfdl.plan.estimate): what it counts and how it
spreads over workers. Its agreement with measured worker memory is a benchmark figure
(bench/beyond_memory.py), not a test."""

from __future__ import annotations

import dask
import numpy as np
import pytest

import dfdl
import dfdl.models
from dfdl.errors import MemoryPlanError
from dfdl.ir.onnx_io import to_ir
from dfdl.ops.registry import TensorType
from dfdl.plan.compile import plan_graph
from dfdl.plan.estimate import (
    DASK_SPILL,
    DASK_TARGET,
    HEADROOM,
    estimate_memory,
    smallest_limit,
    task_budget,
    working_set,
)
from dfdl.training.graph import build_training_graph

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
    return plan_graph(tg, memory_limit=memory_limit)


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
    assert "predicted peak memory per worker" in text
    assert "process-memory thresholds are off" in text  # the session plans without a footprint
    assert "predicted bytes spilled per step" in text
    assert "working set" not in plan.summary()


FOOTPRINT = 200 * 2**20


@pytest.fixture
def process_limited():
    """Dask's process-memory thresholds on, pausing at the spill line as dfdl's clusters
    do, with a 200 MiB worker footprint."""
    with dask.config.set(
        {
            "dfdl.memory.worker-footprint": FOOTPRINT,
            "distributed.worker.memory.target": DASK_TARGET,
            "distributed.worker.memory.spill": DASK_SPILL,
            "distributed.worker.memory.pause": DASK_SPILL,
            "distributed.worker.memory.terminate": 0.95,
        }
    ):
        yield


@pytest.mark.parametrize("pause", [0.8, 0.75, False])
def test_a_task_fits_between_the_pause_line_and_the_headroom(process_limited, pause):
    """A worker starts tasks until it passes Dask's pause threshold, so a task must fit
    above it; with pausing off, above the spill line."""
    limit = 2**30
    with dask.config.set({"distributed.worker.memory.pause": pause}):
        start = pause or DASK_SPILL
        assert task_budget(limit, FOOTPRINT, 0.25) == int((HEADROOM - start) * limit)
        plan = _training_plan(memory_limit=limit)
    assert plan.peak_task()[1] <= (HEADROOM - start) * limit


def test_with_a_footprint_tasks_fit_between_the_spill_line_and_the_headroom(process_limited):
    limit = 2**30
    plan = _training_plan(memory_limit=limit)
    assert plan.footprint == FOOTPRINT
    room = (HEADROOM - DASK_SPILL) * limit  # a task started at the spill line ends below
    assert task_budget(limit, FOOTPRINT, 0.25) == int(room)
    assert task_budget(limit, 0, 0.25) == limit // 4
    assert plan.peak_task()[1] <= room
    est = estimate_memory(plan, 2)
    ws = working_set(plan)
    resident = min(FOOTPRINT + min(ws / 2, DASK_TARGET * limit), DASK_SPILL * limit)
    assert est.peak_per_worker == int(resident + plan.peak_task()[1])
    assert est.peak_per_worker <= HEADROOM * limit
    assert "with the worker process's own 200.0 MiB" in "\n".join(est.lines())
    # when the working set spills, the footprint and tiles reach the spill line
    spilling = estimate_memory(plan, 2, memory_limit=ws // 4)
    assert spilling.peak_per_worker == int(DASK_SPILL * (ws // 4) + plan.peak_task()[1])


def test_a_limit_below_the_footprint_is_a_plan_error_with_the_smallest_limit(process_limited):
    with pytest.raises(MemoryPlanError, match="a worker process takes about 200.0 MiB") as e:
        _training_plan(memory_limit=256 * 2**20)
    smallest = e.value.smallest_limit
    assert smallest > 256 * 2**20
    # the limit it names does plan: footprint + a task fit under the spill line
    plan = _training_plan(memory_limit=smallest)
    assert FOOTPRINT + task_budget(smallest, FOOTPRINT, 0.25) <= DASK_SPILL * smallest
    assert plan.peak_task()[1] <= task_budget(smallest, FOOTPRINT, 0.25)


def test_smallest_limit_inverts_the_task_budget(process_limited):
    for need in (2**20, 50 * 2**20, 2**30):
        for footprint in (0, FOOTPRINT):
            limit = smallest_limit(need, footprint, 0.25)
            assert task_budget(limit, footprint, 0.25) >= need - 1
            assert task_budget(limit - 2**12, footprint, 0.25) < need or (
                footprint and FOOTPRINT + need > DASK_SPILL * (limit - 2**12)
            )
