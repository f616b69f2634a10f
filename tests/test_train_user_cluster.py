"""Training on a cluster the user started: a plain ``distributed.LocalCluster`` with Dask's
default memory thresholds (spill 0.7, pause 0.8, restart 0.95 of the limit, on the
process's resident memory) and no dfdl preload.

``dfdl.train`` sets the workers up itself (``dfdl.runtime.worker_setup.WorkerSetup``):
the training spills beyond the workers' limits, no worker is restarted, and the losses
and weights are those of an uncapped run, bit for bit. The same at 4.5x the limits
together (8192-wide MLP): ``bench/user_cluster.py`` (figures in
``docs/user/memory.md``).
"""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

import dfdl
import dfdl.models
from dfdl.runtime import worker_setup

SIZES = (4096, 4096, 4096, 4096, 4096, 10)
BATCH = 64
STEPS = 2
LIMIT = 512 * 2**20  # per worker
#: the worker's own footprint is planned for, as on any cluster with Dask's thresholds on
#: (the suite's conftest plans without it, for its tiny limits)
FOOTPRINT = {"dfdl.memory.worker-footprint": None}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH * STEPS, SIZES[0]), dtype=np.float32)
    return x, rng.integers(0, SIZES[-1], BATCH * STEPS)


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


def _pid_and_setup(dask_worker) -> tuple[int, bool, float, float]:
    manager = dask_worker.memory_manager
    return (
        os.getpid(),
        getattr(dask_worker, worker_setup.MARKER, False),
        manager.memory_spill_fraction,
        manager.memory_pause_fraction,
    )


@pytest.fixture(scope="module")
def capped(data, tmp_path_factory):
    with (
        dask.config.set(FOOTPRINT),
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            memory_limit="512MiB",
            processes=True,
            local_directory=str(tmp_path_factory.mktemp("spill")),
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        before = client.run(_pid_and_setup)
        result = _train(client, data)
        after = client.run(_pid_and_setup)
        restarts = client.get_events("worker-restart-memory")
    return result, before, after, restarts


def test_the_training_spills_beyond_the_limits(capped):
    result, *_ = capped
    assert sum(result.history["spilled_bytes"]) > LIMIT  # the weights did not fit
    assert result.tiles["model"] > 1


def test_no_worker_was_restarted(capped):
    result, before, after, restarts = capped
    assert {a: v[0] for a, v in after.items()} == {a: v[0] for a, v in before.items()}
    assert restarts == ()
    assert result.rollbacks == 0


def test_dfdl_set_the_workers_up(capped):
    _, before, after, _ = capped
    for _pid, marked, spill, pause in before.values():
        assert not marked and (spill, pause) == (0.7, 0.8)  # Dask's defaults
    for _pid, marked, spill, pause in after.values():
        assert marked and (spill, pause) == (0.7, 0.7)


def test_losses_equal_the_uncapped_run_bit_for_bit(capped, data):
    result, *_ = capped
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit=0, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        free = _train(client, data, tiles=result.tiles)
    assert sum(free.history["spilled_bytes"]) == 0
    assert result.history["loss"] == free.history["loss"]
    for k in free.params:
        np.testing.assert_array_equal(result.params[k], free.params[k])
