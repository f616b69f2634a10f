"""Graph submission without hashing every task (dfdl.runtime.submit)."""

from __future__ import annotations

import operator

import pytest
from dask.task_spec import DataNode, Task, TaskRef

from dfdl.runtime import submit


def _graph():
    return {
        "x": DataNode("x", 4),
        "y": Task("y", operator.mul, TaskRef("x"), 3),
        "z": Task("z", operator.add, TaskRef("y"), TaskRef("x")),
    }


def _no_hashing(monkeypatch):
    def refuse(self):
        raise AssertionError("a task was hashed")

    monkeypatch.setattr(Task, "__dask_tokenize__", refuse)


def test_results_match_without_hashing_a_task(client, monkeypatch):
    _no_hashing(monkeypatch)
    assert submit.get(client, _graph(), ["z", "y"], sync=True) == [16, 12]
    futures = submit.get(client, _graph(), ["y"])
    assert [f.result() for f in futures] == [12]


def test_the_client_hashes_without_it(client, monkeypatch):
    # what the module avoids: the check above can fail
    _no_hashing(monkeypatch)
    with pytest.raises(AssertionError, match="hashed"):
        client.get(_graph(), ["z"], sync=True)


def test_every_graph_gets_a_name_of_its_own():
    a, b = submit._expression(_graph()), submit._expression(_graph())
    assert a._name != b._name  # equal graphs, distinct submissions
    assert a.deterministic_token.startswith("dfdl-")


def test_no_large_graph_warning_for_embedded_tiles(client, recwarn):
    import dask
    import numpy as np

    # keys of their own: the session's cluster may still hold another test's "x"
    # (``_graph``), and a key the scheduler has keeps its value (measured: sum 4)
    x = DataNode("large-x", np.ones(2**18))
    dsk = {"large-x": x, "large-s": Task("large-s", np.sum, TaskRef("large-x"))}
    with dask.config.set({"distributed.admin.large-graph-warning-threshold": "1 KiB"}):
        assert submit.get(client, dsk, ["large-s"], sync=True) == [2**18]
        assert not [w for w in recwarn if "large graph" in str(w.message)]
        with pytest.warns(UserWarning, match="large graph"):  # the check can fail
            client.get(dsk, ["large-s"], sync=True)


def _sleep_then(seconds, x):
    import time

    time.sleep(seconds)
    return x


def test_two_threads_submitting_at_once_leave_the_config_as_it_was(client):
    """Overlapping dask.config.set blocks in two threads restore out of order: a waiting
    get that held the quiet threshold while its graph ran left it set for good."""
    import threading
    import time

    import dask

    key = "distributed.admin.large-graph-warning-threshold"
    before = dask.config.get(key)
    results = {}

    def run(name, seconds):
        dsk = {name: Task(name, _sleep_then, seconds, name)}
        results[name] = submit.get(client, dsk, [name], sync=True)

    first = threading.Thread(target=run, args=("quiet-first", 1.0))
    first.start()
    time.sleep(0.3)  # the first one's graph is sent and runs while the second starts
    second = threading.Thread(target=run, args=("quiet-second", 2.0))
    second.start()
    for t in (first, second):
        t.join(60)
    assert results == {"quiet-first": ["quiet-first"], "quiet-second": ["quiet-second"]}
    assert dask.config.get(key) == before
