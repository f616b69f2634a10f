"""Gangs of sibling tasks (``dfdl.taskgraph.gang``): same values, fewer tasks, members side
by side on threads."""

from __future__ import annotations

import operator
import threading

import pytest
from dask.local import get_sync
from dask.task_spec import Alias, DataNode, Task, TaskRef

import dfdl
import dfdl.models
from dfdl.taskgraph import gang
from dfdl.taskgraph.gang import gang_siblings, run_gang
from dfdl.taskgraph.optimize import GraphOptions
from tests.taskgraph.test_fuse import _switched


def _t(key, fn, *args):
    return Task(key, fn, *(TaskRef(a) if isinstance(a, (str, tuple)) else a for a in args))


def _two_layers():
    """Two tiles of a layer ``a`` reading data, two tiles of ``b`` reading them and a
    shared ``w``, summed in ``s``."""
    return {
        ("x", 0, 0): DataNode(("x", 0, 0), 1.0),
        ("x", 0, 1): DataNode(("x", 0, 1), 2.0),
        "w": _t("w", operator.add, 1.0, 2.0),
        ("a", 0, 0): _t(("a", 0, 0), operator.neg, ("x", 0, 0)),
        ("a", 0, 1): _t(("a", 0, 1), operator.neg, ("x", 0, 1)),
        ("b", 0, 0): _t(("b", 0, 0), operator.mul, ("a", 0, 0), "w"),
        ("b", 0, 1): _t(("b", 0, 1), operator.mul, ("a", 0, 1), "w"),
        "s": _t("s", operator.add, ("b", 0, 0), ("b", 0, 1)),
    }


def _total(*values):
    return sum(values)


def _later(dsk, key):
    """``dsk`` with ``s`` reading ``key`` only after three more levels of work on b's
    tiles (as a merge kept for the backward pass is read)."""
    dsk = {**dsk, "q1": _t("q1", operator.add, ("b", 0, 0), ("b", 0, 1))}
    for i in (2, 3, 4):
        dsk[f"q{i}"] = _t(f"q{i}", abs, f"q{i - 1}")
    dsk["s"] = _t("s", _total, "q4", key)
    return dsk


def _gangs(dsk):
    return sorted(k for k, v in dsk.items() if getattr(v, "func", None) is run_gang)


def test_a_level_s_siblings_run_as_one_gang_with_the_same_values(monkeypatch):
    monkeypatch.setattr(gang, "MAX_PHASES", 1)
    dsk = _two_layers()
    out = gang_siblings(dsk, keep=["s"], width=2)
    assert _gangs(out) == [("a", 0, 0), ("b", 0, 0)]
    assert ("a", 0, 1) not in out and ("b", 0, 1) not in out
    assert get_sync(out, "s") == get_sync(dsk, "s") == -9.0
    assert get_sync(out, ("b", 0, 0)) == (-3.0, -6.0)  # the gang's value: every member's


def test_successive_gangs_run_as_one_chain_that_returns_what_others_read():
    dsk = _two_layers()
    out = gang_siblings(dsk, keep=["s"], width=2)
    assert _gangs(out) == [("a", 0, 0)] and ("b", 0, 0) not in out
    assert get_sync(out, "s") == get_sync(dsk, "s")
    # a's tiles are read inside the chain only: its value is b's tiles
    assert get_sync(out, ("a", 0, 0)) == (-3.0, -6.0)
    # a reader of a's tile outside the chain gets it from the chain's value
    late = _later({**dsk, "late": _t("late", operator.neg, ("a", 0, 1))}, "late")
    out = gang_siblings(late, keep=["s"], width=2)
    assert _gangs(out) == [("a", 0, 0)]
    assert get_sync(out, ("a", 0, 0)) == (-2.0, -3.0, -6.0)
    assert get_sync(out, "s") == get_sync(late, "s")


def test_a_chain_is_cut_where_an_outside_reader_would_hold_up_work():
    # "e" reads a's tile at b's level and "f" needs "e" right after: waiting for the
    # chain's end would delay both, so a and b stay two tasks
    dsk = _two_layers()
    dsk["e"] = _t("e", operator.neg, ("a", 0, 0))
    dsk["f"] = _t("f", abs, "e")
    dsk["s"] = _t("s", _total, ("b", 0, 0), ("b", 0, 1), "f")
    out = gang_siblings(dsk, keep=["s"], width=2)
    assert _gangs(out) == [("a", 0, 0), ("b", 0, 0)]
    assert get_sync(out, "s") == get_sync(dsk, "s")
    # an outside reader whose own readers come much later does not cut the chain
    del dsk["f"]
    dsk = _later(dsk, "e")
    out = gang_siblings(dsk, keep=["s"], width=2)
    assert _gangs(out) == [("a", 0, 0)]
    assert get_sync(out, "s") == get_sync(dsk, "s")


def test_an_outside_reader_that_also_reads_the_last_gang_does_not_cut_the_chain(
    monkeypatch,
):
    # "e" reads a's tile and b's: it waits for b, the chain's last gang, anyway
    dsk = _two_layers()
    dsk["e"] = _t("e", operator.add, ("a", 0, 0), ("b", 0, 1))
    dsk["f"] = _t("f", abs, "e")
    dsk["s"] = _t("s", _total, ("b", 0, 0), ("b", 0, 1), "f")
    out = gang_siblings(dsk, keep=["s"], width=2)
    assert _gangs(out) == [("a", 0, 0)]
    assert get_sync(out, "s") == get_sync(dsk, "s")
    assert _gangs(gang_siblings(dsk, keep=["s"], width=2, critical_path=False)) == [
        ("a", 0, 0),
        ("b", 0, 0),
    ]


def test_the_gang_on_the_longest_path_continues_the_chain(monkeypatch):
    # "c" and "d" both read a's tiles one level up; "c" (first by key) ends in "s",
    # while "d" leads on through two more levels: d continues a's chain
    dsk = _two_layers()
    del dsk[("b", 0, 0)], dsk[("b", 0, 1)]
    for name, fn in (("c", operator.neg), ("d", abs)):
        for i in (0, 1):
            dsk[(name, 0, i)] = _t((name, 0, i), fn, ("a", 0, i))
    dsk["q1"] = _t("q1", operator.add, ("d", 0, 0), ("d", 0, 1))
    dsk["q2"] = _t("q2", abs, "q1")
    dsk["s"] = _t("s", _total, ("c", 0, 0), ("c", 0, 1), "q2")
    out = gang_siblings(dsk, keep=["s"], width=2)
    assert _gangs(out) == [("a", 0, 0), ("c", 0, 0)]
    assert ("d", 0, 0) not in out
    assert get_sync(out, "s") == get_sync(dsk, "s") == 6.0
    # taken first by key order, "c" continued the chain, which its sibling "d" then cut
    apart = gang_siblings(dsk, keep=["s"], width=2, critical_path=False)
    assert _gangs(apart) == [("a", 0, 0), ("c", 0, 0), ("d", 0, 0)]


def test_a_chain_stays_within_its_phases_and_byte_budget(monkeypatch):
    dsk = _two_layers()
    size = dict.fromkeys([("a", 0, 0), ("a", 0, 1), ("b", 0, 0), ("b", 0, 1)], 10)
    weight = size.get
    assert _gangs(gang_siblings(dsk, ["s"], 2, weight=weight, budget=40)) == [("a", 0, 0)]
    two = gang_siblings(dsk, ["s"], 2, weight=weight, budget=39)
    assert _gangs(two) == [("a", 0, 0), ("b", 0, 0)]
    assert get_sync(two, "s") == get_sync(dsk, "s")
    monkeypatch.setattr(gang, "MAX_PHASES", 1)
    assert _gangs(gang_siblings(dsk, ["s"], 2)) == [("a", 0, 0), ("b", 0, 0)]


def test_a_lone_merge_between_two_gangs_runs_in_their_chain():
    dsk = _two_layers()
    dsk["m"] = _t("m", operator.add, ("a", 0, 0), ("a", 0, 1))  # merges a's tiles
    dsk[("b", 0, 0)] = _t(("b", 0, 0), operator.mul, ("a", 0, 0), "m")
    dsk[("b", 0, 1)] = _t(("b", 0, 1), operator.mul, ("a", 0, 1), "m")
    apart = gang_siblings(dsk, ["s"], 2)
    assert "m" in apart and len(_gangs(apart)) == 2
    out = gang_siblings(dsk, ["s"], 2, joins=lambda k: k == "m")
    assert _gangs(out) == [("a", 0, 0)] and "m" not in out
    assert get_sync(out, "s") == get_sync(dsk, "s") == 9.0
    # a requested merge keeps its key
    kept = gang_siblings(dsk, ["s", "m"], 2, joins=lambda k: k == "m")
    assert "m" in kept and get_sync(kept, "m") == -3.0


def test_requested_oversized_unfit_or_aliased_siblings_stay_apart(monkeypatch):
    monkeypatch.setattr(gang, "MAX_PHASES", 1)
    dsk = _two_layers()
    assert _gangs(gang_siblings(dsk, keep=["s", ("b", 0, 1)], width=2)) == [("a", 0, 0)]
    assert _gangs(gang_siblings(dsk, keep=["s"], width=1)) == []
    unfit = gang_siblings(dsk, keep=["s"], width=2, fits=lambda k: k[0] != "a")
    # b's own inputs now come from lone tasks, ready at different times: apart too
    assert _gangs(unfit) == []
    aliased = {**dsk, "alias": Alias("alias", ("b", 0, 1))}
    assert _gangs(gang_siblings(aliased, keep=["s", "alias"], width=2)) == [("a", 0, 0)]
    # three siblings do not fit in one gang of two
    three = {
        **dsk,
        ("x", 0, 2): DataNode(("x", 0, 2), 3.0),
        ("a", 0, 2): _t(("a", 0, 2), operator.neg, ("x", 0, 2)),
        "s": _t("s", _total, ("b", 0, 0), ("b", 0, 1), ("a", 0, 2)),
    }
    # (and b's tiles then read lone tasks)
    assert _gangs(gang_siblings(three, keep=["s"], width=2)) == []
    out = gang_siblings(three, keep=["s"], width=3)
    assert _gangs(out) == [("a", 0, 0), ("b", 0, 0)]
    assert get_sync(out, "s") == get_sync(three, "s")


def test_siblings_with_inputs_of_their_own_from_lone_tasks_stay_apart(monkeypatch):
    monkeypatch.setattr(gang, "MAX_PHASES", 1)
    # each tile reads its own weight tile's update (requested, so never in a gang): the
    # updates end at different times, and a gang would hold the first tile back
    dsk = _two_layers()
    dsk["u0"] = _t("u0", operator.add, 1.0, 1.0)
    dsk["u1"] = _t("u1", operator.add, 2.0, 2.0)
    dsk[("a", 0, 0)] = _t(("a", 0, 0), operator.sub, ("x", 0, 0), "u0")
    dsk[("a", 0, 1)] = _t(("a", 0, 1), operator.sub, ("x", 0, 1), "u1")
    out = gang_siblings(dsk, keep=["s", "u0", "u1"], width=2)
    assert ("a", 0, 0) not in _gangs(out)
    assert get_sync(out, "s") == get_sync(dsk, "s")


def test_members_run_at_the_same_time_on_two_threads(monkeypatch):
    monkeypatch.setattr(gang, "HELPERS", 1)
    both = threading.Barrier(2, timeout=10)  # breaks unless both members wait at once

    def member(i):
        both.wait()
        return i, threading.current_thread().name

    monkeypatch.setattr(gang, "TRACE", [])
    members = (Task("m0", member, 0), Task("m1", member, 1))
    (a, ta), (b, tb) = run_gang((members,), ("m0", "m1"), ())
    assert (a, b) == (0, 1)
    assert ta != tb and gang.THREAD_PREFIX in ta + tb
    # the benchmarks' record of each member's run, on the thread that ran it
    runs = {key: (thread, start <= stop) for key, thread, start, stop in gang.TRACE}
    assert runs == {"m0": (ta, True), "m1": (tb, True)}


def test_a_member_s_error_is_raised_on_the_gang_s_thread():
    def fails(x):
        raise ValueError(f"tile {x} failed")

    with pytest.raises(ValueError, match="tile 1 failed"):
        run_gang(((Task("m0", abs, -1), Task("m1", fails, 1)),), ("m0",), ())


def test_every_member_runs_even_without_helpers(monkeypatch):
    monkeypatch.setattr(gang, "HELPERS", 0)
    three = (Task("a", abs, -1), Task("b", abs, -2), Task("c", abs, -3))
    assert run_gang((three,), ("a", "b", "c"), ()) == (1, 2, 3)


@pytest.fixture(scope="module")
def resnet_like():
    return dfdl.models.resnet(
        in_channels=2, image_size=8, stem=4, stages=(4, 8), blocks_per_stage=1, num_classes=3
    )


def test_gangs_train_bit_identically_with_fewer_tasks(resnet_like, monkeypatch):
    from distributed import Client

    no_steps = GraphOptions(step_tasks=False)  # gangs are their fallback

    with (
        dfdl.LocalCluster(1, threads_per_worker=2, memory_limit="1GiB") as cluster,
        Client(cluster) as one,
    ):
        n_off, n_on = _switched("gangs", one, resnet_like, no_steps)
    assert n_on < 0.85 * n_off, (n_on, n_off)


def test_no_gangs_on_several_workers(client, resnet_like, monkeypatch):
    # a gang would pull both batch tiles' inputs onto one worker
    assert len(client.scheduler_info()["workers"]) == 2
    n_off, n_on = _switched("gangs", client, resnet_like)
    assert n_on == n_off
