"""Values passed directly between the per-worker tasks of a step
(``dfdl.taskgraph.exchange``): received once, failures and silence raise instead of
hanging, and a real two-worker cluster delivers between processes."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time

import pytest
from dask.task_spec import Task, TaskRef

from dfdl.runtime import submit, worker_setup
from dfdl.taskgraph import exchange
from dfdl.taskgraph.step_tasks import run_exchange


def test_a_value_is_received_once():
    exchange.deliver(("k", 0, 1), 7)
    assert exchange.receive(("k", 0, 1), timeout=1) == 7
    with pytest.raises(exchange.ExchangeError, match=r"\('k', 0, 1\)"):
        exchange.receive(("k", 0, 1), timeout=0.05)


def test_a_receiver_waits_for_a_value_sent_later():
    threading.Timer(0.2, exchange.deliver, (("late", 0), 3.5)).start()
    t0 = time.monotonic()
    assert exchange.receive(("late", 0), timeout=10) == 3.5
    assert time.monotonic() - t0 >= 0.15


def test_silence_raises_naming_the_value_and_the_cause():
    with pytest.raises(exchange.ExchangeError, match=r"'never', 0.*within 0 s.*stalled"):
        exchange.receive(("never", 0), timeout=0.1)


def test_a_failed_sender_fails_its_readers_at_once():
    def boom(_):
        raise ValueError("bad tile")

    tasks = (Task("a", boom, TaskRef("x")),)
    with pytest.raises(ValueError, match="bad tile"):
        run_exchange(tasks, ((),), (), ((0, (1,)),), ("w0", "w1"), 0, ("x",), 1)
    t0 = time.monotonic()
    with pytest.raises(
        exchange.ExchangeError, match="'a' failed on another worker: ValueError: bad tile"
    ):
        exchange.receive("a", timeout=30)
    assert time.monotonic() - t0 < 5


def test_two_worker_processes_exchange_values(client):
    worker_setup.install(client)
    a, b = sorted(client.nthreads())
    send = (Task(("v", 0), min, TaskRef("x"), 0),)
    take = (Task(("v", 0), exchange.receive, exchange.name(("v", 0))),
            Task("y", lambda v: v + 1, TaskRef(("v", 0))))  # fmt: skip
    dsk = {
        "x": Task("x", int, -5),
        "A": Task(
            "A", run_exchange, send, ((),), (0,), ((0, (1,)),), (a, b), 0, ("x",), TaskRef("x")
        ),
        "B": Task("B", run_exchange, take, ((), (0,)), (1,), (), (a, b), 1, ()),
    }
    fa, fb = submit.get(client, dsk, ["A", "B"], workers={"A": [a], "B": [b]})
    assert fa.result(timeout=60) == (-5,)
    assert fb.result(timeout=60) == (-4,)
    assert client.who_has([fa, fb]) == {fa.key: (a,), fb.key: (b,)}


def test_a_lost_sender_is_noticed_within_seconds(client):
    worker_setup.install(client)
    a = sorted(client.nthreads())[0]
    gone = "tcp://127.0.0.1:9"  # nothing listens there: a worker that died
    dsk = {"r": Task("r", exchange.receive, "from-the-dead", 60, gone)}
    t0 = time.monotonic()
    (f,) = submit.get(client, dsk, ["r"], workers={"r": [a]})
    with pytest.raises(exchange.PeerLostError, match="tcp://127.0.0.1:9 was lost"):
        f.result(timeout=60)
    assert time.monotonic() - t0 < 30


def test_a_share_whose_worker_was_lost_raises_and_fails_what_it_owed(client):
    # Dask ran it elsewhere since its own worker is gone: values are sent by address
    worker_setup.install(client)
    b = sorted(client.nthreads())[1]
    gone = "tcp://127.0.0.1:9"  # nothing listens there: the worker that died
    tasks = (Task("owed", abs, -1),)
    dsk = {"S": Task("S", run_exchange, tasks, ((),), (0,), ((0, (1,)),), (gone, b), 0, ())}
    (f,) = submit.get(client, dsk, ["S"], workers={"S": [b]})
    with pytest.raises(exchange.PeerLostError, match=f"for the worker at {gone}, which was lost"):
        f.result(timeout=60)
    # its reader on b is told at once, as a lost peer (so the trainer replays)
    t0 = time.monotonic()
    with pytest.raises(exchange.PeerLostError, match="'owed' failed on another worker"):
        client.run(exchange.receive, "owed", 30, workers=[b])
    assert time.monotonic() - t0 < 10


def _hold(path: str, limit: float = 60.0) -> str:
    """A task that runs until ``path`` exists (at most ``limit`` s, so a test that
    waits for it still ends)."""
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return path


def _steal(key: str, victim: str, thief: str, dask_scheduler=None) -> str:
    s = dask_scheduler
    return s.extensions["stealing"].move_task_request(
        s.tasks[key], s.workers[victim], s.workers[thief]
    )


def _ran(key: str, dask_worker=None) -> list[str]:
    return [repr(e) for e in dask_worker.state.story(key)]


def test_a_share_moved_by_work_stealing_goes_back_to_its_worker(client, tmp_path):
    """Dask's work stealing may move a share queued behind other work to an idle worker
    (restrictions are loose so that a lost worker's share runs somewhere): it goes back
    to its own worker and computes there, instead of failing the step."""
    worker_setup.install(client)
    a, b = sorted(client.nthreads())  # one thread each
    go = tmp_path / "go"
    blocker = client.submit(_hold, str(go), workers=[a], pure=False)
    tasks = (Task("mine", abs, -3),)
    dsk = {"moved": Task("moved", run_exchange, tasks, ((),), (0,), (), (a, b), 0, ())}
    (f,) = submit.get(client, dsk, ["moved"], workers={"moved": [a]})
    deadline = time.monotonic() + 30
    while f.key not in {k for ks in client.processing([a]).values() for k in ks}:
        assert time.monotonic() < deadline, "the share never queued on its worker"
        time.sleep(0.02)
    # under load Dask's own balancing may have asked for the same move first ("in-flight")
    moved = client.run_on_scheduler(_steal, f.key, a, b)
    assert moved.startswith("steal-") or moved == "in-flight", moved
    deadline = time.monotonic() + 30
    while "rescheduled" not in " ".join(client.run(_ran, f.key, workers=[b])[b]):
        assert time.monotonic() < deadline, "the steal never reached the idle worker"
        time.sleep(0.05)
    go.touch()
    assert f.result(timeout=60) == (3,)
    assert client.who_has([f]) == {f.key: (a,)}
    blocker.result(timeout=60)


def test_an_undeliverable_value_is_a_lost_peer():
    outbox = exchange.Outbox()
    future = concurrent.futures.Future()
    future.set_exception(OSError("connection refused"))
    outbox.pending.append(("tcp://127.0.0.1:9", future))
    with pytest.raises(exchange.PeerLostError, match="tcp://127.0.0.1:9: OSError"):
        outbox.close()
