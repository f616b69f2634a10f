"""Values passed directly between the per-worker tasks of a step
(``dfdl.taskgraph.exchange``): received once, failures and silence raise instead of
hanging, and a real two-worker cluster delivers between processes."""

from __future__ import annotations

import concurrent.futures
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


def test_a_share_that_reaches_another_worker_than_its_own_raises_at_once(client):
    # its own worker was lost and Dask ran it elsewhere: values are sent by address
    worker_setup.install(client)
    a, b = sorted(client.nthreads())
    tasks = (Task("v", abs, -1),)
    dsk = {"S": Task("S", run_exchange, tasks, ((),), (0,), (), (a, b), 0, ())}
    (f,) = submit.get(client, dsk, ["S"], workers={"S": [b]})
    with pytest.raises(exchange.PeerLostError, match=f"for the worker at {a}, which was lost"):
        f.result(timeout=60)


def test_an_undeliverable_value_is_a_lost_peer():
    outbox = exchange.Outbox()
    future = concurrent.futures.Future()
    future.set_exception(OSError("connection refused"))
    outbox.pending.append(("tcp://127.0.0.1:9", future))
    with pytest.raises(exchange.PeerLostError, match="tcp://127.0.0.1:9: OSError"):
        outbox.close()
