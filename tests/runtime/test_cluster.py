"""The embedded cluster: layout, worker environment, message batching."""

from __future__ import annotations

import os

import dask
import pytest
from distributed import Client, LocalCluster

from dfdl.runtime import latency
from dfdl.runtime.cluster import (
    default_workers,
    local_cluster,
    malloc_config,
    pause_at_spill,
    worker_memory_config,
)


def _worker_state(dask_worker):
    return {
        "mmap": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
        "trim": os.environ.get("MALLOC_TRIM_THRESHOLD_"),
        "arenas": os.environ.get("MALLOC_ARENA_MAX"),
        "interval": dask_worker.batched_stream.interval,
    }


def _scheduler_intervals(dask_scheduler):
    return [s.interval for s in dask_scheduler.stream_comms.values()]


def test_default_is_one_process_with_a_thread_per_core(monkeypatch):
    # variables set in the environment win over dask's config (dask's rule); an earlier
    # in-process worker of the test session may have set dask's default here
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    with local_cluster() as cluster, Client(cluster) as client:
        nthreads = client.nthreads()
        assert list(nthreads.values()) == [default_workers()]
        (state,) = client.run(_worker_state).values()
        # heap allocations for tiles under 32 MiB (see DASK_CONFIG), not dask's 64 KiB trim
        assert state["mmap"] == str(32 * 2**20)
        assert state["trim"] == str(128 * 2**20)
        assert state["arenas"] == "1"  # one malloc arena: freed tiles' pages are reused
        assert state["interval"] == latency.INTERVAL_S
        assert client.run_on_scheduler(_scheduler_intervals) == [latency.INTERVAL_S]


def test_explicit_worker_count_gives_single_threaded_processes():
    with local_cluster(2) as cluster, Client(cluster) as client:
        assert sorted(client.nthreads().values()) == [1, 1]
        states = client.run(_worker_state).values()
        assert [s["interval"] for s in states] == [latency.INTERVAL_S] * 2
        assert client.run_on_scheduler(_scheduler_intervals) == [latency.INTERVAL_S] * 2


def _loop_periods(server) -> dict:
    return {k: server.periodic_callbacks[k].callback_time for k in ("profile", "tick")
            if k in server.periodic_callbacks}  # fmt: skip


def _worker_loop_periods(dask_worker):
    return _loop_periods(dask_worker)


def _scheduler_loop_periods(dask_scheduler):
    return _loop_periods(dask_scheduler)


def test_workers_profile_and_tick_every_100_ms_unless_the_caller_says_otherwise():
    with local_cluster(2) as cluster, Client(cluster) as client:
        periods = list(client.run(_worker_loop_periods).values())
        assert periods == [{"profile": 100, "tick": 100}] * 2
        assert client.run_on_scheduler(_scheduler_loop_periods) == {"tick": 100}
    with dask.config.set({"distributed.worker.profile.interval": "20ms"}):
        with local_cluster(1) as cluster, Client(cluster) as client:
            assert list(client.run(_worker_loop_periods).values()) == [{"profile": 20, "tick": 100}]


def test_small_memory_limits_keep_less_free_heap(monkeypatch):
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    with local_cluster(1, memory_limit="512MiB") as cluster, Client(cluster) as client:
        (state,) = client.run(_worker_state).values()
    # an eighth of the limit may stay as free heap; heap blocks up to a quarter of that
    assert state["trim"] == str(64 * 2**20)
    assert state["mmap"] == str(16 * 2**20)
    # a large worker keeps DASK_CONFIG's thresholds
    assert sorted(malloc_config(8 * 2**30).values()) == [32 * 2**20, 128 * 2**20]
    assert malloc_config("auto") == malloc_config(None) == malloc_config(0) == {}


MEMORY = "distributed.worker.memory."


def test_dfdl_workers_pause_at_the_spill_line_and_the_planner_reads_it():
    with local_cluster(1, memory_limit="1GiB") as cluster, Client(cluster) as client:
        config = worker_memory_config(client)
    assert config[MEMORY + "pause"] == config[MEMORY + "spill"] == 0.7  # Dask's spill line
    assert config[MEMORY + "terminate"] == 0.95  # read from the nanny
    assert worker_memory_config() == {MEMORY + "pause": 0.7}  # the embedded cluster's


def test_the_planner_reads_the_thresholds_of_workers_it_did_not_start():
    """A cluster dfdl did not start keeps Dask's pause line (0.8), or its own settings."""
    with (
        dask.config.set({MEMORY + "spill": 0.65, MEMORY + "terminate": False}),
        LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="1GiB") as cluster,
        Client(cluster) as client,
    ):
        default_pause = dask.config.get(MEMORY + "pause")
        config = worker_memory_config(client)
    assert config == {
        MEMORY + "target": 0.6,
        MEMORY + "spill": 0.65,
        MEMORY + "pause": default_pause,
        MEMORY + "terminate": False,
    }


@pytest.mark.parametrize(
    "spill, pause, want",
    [(0.7, 0.8, {MEMORY + "pause": 0.7}), (0.7, 0.6, {}), (False, 0.8, {}), (0.7, False, {})],
)
def test_pause_at_spill_only_lowers_a_pause_line_above_spilling(spill, pause, want):
    with dask.config.set({MEMORY + "spill": spill, MEMORY + "pause": pause}):
        assert pause_at_spill() == want


def test_install_on_a_plain_cluster_also_reaches_workers_started_later():
    from distributed import LocalCluster

    with (
        LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        latency.install(client, interval=0.001)
        cluster.scale(2)
        client.wait_for_workers(2)
        states = client.run(_worker_state).values()
        assert [s["interval"] for s in states] == [0.001, 0.001]
        assert client.run_on_scheduler(_scheduler_intervals) == [0.001, 0.001]


def test_byte_batches_stay_under_the_budget():
    from dfdl.runtime.cluster import byte_batches

    sizes = [4, 4, 4, 9, 1, 1, 1]
    parts = byte_batches(sizes, 8)
    assert [i for p in parts for i in p] == list(range(len(sizes)))  # all, in order
    for p in parts:
        assert sum(sizes[i] for i in p) <= 8 or len(p) == 1  # only a lone item may exceed
    assert len(parts) == 4
    assert byte_batches(sizes, None) == [range(7)]
    assert byte_batches([], 8) == [range(0)]


def test_byte_batches_bound_what_each_owner_sends():
    """A gather takes at most the budget from each worker per batch (a worker reads its
    spilled tiles back to send them), however the tiles alternate between workers."""
    from dfdl.runtime.cluster import byte_batches

    sizes = [4, 4, 4, 4, 4, 4, 9, 1]
    owners = ["a", "b", "a", "b", "a", "a", "b", "b"]
    parts = byte_batches(sizes, 8, owners)
    assert [i for p in parts for i in p] == list(range(len(sizes)))
    for p in parts:
        for who in set(owners):
            mine = [sizes[i] for i in p if owners[i] == who]
            assert sum(mine) <= 8 or len(mine) == 1
    assert parts == [range(0, 4), range(4, 6), range(6, 7), range(7, 8)]


def _kill(name, client, cluster) -> None:
    import signal

    pid = cluster.workers[name].process.pid
    os.kill(pid, signal.SIGKILL)


def _names(client) -> set:
    return {w["name"] for w in client.scheduler_info()["workers"].values()}


def _wait_for(predicate, timeout: float) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_worker_killed_again_while_an_earlier_loss_timer_runs_keeps_its_nanny():
    """Dask's SpecCluster drops a nanny when, lost-worker-timeout after its worker left,
    no worker of that name is registered: a worker killed a second time just before the
    first kill's timer fires is restarting then, and lost its nanny for good."""
    import time

    timeout = 8.0  # a restart takes 0.5-1.5 s on 2 cores, several seconds under load
    with (
        dask.config.set({"distributed.deploy.lost-worker-timeout": f"{timeout}s"}),
        local_cluster(2) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2, timeout=30)
        _kill(1, client, cluster)
        assert _wait_for(lambda: 1 not in _names(client), 10)
        # the timer started when the scheduler removed the worker, at most one poll
        # (and one scheduler_info round trip) before this
        removed = time.monotonic()
        assert _wait_for(lambda: 1 in _names(client), 10)  # restarted by its nanny
        # the second kill lands 0.2 s before the timer fires: a restart takes longer
        # (0.5-1.5 s measured on 2 cores), so the worker is away when it fires
        time.sleep(max(0.0, removed + timeout - 0.2 - time.monotonic()))
        _kill(1, client, cluster)
        assert _wait_for(lambda: 1 not in _names(client), 10)
        while True:  # the last reading at or after the timer fired
            lost_when_the_timer_fired = 1 not in _names(client)
            if time.monotonic() >= removed + timeout + 0.05:
                break
            time.sleep(0.01)
        assert lost_when_the_timer_fired  # the race this test is about did happen
        assert _wait_for(lambda: len(_names(client)) == 2, 30)
        time.sleep(timeout)  # the second kill's timer finds the worker back
        assert sorted(cluster.workers) == [0, 1]
        assert len(_names(client)) == 2


#: leaves a semaphore registered with multiprocessing's resource tracker, as a worker
#: start cut short by Ctrl-C does; with argv[1] == "cluster" the tracker is the one
#: dfdl's embedded cluster starts
_LEFT_SEMAPHORE = """
import sys
from multiprocessing import resource_tracker

if __name__ == "__main__":
    if sys.argv[1] == "cluster":
        import dfdl

        with dfdl.LocalCluster(1):
            pass
    resource_tracker.register("/dfdl-test-left-behind", "semaphore")
"""


@pytest.mark.skipif(os.name != "posix", reason="the resource tracker is POSIX's")
def test_the_resource_tracker_of_dfdl_s_cluster_cleans_up_without_a_word(tmp_path):
    """After ``dfdl: interrupted`` the command prints nothing more: the tracker dfdl's
    cluster starts removes a semaphore left registered without its two warnings, which
    a tracker started otherwise prints (the control)."""
    import subprocess
    import sys

    script = tmp_path / "left.py"
    script.write_text(_LEFT_SEMAPHORE)
    plain = subprocess.run(
        [sys.executable, str(script), "plain"], capture_output=True, text=True, timeout=120
    )
    assert plain.returncode == 0, plain.stderr
    assert "leaked semaphore" in plain.stderr  # what the tracker says unless told not to
    ours = subprocess.run(
        [sys.executable, str(script), "cluster"], capture_output=True, text=True, timeout=120
    )
    assert ours.returncode == 0, ours.stderr
    assert "resource_tracker" not in ours.stderr, ours.stderr
