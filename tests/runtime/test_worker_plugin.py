"""dfdl's worker setup on a cluster dfdl did not start: the WorkerSetup plugin that
dfdl.train registers, on plain distributed.LocalCluster workers (Dask's defaults, no
preload), on workers that restart or join later, and on preloaded workers."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

import dfdl
import dfdl.models
from dfdl.errors import TrainingError
from dfdl.runtime import heap, worker_setup
from dfdl.runtime.cluster import worker_memory_config


def _state(dask_worker) -> dict:
    """What dfdl's setup leaves on a worker."""
    manager = dask_worker.memory_manager
    trimmer = dask_worker.plugins.get(heap.HeapTrimmer.name)
    return {
        "marker": getattr(dask_worker, worker_setup.MARKER, False),
        "spill": manager.memory_spill_fraction,
        "pause": manager.memory_pause_fraction,
        "trimmer": id(trimmer) if trimmer is not None else None,
        "pid": os.getpid(),
    }


@pytest.fixture
def plain():
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            memory_limit="512MiB",
            processes=True,
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        yield cluster, client


def test_plain_workers_are_set_up_and_pause_at_their_spill_line(plain):
    cluster, client = plain
    (before,) = client.run(_state).values()
    assert not before["marker"] and before["trimmer"] is None
    assert before["pause"] > before["spill"]  # Dask's 0.8 and 0.7
    worker_setup.install(client)
    (after,) = client.run(_state).values()
    assert after["marker"] and after["trimmer"] is not None
    assert after["pause"] == after["spill"] == before["spill"]
    # what the planner reads is what the workers now do
    assert worker_memory_config(client)["distributed.worker.memory.pause"] == before["spill"]
    # registering again (every dfdl.train call does) leaves the workers as they are
    worker_setup.install(client)
    (again,) = client.run(_state).values()
    assert again == after
    # unregistered: Dask's pause line again
    client.unregister_worker_plugin(worker_setup.WorkerSetup.name)
    (gone,) = client.run(_state).values()
    assert gone["pause"] == before["pause"]


def test_workers_that_restart_or_join_later_are_set_up(plain):
    cluster, client = plain
    worker_setup.install(client)
    client.restart()
    cluster.scale(2)
    client.wait_for_workers(2)
    states = list(client.run(_state).values())
    assert len(states) == 2
    for state in states:
        assert state["marker"] and state["trimmer"] is not None
        assert state["pause"] == state["spill"]


def test_preloaded_workers_are_not_set_up_twice():
    with (
        dfdl.LocalCluster(1, memory_limit="512MiB") as cluster,
        Client(cluster) as client,
    ):
        (before,) = client.run(_state).values()
        assert before["marker"] and before["pause"] == before["spill"]
        worker_setup.install(client)
        (after,) = client.run(_state).values()
        assert after == before  # the same trimmer: the preload's setup did not run again


class Ballast(WorkerPlugin):
    """A worker plugin that, at the worker's ``at``-th finished task, takes more memory
    than the worker's limit (once per test: a flag file), so that its nanny restarts it."""

    name = "test-ballast"

    def __init__(self, flag: str, at: int):
        self.flag, self.at, self.count, self.held = flag, at, 0, None

    def setup(self, worker):
        self.limit = worker.memory_manager.memory_limit

    def transition(self, key, start, finish, **kwargs):
        if finish != "memory" or os.path.exists(self.flag):
            return
        self.count += 1
        if self.count == self.at:
            open(self.flag, "w").close()
            self.held = np.ones(self.limit, dtype=np.uint8)  # every page touched


def test_a_worker_restarted_for_memory_stops_training_with_an_explanation(tmp_path, caplog):
    plugin = Ballast(str(tmp_path / "flag"), at=20)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 32), dtype=np.float32)
    y = rng.integers(0, 10, 64)
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            memory_limit="512MiB",
            processes=True,
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        client.register_plugin(plugin)
        (address,) = client.scheduler_info()["workers"]
        with pytest.raises(TrainingError) as info, caplog.at_level(logging.WARNING, "dfdl"):
            dfdl.train(
                dfdl.models.mlp((32, 64, 10)),
                data=(x, y),
                batch_size=8,
                steps=8,
                client=client,
                progress=False,
            )
    text = str(info.value)
    assert f"worker {address} (memory limit 512.00 MiB) was restarted by its nanny" in text
    assert "Give the workers more memory" in text and "resume=True" in text
    assert "replaying" not in caplog.text  # not taken for a routine loss
