"""A real scheduler that counts what reaches it, to prove errors happen before submission.

Test modules import the ``client`` and ``nothing_submitted`` fixtures from here.
"""

from __future__ import annotations

import time

import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import SchedulerPlugin

PLUGIN = "dfdl-tests-submissions"


class Submissions(SchedulerPlugin):
    """Counts every graph submission and task transition the scheduler sees."""

    name = PLUGIN

    def __init__(self) -> None:
        self.graphs = 0
        self.transitions = 0

    def update_graph(self, scheduler, **kwargs) -> None:
        self.graphs += 1

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        self.transitions += 1


def _scheduler_state(dask_scheduler) -> dict:
    plugin = dask_scheduler.plugins[PLUGIN]
    return {
        "update_graph": plugin.graphs,
        "plugin_transitions": plugin.transitions,
        "transition_counter": dask_scheduler.transition_counter,
        "tasks": len(dask_scheduler.tasks),
        "task_prefixes": sorted(dask_scheduler.task_prefixes),
    }


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        c.register_plugin(Submissions())
        yield c


def scheduler_state(client) -> dict:
    """The scheduler's counters once every earlier task has been released."""
    deadline = time.monotonic() + 10
    while True:
        state = client.run_on_scheduler(_scheduler_state)
        if state["tasks"] == 0 or time.monotonic() > deadline:
            return state
        time.sleep(0.02)


@pytest.fixture
def nothing_submitted(client):
    """Yields; afterwards asserts the scheduler saw nothing during the test."""
    before = scheduler_state(client)
    yield
    after = client.run_on_scheduler(_scheduler_state)
    assert after == before, "a task reached the scheduler"
