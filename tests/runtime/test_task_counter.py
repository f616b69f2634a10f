"""dfdl.runtime.task_counter.LazyTaskCounter against Dask's TaskCounter on the same
transitions and the same clock, and installed on real dfdl workers."""

import random

import pytest
from distributed import Client
from distributed import worker_state_machine as wsm
from distributed.worker_state_machine import TaskCounter, TaskState

import dfdl
from dfdl.runtime import task_counter
from dfdl.runtime.task_counter import LazyTaskCounter

STATES = ["waiting", "ready", "executing", "memory", "released", "flight"]


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(wsm, "monotonic", c)
    monkeypatch.setattr(task_counter, "monotonic", c)
    return c


def _replay(counters, clock, seed=0, n_tasks=60, rounds=400):
    """The same random life of tasks (new, moved, forgotten) fed to every counter, with
    the clock advancing between transitions; yields after every transition."""
    rng = random.Random(seed)
    prefixes = [f"node{i}-fwd" for i in range(12)]
    live: list[TaskState] = []
    for r in range(rounds):
        clock.t += rng.uniform(0, 0.01)
        prev = {}
        if live and rng.random() < 0.7:
            for ts in rng.sample(live, k=min(len(live), rng.randint(1, 4))):
                prev[ts] = ts.state
                ts.state = rng.choice(STATES + ["forgotten"])
                if ts.state == "forgotten":
                    live.remove(ts)
        if len(live) < n_tasks and rng.random() < 0.5:
            ts = TaskState((rng.choice(prefixes) + "-abcdef12", r))
            ts.state = "released"
            for c in counters:
                c.new_task(ts)
            prev[ts] = "released"
            ts.state = rng.choice(STATES)
            live.append(ts)
        for c in counters:
            c.transitions(prev)
        yield


def _by_state(counter):
    return dict(counter.cumulative_elapsed(by_prefix=False))


def test_counts_and_integrals_match_dasks_counter(clock):
    dask_counter, lazy = TaskCounter(), LazyTaskCounter()
    for i, _ in enumerate(_replay([dask_counter, lazy], clock)):
        assert lazy.current_count() == dask_counter.current_count()
        assert lazy.current_count(by_prefix=False) == dask_counter.current_count(by_prefix=False)
        if i % 50 == 0:  # reading the totals mid-way must not change later ones
            a, b = dask_counter.cumulative_elapsed(), lazy.cumulative_elapsed()
            assert set(a) == set(b)
            assert all(b[k] == pytest.approx(a[k], rel=1e-9, abs=1e-12) for k in a)
    clock.t += 2.5
    a, b = dask_counter.cumulative_elapsed(), lazy.cumulative_elapsed()
    assert a and set(a) == set(b)
    assert all(b[k] == pytest.approx(a[k], rel=1e-9, abs=1e-12) for k in a)
    sa, sb = _by_state(dask_counter), _by_state(lazy)
    assert all(sb[k] == pytest.approx(sa[k], rel=1e-9) for k in sa)


def test_install_carries_counts_and_totals_over(clock):
    class Worker:
        pass

    worker = Worker()
    worker.state = wsm.WorkerState.__new__(wsm.WorkerState)
    worker.state.task_counter = TaskCounter()
    reference = TaskCounter()
    counters = [worker.state.task_counter, reference]  # the replay reads this list
    replay = _replay(counters, clock, seed=3)
    for _ in range(150):
        next(replay)
    assert task_counter.install(worker)
    lazy = worker.state.task_counter
    assert isinstance(lazy, LazyTaskCounter)
    assert task_counter.install(worker)  # already installed: left as is
    assert worker.state.task_counter is lazy
    counters[0] = lazy  # the rest of the same task life goes to the installed counter
    for _ in replay:
        assert lazy.current_count() == reference.current_count()
    clock.t += 1.0
    a, b = reference.cumulative_elapsed(), lazy.cumulative_elapsed()
    assert a and set(a) == set(b)
    assert all(b[k] == pytest.approx(a[k], rel=1e-9, abs=1e-12) for k in a)


def test_install_leaves_an_unknown_counter_alone():
    class Worker:
        pass

    worker = Worker()
    assert not task_counter.install(worker)  # no state at all
    worker.state = type("State", (), {"task_counter": object()})()
    counter = worker.state.task_counter
    assert not task_counter.install(worker)
    assert worker.state.task_counter is counter


def _worker_counter(dask_worker):
    counter = dask_worker.state.task_counter
    return type(counter).__name__, dict(counter.current_count(by_prefix=False))


def test_dfdl_workers_run_the_lazy_counter_and_report_metrics():
    with (
        dfdl.LocalCluster(2, memory_limit="1GiB", dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        futures = client.map(lambda i: i * i, range(50), key=[f"square-{i}" for i in range(50)])
        assert sum(client.gather(futures)) == sum(i * i for i in range(50))
        counters = client.run(_worker_counter)
        assert {name for name, _ in counters.values()} == {"LazyTaskCounter"}
        assert sum(c.get("memory", 0) for _, c in counters.values()) == 50
        elapsed = client.run(
            lambda dask_worker: dict(dask_worker.state.task_counter.cumulative_elapsed(False))
        )
        assert all(e.get("memory", 0) > 0 for e in elapsed.values() if e)
