"""The trainer's cluster state: weights scattered and gathered in memory-bounded batches."""

from __future__ import annotations

import os
import signal
import threading
import time

import dask
import numpy as np
import pytest
from distributed import Client

import dfdl
import dfdl.models
from dfdl.errors import TrainingError
from dfdl.ops.registry import TensorType
from dfdl.runtime.cluster import transfer_budget
from dfdl.runtime.trainer import ClusterState, gather_watching
from tests.taskgraph.test_exchange import _hold


def test_scatter_and_gather_in_batches_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    values = {f"w{i}": rng.standard_normal((256, 256), dtype=np.float32) for i in range(6)}
    chunks = {k: ((128, 128), (64, 64, 64, 64)) for k in values}
    types = {k: TensorType(v.shape, v.dtype) for k, v in values.items()}
    total = sum(v.nbytes for v in values.values())
    with (
        dask.config.set(  # limits far below a Python process: only managed memory counts
            {f"distributed.worker.memory.{k}": False for k in ("spill", "pause", "terminate")}
        ),
        dfdl.LocalCluster(2, memory_limit="2MiB", local_directory=str(tmp_path)) as cluster,
        Client(cluster) as client,
    ):
        budget = transfer_budget(client)
        assert budget == int(0.1 * 2 * 2 * 2**20)
        assert total > 3 * budget  # several batches
        state = ClusterState.scatter(client, values, chunks)
        got = state.gather(client, types)
    for k, v in values.items():
        np.testing.assert_array_equal(got[k], v)


def _slow_square(x):
    import time

    time.sleep(0.2)
    return x * x


def test_gather_returns_results_while_workers_run(client):
    futures = client.map(_slow_square, range(6))
    assert gather_watching(client, futures, poll=0.1, give_up=0.5) == [x * x for x in range(6)]


PAUSED = {
    "distributed.worker.memory.pause": 0.01,  # 1% of 1 GiB: below any Python process
    "distributed.worker.memory.terminate": False,
    "distributed.worker.memory.monitor-interval": "10ms",
}


@pytest.fixture
def paused_client(tmp_path):
    with (
        dask.config.set(PAUSED),
        dfdl.LocalCluster(2, memory_limit="1GiB", local_directory=str(tmp_path)) as cluster,
        # scatter waits this long for a running worker (default 30 s) before it gives up
        Client(cluster, timeout="5s") as client,
    ):
        deadline = time.time() + 30  # (wait_for_workers waits for running ones: never)
        while time.time() < deadline:
            statuses = [w["status"] for w in client.scheduler_info()["workers"].values()]
            if statuses == ["paused", "paused"]:
                break
            time.sleep(0.05)
        assert statuses == ["paused", "paused"]
        yield client


def test_gather_gives_up_on_workers_paused_for_memory(paused_client):
    futures = paused_client.map(_slow_square, range(4))
    with pytest.raises(TrainingError, match=r"paused by Dask's memory monitor for 1 s \(tls://"):
        gather_watching(paused_client, futures, poll=0.2, give_up=1.0)
    # given up on: the futures are cancelled, not left wanted on the cluster
    assert all(f.cancelled() for f in futures)


def _fail(x):
    raise ValueError(f"tile {x} failed")


def test_the_first_failed_task_raises_without_waiting_for_the_others(client, tmp_path):
    """A share that fails (its worker lost) while another waits for its values: the
    error comes at once, so the recovery can replay, not after the other's timeout."""
    go = tmp_path / "go"
    slow = client.submit(_hold, str(go), pure=False)  # runs until the test ends it
    failed = client.submit(_fail, 2, pure=False)
    try:
        with pytest.raises(ValueError, match="tile 2 failed"):
            gather_watching(client, [slow, failed], poll=0.1, give_up=30)
        assert not slow.done()  # raised while the other still ran
    finally:
        go.touch()  # the worker's thread is free again for the next tests
        client.cancel([slow, failed])


def test_an_interrupted_gather_cancels_its_futures(client, tmp_path):
    """Ctrl-C while waiting: the tasks leave the scheduler although the caller still
    holds the futures (as a pending done-callback does, until its task ends)."""
    go = tmp_path / "go"
    futures = [client.submit(_hold, str(go), i, pure=False) for i in (30.0, 31.0)]
    try:
        deadline = time.monotonic() + 30
        while sum(len(v) for v in client.processing().values()) < 2:  # both running
            assert time.monotonic() < deadline
            time.sleep(0.05)
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
        try:
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                gather_watching(client, futures, poll=0.1, give_up=30)
        finally:
            timer.cancel()
            signal.signal(signal.SIGINT, previous)
        keys = [f.key for f in futures]  # the session's cluster holds other tests' keys
        deadline = time.monotonic() + 30
        while client.run_on_scheduler(_known, keys) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.run_on_scheduler(_known, keys) == []
        assert all(f.cancelled() for f in futures)
    finally:
        go.touch()  # the workers' threads are free again for the next tests


def _known(keys, dask_scheduler) -> list:
    return [k for k in keys if k in dask_scheduler.tasks]


def train_tiny_mlp(client):
    """Two SGD steps of an 8-16-3 MLP on random data, on ``client``."""
    rng = np.random.default_rng(0)
    data = (rng.standard_normal((16, 8), dtype=np.float32), rng.integers(0, 3, 16))
    return dfdl.train(
        dfdl.models.mlp((8, 16, 3)),
        data=data,
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=0.1),
        batch_size=8,
        steps=2,
        client=client,
        progress=False,
    )


def test_training_on_paused_workers_is_an_error_not_a_hang(paused_client):
    with pytest.raises(TrainingError, match="paused by Dask's memory monitor"):
        train_tiny_mlp(paused_client)


def test_data_inside_its_readers_trains_bit_identically_with_fewer_tasks(client):
    from tests.taskgraph.test_fuse import _switched

    model = dfdl.models.resnet(
        in_channels=2, image_size=8, stem=4, stages=(4, 8), blocks_per_stage=1, num_classes=3
    )
    n_off, n_on = _switched("inline_data", client, model)
    assert n_on < n_off, (n_on, n_off)


def test_task_bodies_pickled_once_train_bit_identically(client, monkeypatch):
    from dfdl.taskgraph import optimize, pack
    from tests.taskgraph.test_fuse import _switched

    model = dfdl.models.resnet(
        in_channels=2, image_size=8, stem=4, stages=(4, 8), blocks_per_stage=1, num_classes=3
    )
    graphs = []

    def pack_small(dsk):  # this tiny model's task bodies are under MIN_BYTES
        graphs.append(pack.pack_bodies(dsk, min_bytes=256))
        return graphs[-1]

    monkeypatch.setattr(optimize, "pack_bodies", pack_small)
    n_off, n_on = _switched("pack", client, model)
    assert n_on == n_off
    packed = [t for g in graphs for t in g.values() if getattr(t, "func", None) is pack.run_packed]
    assert packed, "no task body was packed"


def test_batch_tiles_are_sent_to_the_workers_whose_shares_read_them(client):
    """trainer._send_batches: data in the graph and a large tile go straight to the
    workers of the pinned tasks that read them (a copy each where two workers read one),
    a task reading rows runs on each reader's worker; the values are unchanged."""
    from dask.task_spec import DataNode, Task, TaskRef

    from dfdl.runtime import submit
    from dfdl.runtime.trainer import _send_batches

    a, b = sorted(client.scheduler_info()["workers"])
    x, big, rows = ("x-input-t1", 0, 0), ("y-input-t1", 0, 0), ("r-input-t1", 0, 0)
    dsk = {
        x: DataNode(x, np.arange(6.0)),
        rows: Task(rows, np.arange, 3.0),
        ("p", 0, 0): Task(("p", 0, 0), np.dot, TaskRef(x), TaskRef(x)),
        ("q", 0, 1): Task(("q", 0, 1), np.dot, TaskRef(x), TaskRef(big)),
        ("r", 0, 0): Task(("r", 0, 0), np.sum, TaskRef(rows)),
        ("s", 0, 1): Task(("s", 0, 1), np.max, TaskRef(rows)),
    }
    pinned = {("p", 0, 0): [a], ("q", 0, 1): [b], ("r", 0, 0): [a], ("s", 0, 1): [b]}
    keep = _send_batches(client, dsk, {big: np.full(6, 2.0)}, {x, big, rows}, pinned)
    where = client.who_has(keep)
    # x: one copy per reading worker, under keys of their own; the large tile on its reader
    assert sorted(where.values()) == [(a,), (b,), (b,)], where
    assert x not in dsk and big not in dsk and rows not in dsk
    copies = [k for k in dsk if k[0] == "r-input-t1"]
    assert len(copies) == 2 and sorted(pinned[k][0] for k in copies) == [a, b]
    wanted = [("p", 0, 0), ("q", 0, 1), ("r", 0, 0), ("s", 0, 1)]
    got = client.gather(submit.get(client, dsk, wanted, workers=pinned))
    assert got == [55.0, 30.0, 3.0, 2.0]
    # with no worker pinned, as before: the data stays in the graph, large tiles anywhere
    dsk2 = {
        x: DataNode(x, np.arange(6.0)),
        ("q", 0, 1): Task(("q", 0, 1), np.dot, TaskRef(x), TaskRef(big)),
    }
    keep2 = _send_batches(client, dsk2, {big: np.full(6, 2.0)}, {x, big}, None)
    assert x in dsk2 and [f.key for f in keep2] == [big]
    assert client.gather(submit.get(client, dsk2, [("q", 0, 1)])) == [30.0]
    # a reader's worker that has left: its tile goes to a worker still there
    gone = "tls://127.0.0.1:9"
    dsk3 = {
        x: DataNode(x, np.arange(6.0)),
        ("p", 0, 0): Task(("p", 0, 0), np.dot, TaskRef(x), TaskRef(x)),
    }
    keep3 = _send_batches(client, dsk3, {}, {x}, {("p", 0, 0): [gone]})
    assert set(client.who_has(keep3)[x]) <= {a, b} and x not in dsk3
    assert client.gather(submit.get(client, dsk3, [("p", 0, 0)])) == [55.0]
