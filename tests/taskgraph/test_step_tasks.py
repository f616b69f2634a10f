"""A step's tile tasks as one Dask task (``dfdl.taskgraph.step_tasks``): same values, one
task per step, tiles run in dependency order on the worker's threads."""

from __future__ import annotations

import heapq
import operator
import threading
import time
import weakref
from collections import Counter

import numpy as np
import pytest
from dask.local import get_sync
from dask.task_spec import Alias, DataNode, Task, TaskRef
from dask.utils import key_split
from distributed import get_task_stream

import dfdl
import dfdl.models
from dfdl.runtime.session import EngineOptions
from dfdl.taskgraph import gang, step_tasks
from dfdl.taskgraph.optimize import GraphOptions
from dfdl.taskgraph.step_tasks import group_steps, run_local
from tests.taskgraph.test_fuse import _switched, _train


def _t(key, fn, *args):
    return Task(key, fn, *(TaskRef(a) if isinstance(a, (str, tuple)) else a for a in args))


def _two_steps():
    """Two training-like steps: each reads the weight ``w`` the step before updated, two
    batch tiles through two layers, a loss merged from the tiles, a weight update."""
    dsk = {("w", 0): DataNode(("w", 0), 2.0)}
    for s in (0, 1):
        w = ("w", s)
        for i in (0, 1):
            dsk[("x", s, i)] = DataNode(("x", s, i), float(s + i + 1))
            dsk[("a", s, i)] = _t(("a", s, i), operator.mul, ("x", s, i), w)
            dsk[("b", s, i)] = _t(("b", s, i), operator.neg, ("a", s, i))
        dsk[("loss", s)] = _t(("loss", s), operator.add, ("b", s, 0), ("b", s, 1))
        dsk[("w", s + 1)] = _t(("w", s + 1), operator.sub, w, ("loss", s))
    return dsk


def _steps(dsk):
    return sorted(k for k, v in dsk.items() if getattr(v, "func", None) is run_local)


KEEP = [("loss", 0), ("loss", 1), ("w", 2)]


def test_each_step_runs_as_one_task_with_the_same_values():
    dsk = _two_steps()
    out = group_steps(dsk, keep=KEEP)
    assert _steps(out) == [("a", 0, 0), ("a", 1, 0)]
    # requested keys stay keys; the rest of a step lives inside its task
    assert set(KEEP) <= set(out)
    assert ("b", 0, 1) not in out and ("w", 1) not in out
    assert get_sync(out, KEEP) == get_sync(dsk, KEEP)
    # step 1 reads step 0's weight update from step 0's task
    assert ("a", 0, 0) in out[("a", 1, 0)].dependencies


def test_steps_given_one_name_run_as_one_task_with_the_same_values():
    # a GPU worker's steps (GraphOptions.steps_per_task): the carried weight between the
    # two steps stays inside the task, the losses and the last weight leave it
    dsk = _two_steps()
    out = group_steps(dsk, keep=KEEP, name=lambda s: ("steps", 0))
    assert _steps(out) == [("steps", 0)]
    assert ("w", 1) not in out and set(KEEP) <= set(out)
    assert get_sync(out, KEEP) == get_sync(dsk, KEEP)


def test_step_tasks_take_the_given_names_and_respect_the_byte_budget():
    dsk = _two_steps()
    out = group_steps(dsk, keep=KEEP, name=lambda s: ("train-step-0123abcd", s))
    assert _steps(out) == [("train-step-0123abcd", 0), ("train-step-0123abcd", 1)]
    assert get_sync(out, KEEP) == get_sync(dsk, KEEP)
    # tasks of 10 bytes: step 0 has 5 (a and b twice, the loss), step 1 also the
    # weight update ("w", 1) that step 0's loss feeds
    only_0 = group_steps(dsk, keep=KEEP, weight=lambda k: 10, budget=59)
    assert _steps(only_0) == [("a", 0, 0)]
    assert get_sync(only_0, KEEP) == get_sync(dsk, KEEP)
    assert group_steps(dsk, keep=KEEP, weight=lambda k: 10, budget=49) is None


def test_an_alias_of_a_member_reads_it_from_the_step_s_task():
    dsk = {**_two_steps(), "last loss": Alias("last loss", ("loss", 1))}
    keep = [*KEEP, "last loss"]
    out = group_steps(dsk, keep=keep)
    assert _steps(out) == [("a", 0, 0), ("a", 1, 0)]
    assert get_sync(out, keep) == get_sync(dsk, keep)


def test_a_step_that_would_form_a_cycle_is_left_to_the_fallback():
    dsk = _two_steps()
    # a task outside every step reads a's tile of step 0 and feeds b's tile of step 0
    dsk["outside"] = _t("outside", abs, ("a", 0, 1))
    dsk[("b", 0, 1)] = _t(("b", 0, 1), operator.add, ("a", 0, 1), "outside")
    assert group_steps(dsk, keep=KEEP) is None


def test_nothing_to_group_returns_none():
    assert group_steps({"y": Task("y", abs, -1)}, keep=["y"]) is None


def test_tasks_run_at_once_on_two_threads_in_dependency_order(monkeypatch):
    monkeypatch.setattr(gang, "HELPERS", 1)
    monkeypatch.setattr(gang, "TRACE", [])
    both = threading.Barrier(2, timeout=10)  # breaks unless both tiles wait at once

    def tile(x):
        both.wait()
        return x, threading.current_thread().name

    tasks = (
        Task("sum", lambda a, b: a[0] + b[0], TaskRef("t0"), TaskRef("t1")),
        Task("t0", tile, TaskRef("x")),
        Task("t1", tile, 2),
    )
    out = run_local(tasks, ((1, 2), (), ()), (0, 1, 2), ("x",), 1)
    assert out[0] == 3
    threads = {out[1][1], out[2][1]}
    assert len(threads) == 2 and any(gang.THREAD_PREFIX in t for t in threads)
    runs = {key: thread for key, thread, _, _ in gang.TRACE}
    assert runs["t0"] == out[1][1] and runs["t1"] == out[2][1] and "sum" in runs


def test_the_longest_path_runs_first(monkeypatch):
    monkeypatch.setattr(gang, "HELPERS", 0)
    order = []

    def note(name, *_):
        order.append(name)
        return name

    tasks = (  # priority order: the chain c0 -> c1 -> c2 before the lone task
        Task("c0", note, "c0"),
        Task("c1", note, "c1", TaskRef("c0")),
        Task("c2", note, "c2", TaskRef("c1")),
        Task("lone", note, "lone"),
    )
    run_local(tasks, ((), (0,), (1,), ()), (2, 3), ())
    assert order == ["c0", "c1", "c2", "lone"]


def test_a_value_is_dropped_after_its_last_reader_in_the_step(monkeypatch):
    monkeypatch.setattr(gang, "HELPERS", 0)
    seen = {}

    def make():
        value = np.ones(3)
        seen["a"] = weakref.ref(value)
        return value

    tasks = (
        Task("a", make),
        Task("b", np.sum, TaskRef("a")),
        Task("c", lambda b: (b, seen["a"]() is None), TaskRef("b")),
    )
    ((total, dropped),) = run_local(tasks, ((), (0,), (1,)), (2,), ())
    assert total == 3.0 and dropped


@pytest.mark.parametrize("runner", ["run_local", "run_serial", "run_exchange"])
def test_no_thread_keeps_a_step_s_values_after_it_returns(runner, monkeypatch):
    # the inputs (last step's weights) must go when Dask releases them, not when the
    # thread runs its next step task (the worker held a step's weights for a step more)
    monkeypatch.setattr(gang, "HELPERS", 1)
    seen = []

    def read(x):
        seen.append(step_tasks.STEP_VALUES.values["x"] is x)  # there while it runs
        return float(x.sum())

    weight = np.ones(1000)
    gone = weakref.ref(weight)
    tasks = (
        Task("s", lambda a, b: a + b, TaskRef("a"), TaskRef("b")),
        Task("a", read, TaskRef("x")),
        Task("b", read, TaskRef("x")),
    )
    deps, exports = ((1, 2), (), ()), (0,)
    if runner == "run_exchange":
        out = step_tasks.run_exchange(tasks, deps, exports, (), ("w0",), 0, ("x",), weight)
    else:
        out = getattr(step_tasks, runner)(tasks, deps, exports, ("x",), weight)
    assert out == (2000.0,) and seen == [True, True]
    del weight
    for _ in range(500):  # a helper may still be on its way out of the step
        if gone() is None:
            break
        time.sleep(0.01)
    assert gone() is None
    assert getattr(step_tasks.STEP_VALUES, "values", None) is None


def test_a_task_s_error_is_raised_after_the_running_ones_finish(monkeypatch):
    monkeypatch.setattr(gang, "HELPERS", 1)
    done = threading.Event()

    def slow():
        done.wait(0.2)
        done.set()
        return 1

    def fails():
        raise ValueError("tile 1 failed")

    tasks = (Task("slow", slow), Task("fails", fails), Task("after", abs, TaskRef("fails")))
    with pytest.raises(ValueError, match="tile 1 failed"):
        run_local(tasks, ((), (), (1,)), (0, 2), ())
    assert done.is_set()


@pytest.fixture(scope="module")
def resnet_like():
    return dfdl.models.resnet(
        in_channels=2, image_size=8, stem=4, stages=(4, 8), blocks_per_stage=1, num_classes=3
    )


def test_steps_train_bit_identically_with_fewer_tasks(resnet_like, monkeypatch):
    from distributed import Client

    no_gangs = GraphOptions(gangs=False)  # the count without steps: fusion's alone
    with (
        dfdl.LocalCluster(1, threads_per_worker=2, memory_limit="1GiB") as cluster,
        Client(cluster) as one,
    ):
        n_off, n_on = _switched("step_tasks", one, resnet_like, no_gangs)
        assert n_on < 0.5 * n_off, (n_on, n_off)
        # the dashboard's task stream names each step's task after what it is
        with get_task_stream(one) as ts:
            _train(resnet_like, one, EngineOptions(), {"batch": 2, "model": 1})
    names = Counter(key_split(r["key"]) for r in ts.data)
    assert names[step_tasks.STEP_NAME] == 3, names  # one per step of the 3-step run


def test_no_step_tasks_on_several_workers(client, resnet_like, monkeypatch):
    # one task per step would pull every tile of the step onto one worker
    assert len(client.scheduler_info()["workers"]) == 2
    n_off, n_on = _switched("step_tasks", client, resnet_like)
    assert n_on == n_off


def test_a_share_runs_first_what_another_worker_waits_for():
    """Of the first ``SEND_FIRST`` ready members in priority order, the first whose value
    is sent goes first; past them, or with none sent, the priority order holds."""
    ready = list(range(20))
    heapq.heapify(ready)
    sends = {5: [(1, None)], 12: [(1, None)]}
    order = [step_tasks.next_to_run(ready, sends) for _ in range(3)]
    assert order == [5, 0, 1]  # 12 is past the lookahead until the first ones ran
    ready = list(range(9, 20))
    heapq.heapify(ready)
    assert step_tasks.next_to_run(ready, sends) == 12
    assert step_tasks.next_to_run(ready, {}) == 9
