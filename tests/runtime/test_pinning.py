"""Each worker's share of a step stays on its worker (``dfdl.runtime.pinning``): with
the plugin, Dask's work stealing never offers a share queued on a busy worker to an idle
one; without it, it does (so the test can fail)."""

from __future__ import annotations

import contextlib
import time

import pytest
from dask.task_spec import Task

from dfdl.runtime import pinning, submit, worker_setup
from dfdl.taskgraph.step_tasks import run_exchange
from tests.taskgraph.test_exchange import _hold


def _stealable(key, dask_scheduler=None) -> bool:
    return dask_scheduler.tasks[key] in dask_scheduler.extensions["stealing"].key_stealable


def _has_plugin(dask_scheduler=None) -> bool:
    return pinning.PinnedShares.name in dask_scheduler.plugins


@pytest.mark.parametrize("pinned", [True, False])
def test_a_queued_share_is_offered_to_work_stealing_only_without_the_plugin(
    client, tmp_path, pinned
):
    worker_setup.install(client)
    if pinned:
        pinning.install(client)
        pinning.install(client)  # again, as every training does: one plugin
    else:
        with contextlib.suppress(ValueError):  # the module's cluster may have it
            client.unregister_scheduler_plugin(pinning.PinnedShares.name)
    assert client.run_on_scheduler(_has_plugin) is pinned
    a, b = sorted(client.nthreads())  # one thread each
    go = tmp_path / "go"
    blocker = client.submit(_hold, str(go), workers=[a], pure=False)
    key = ("train-step-0badcafe", int(pinned), 0, 0)
    tasks = (Task("mine", abs, -3),)
    dsk = {key: Task(key, run_exchange, tasks, ((),), (0,), (), (a, b), 0, ())}
    (f,) = submit.get(client, dsk, [key], workers={key: [a]})
    deadline = time.monotonic() + 30
    while key not in {k for ks in client.processing([a]).values() for k in ks}:
        assert time.monotonic() < deadline, "the share never queued on its worker"
        time.sleep(0.02)
    try:
        assert client.run_on_scheduler(_stealable, key) is not pinned
    finally:
        go.touch()
    assert f.result(timeout=60) == (3,)
    assert client.who_has([f]) == {f.key: (a,)}
    blocker.result(timeout=60)


def test_is_share_names_the_step_tasks_only():
    assert pinning.is_share(("train-step-ab12cd34", 0, 1, 0))
    assert not pinning.is_share(("train-step-ab12cd34", 0, 1))
    assert not pinning.is_share(("conv-fwd-ab12cd34", 0, 1, 0))
    assert not pinning.is_share("train-step-ab12cd34")
