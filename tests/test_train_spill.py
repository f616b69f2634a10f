"""Training beyond the workers' memory: tiles spill to disk, the numbers do not change.

A LocalCluster with 2 single-threaded worker processes whose memory limits are a
quarter of the training working set (weights, gradients, momentum, activations)
together: Dask keeps each worker's tiles under ``target * memory_limit`` by spilling
the rest to its local directory. Dask's process-memory checks are off here, because
the limits are far below a Python process's own footprint; the bytes Dask manages
(tiles) are what the limit bounds.
"""

from __future__ import annotations

import dask
import numpy as np
import pytest
from distributed import Client

import dfdl
import dfdl.models
from dfdl.errors import MemoryPlanError
from dfdl.plan.tiling import TASK_MEMORY_FRACTION

SIZES = (512, 1024, 1024, 1024, 1024, 10)
BATCH = 128
STEPS = 2
LIMIT = 4 * 2**20  # per worker
MANAGED_ONLY = {
    "distributed.worker.memory.target": 0.6,
    "distributed.worker.memory.spill": False,
    "distributed.worker.memory.pause": False,
    "distributed.worker.memory.terminate": False,
}


def _working_set_bytes() -> int:
    """Weights + gradients + momentum (4 bytes each) and the activations of one step."""
    params = sum(a * b + b for a, b in zip(SIZES, SIZES[1:]))
    activations = BATCH * sum(SIZES) * 4 * 2  # outputs kept for backward, and their grads
    return 3 * 4 * params + activations


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH * STEPS, SIZES[0]), dtype=np.float32)
    y = rng.integers(0, SIZES[-1], BATCH * STEPS)
    return x, y


def _train(client, data, tiles=None):
    return dfdl.train(
        dfdl.models.mlp(SIZES),
        data=data,
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=0.01, momentum=0.9),
        batch_size=BATCH,
        steps=STEPS,
        shuffle=False,
        client=client,
        tiles=tiles,
        progress=False,
    )


@pytest.fixture(scope="module")
def capped(data, tmp_path_factory):
    with (
        dask.config.set(MANAGED_ONLY),
        dfdl.LocalCluster(
            2,
            memory_limit=LIMIT,
            local_directory=str(tmp_path_factory.mktemp("spill")),
        ) as cluster,
        Client(cluster) as client,
    ):
        result = _train(client, data)
        assert len(client.scheduler_info()["workers"]) == 2  # both workers still there
    return result


def test_the_working_set_is_at_least_four_times_the_workers_memory():
    assert _working_set_bytes() >= 4 * 2 * LIMIT


def test_capped_training_spills_and_reports_it(capped):
    assert len(capped.history["spilled_bytes"]) == STEPS
    assert sum(capped.history["spilled_bytes"]) > 0
    assert sum(capped.history["unspilled_bytes"]) > 0


def test_the_plan_was_split_to_fit_the_limit(capped, client, data):
    free = _train(client, data)
    assert free.tiles == {"batch": 2, "model": 1}
    assert capped.tiles["model"] > 1


def test_capped_losses_equal_the_unlimited_run_bit_for_bit(capped, client, data):
    free = _train(client, data, tiles=capped.tiles)  # the same plan, no memory limit
    assert sum(free.history["spilled_bytes"]) == 0
    # the capped plan spills, so its tasks ran unfused; the free run fused them
    assert not capped.fused and free.fused
    assert capped.history["loss"] == free.history["loss"]
    for k in free.params:
        np.testing.assert_array_equal(capped.params[k], free.params[k])


def test_tiles_too_large_for_the_limit_are_refused_before_anything_runs(data):
    with (
        dask.config.set(MANAGED_ONLY),
        dfdl.LocalCluster(1, memory_limit=LIMIT) as cluster,
        Client(cluster) as client,
    ):
        with pytest.raises(MemoryPlanError) as info:
            dfdl.train(
                dfdl.models.mlp(SIZES),
                data=data,
                batch_size=BATCH,
                steps=1,
                client=client,
                tiles={"batch": 1, "model": 1},
                progress=False,
            )
        assert info.value.memory_limit == LIMIT
        assert info.value.task_bytes > LIMIT * TASK_MEMORY_FRACTION
        assert client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) == 0
