"""Task fusion (dfdl.taskgraph.fuse): fewer tasks, the same values, no lost parallelism."""

from __future__ import annotations

import operator
import weakref
from dataclasses import replace

import numpy as np
import pytest
from dask.local import get_sync
from dask.task_spec import DataNode, Task, TaskRef

import dfdl
import dfdl.models
from dfdl.runtime.session import EngineOptions
from dfdl.taskgraph.fuse import TINY_BYTES, FuseRules, fuse_into_consumers, fused, inline_data
from dfdl.taskgraph.optimize import GraphOptions
from dfdl.taskgraph.tile_exec import combine


def _t(key, fn, *args):
    return Task(key, fn, *(TaskRef(a) if isinstance(a, str) else a for a in args))


def _values(dsk, keys):
    return dict(zip(keys, get_sync(dsk, keys)))


def test_a_chain_runs_in_its_last_task_with_an_earlier_input():
    dsk = {
        "w": DataNode("w", 3.0),
        "x": _t("x", operator.mul, "w", 2.0),  # level 1, read by c and by y
        "a": _t("a", operator.add, "x", 1.0),  # level 2, read by b only
        "b": _t("b", operator.mul, "a", 10.0),  # level 3, read by c only
        "y": _t("y", operator.neg, "x"),
        "c": _t("c", operator.sub, "b", "x"),  # x is of a lower level than b
    }
    fused = fuse_into_consumers(dsk, keep=["c", "y"])
    assert set(fused) == {"w", "x", "y", "c"}
    assert _values(fused, ["c", "y"]) == _values(dsk, ["c", "y"]) == {"c": 64.0, "y": -6.0}


def _sum_of_two_partials():
    return {
        "x1": DataNode("x1", 1.0),
        "x2": DataNode("x2", 2.0),
        "p1": _t("p1", operator.mul, "x1", 3.0),
        "p2": _t("p2", operator.mul, "x2", 3.0),
        "s": _t("s", operator.add, "p1", "p2"),
    }


def test_siblings_of_one_sum_stay_separate_tasks():
    dsk = _sum_of_two_partials()
    fused = fuse_into_consumers(dsk, keep=["s"])
    assert set(fused) == set(dsk)  # p1 and p2 have the same level: they run side by side
    assert _values(fused, ["s"]) == {"s": 9.0}


def test_light_siblings_run_inside_their_consumer():
    dsk = _sum_of_two_partials()
    both = fuse_into_consumers(dsk, keep=["s"], light=lambda k: k in ("p1", "p2"))
    assert set(both) == {"x1", "x2", "s"}
    one = fuse_into_consumers(dsk, keep=["s"], light=lambda k: k == "p2")
    assert set(one) == {"x1", "x2", "p1", "s"}  # p1 is not light: it still runs beside p2
    assert _values(both, ["s"]) == _values(one, ["s"]) == {"s": 9.0}


def test_light_does_not_override_readers_keep_or_stays():
    no_copies = FuseRules(duplicate=False)  # a's readers would both run it
    dsk = {
        "x": DataNode("x", 2.0),
        "a": _t("a", operator.neg, "x"),  # two readers
        "b": _t("b", operator.add, "a", 1.0),  # requested
        "c": _t("c", operator.add, "a", 2.0),
        "d": _t("d", operator.mul, "x", 4.0),  # stays
        "e": _t("e", operator.add, "c", "d"),
        "f": _t("f", operator.neg, "b"),
    }
    fused = fuse_into_consumers(
        dsk, keep=["b", "e", "f"], stays=lambda k: k == "d", light=bool, rules=no_copies
    )
    assert set(fused) == {"x", "a", "b", "d", "e", "f"}  # only c, light, joins e
    assert _values(fused, ["b", "e", "f"]) == {"b": -1.0, "e": 8.0, "f": 1.0}


def test_light_tasks_are_small_non_contractions():
    from types import SimpleNamespace

    from dfdl.ir.graph import Node
    from dfdl.taskgraph.fuse import LIGHT_BYTES
    from dfdl.taskgraph.optimize import _light, _small_contractions

    nodes = [
        Node("small", "Relu", ["x"], ["y"]),
        Node("big", "Relu", ["y"], ["z"]),
        Node("gemm", "MatMul", ["z", "w"], ["v"], phase="bwd"),
        Node("grad", "ReduceSum", ["v"], ["g"], phase="bwd"),
    ]
    sizes = {"small": LIGHT_BYTES, "big": LIGHT_BYTES + 1, "gemm": 1, "grad": 1}
    plan = SimpleNamespace(graph=SimpleNamespace(nodes=nodes), task_bytes=sizes)
    light = _light([SimpleNamespace(plan=plan)], "abc12345")
    assert light(("small-fwd-abc12345", 0, 0))
    assert light(("grad-bwd-partial-abc12345", 0, 1))
    assert not light(("big-fwd-abc12345", 0, 0))
    assert not light(("gemm-bwd-abc12345", 0, 0))  # contractions are never light
    assert not light("small-fwd-abc12345")
    small = _small_contractions([SimpleNamespace(plan=plan)], "abc12345")
    assert small(("gemm-bwd-abc12345", 0, 0))
    assert not small(("small-fwd-abc12345", 0, 0))  # not a contraction
    sizes["gemm"] = LIGHT_BYTES + 1
    assert not _small_contractions([SimpleNamespace(plan=plan)], "abc12345")(
        ("gemm-bwd-abc12345", 0)
    )


def test_a_value_with_two_readers_or_requested_stays():
    dsk = {
        "x": DataNode("x", 2.0),
        "a": _t("a", operator.neg, "x"),  # read twice
        "b": _t("b", operator.add, "a", 1.0),
        "c": _t("c", operator.add, "a", 2.0),
        "d": _t("d", operator.neg, "b"),  # b is requested
    }
    fused = fuse_into_consumers(dsk, keep=["b", "c", "d"])
    assert set(fused) == set(dsk)
    assert _values(fused, ["b", "c", "d"]) == {"b": -1.0, "c": 0.0, "d": 1.0}


def test_tasks_that_stay_are_not_absorbed_but_absorb_their_producers():
    dsk = {
        "x": DataNode("x", 2.0),
        "a": _t("a", operator.neg, "x"),
        "g": _t("g", operator.mul, "a", 3.0),  # a contraction, say
        "u": _t("u", operator.add, "g", 1.0),
    }
    fused = fuse_into_consumers(dsk, keep=["u"], stays=lambda k: k == "g")
    assert set(fused) == {"x", "g", "u"}  # a ran inside g; g stayed its own task
    assert _values(fused, ["u"]) == {"u": -5.0}


def _contraction_then_elementwise():
    return {
        "x": DataNode("x", 2.0),
        "b": DataNode("b", 1.0),  # a bias: level 0
        "g": _t("g", operator.mul, "x", 3.0),  # a contraction, say
        "u": _t("u", operator.add, "g", "b"),  # its bias add
        "w": _t("w", operator.neg, "u"),  # a heavy consumer of the add
    }


def test_a_contraction_runs_inside_its_light_consumer():
    dsk = _contraction_then_elementwise()
    stays = lambda k: k == "g"  # noqa: E731
    light = lambda k: k == "u"  # noqa: E731
    fused = fuse_into_consumers(dsk, keep=["u"], stays=stays, light=light, small=stays)
    assert set(fused) == {"x", "b", "u", "w"}  # the bias add's task also runs the product
    assert _values(fused, ["u"]) == _values(dsk, ["u"]) == {"u": 7.0}
    big = fuse_into_consumers(dsk, keep=["u"], stays=stays, light=light, small=lambda k: False)
    assert set(big) == {"x", "b", "g", "u", "w"}  # a contraction that is not small stays


def test_a_contraction_never_ends_up_in_a_heavy_task():
    dsk = _contraction_then_elementwise()
    stays = lambda k: k == "g"  # noqa: E731
    fused = fuse_into_consumers(dsk, keep=["w"], stays=stays, light=lambda k: k == "u", small=stays)
    assert set(fused) == {"x", "b", "g", "w"}  # u runs inside w, which is heavy: g stays
    assert _values(fused, ["w"]) == {"w": -7.0}
    neither = fuse_into_consumers(dsk, keep=["w"], stays=stays, light=lambda k: False, small=stays)
    assert set(neither) == {"x", "b", "g", "w"}


def test_small_partials_run_inside_their_light_sum():
    dsk = _sum_of_two_partials()  # p1 and p2: the same level
    parts = lambda k: k in ("p1", "p2")  # noqa: E731
    light = lambda k: k == "s"  # noqa: E731
    fused = fuse_into_consumers(dsk, keep=["s"], stays=parts, light=light, small=parts)
    assert set(fused) == {"x1", "x2", "s"}  # one task: p1, p2, then their sum
    assert _values(fused, ["s"]) == {"s": 9.0}
    big = fuse_into_consumers(dsk, keep=["s"], stays=parts, light=light, small=lambda k: False)
    assert set(big) == set(dsk)  # partials that are not small run side by side
    apart = fuse_into_consumers(
        dsk,
        keep=["s"],
        stays=parts,
        light=light,
        small=parts,
        rules=FuseRules(small_partials=False),
    )
    assert set(apart) == set(dsk)  # switched off: p1 would wait for p2 inside s, both stay


def _activation_read_again_later():
    """x -> t -> u -> v -> w -> r: t (an activation) is read by u and again by r, four
    levels later (a backward-pass reader)."""
    return {
        "x": DataNode("x", 3.0),
        "t": _t("t", operator.add, "x", 1.0),  # 4, level 1
        "u": _t("u", operator.mul, "t", 10.0),  # 40, level 2
        "v": _t("v", operator.add, "u", 1.0),  # 41
        "w": _t("w", operator.add, "v", 1.0),  # 42
        "r": _t("r", operator.sub, "w", "t"),  # 38, level 5
        "s": _t("s", operator.add, "r", "u"),  # 78: reads u too
    }


def test_a_light_value_read_again_later_runs_inside_its_first_reader():
    dsk = _activation_read_again_later()
    plain = fuse_into_consumers(dsk, keep=["s"], light=lambda k: k in ("v", "w", "r"))
    assert "t" in plain and "u" in plain  # t not light: a task of its own
    fused = fuse_into_consumers(dsk, keep=["s"], light=bool)
    assert "t" not in fused and "u" in fused
    # u's task returns (u, t); its readers take their part
    assert get_sync(fused, "u") == (40.0, 4.0)
    assert _values(fused, ["s"]) == _values(plain, ["s"]) == _values(dsk, ["s"]) == {"s": 78.0}


def test_a_light_value_is_carried_only_past_late_readers_and_first_inputs():
    light = bool
    # its second reader comes right after u: it would wait for u
    early = {**_activation_read_again_later(), "e": _t("e", operator.neg, "t")}
    early["s"] = _t("s", operator.add, "r", "e")
    assert "t" in fuse_into_consumers(early, keep=["s"], light=light)
    # u is requested: its value must stay u's
    assert "t" in fuse_into_consumers(_activation_read_again_later(), keep=["s", "u"], light=light)
    # u also waits for a value of t's level: t would be serialised behind it
    sibling = {**_activation_read_again_later(), "z": _t("z", operator.neg, "x")}
    sibling["u"] = _t("u", operator.add, "t", "z")
    fused = fuse_into_consumers(sibling, keep=["s"], light=lambda k: k != "z")
    assert "t" in fused
    assert _values(fused, ["s"]) == _values(sibling, ["s"])


def _gradient_read_twice():
    """g (a light gradient, right after the merge s of two tiles' partial sums) is read
    at once by dw and dx, which wait for nothing else."""
    return {
        "x": DataNode("x", 2.0),
        "w": DataNode("w", 3.0),
        "p1": _t("p1", operator.mul, "x", 2.0),
        "p2": _t("p2", operator.mul, "x", 3.0),
        "s": _t("s", operator.add, "p1", "p2"),  # 10, a merge
        "g": _t("g", operator.mul, "s", "x"),  # 20
        "dw": _t("dw", operator.mul, "g", "x"),  # 40
        "dx": _t("dx", operator.mul, "g", "w"),  # 60
    }


def _reads_twice(
    dsk, keep, light=lambda k: k == "g", stays=lambda k: k in ("dw", "dx"), rules=FuseRules()
):
    """Whether g runs inside both its readers."""
    fused = fuse_into_consumers(dsk, keep=keep, light=light, stays=stays, rules=rules)
    assert _values(fused, keep) == _values(dsk, keep)
    return "g" not in fused


def test_a_light_value_read_by_two_contractions_at_once_runs_in_both():
    apart = FuseRules(siblings=False)
    dsk = _gradient_read_twice()
    assert _reads_twice(dsk, ["dw", "dx"], rules=apart)
    assert _values(dsk, ["dw", "dx"]) == {"dw": 40.0, "dx": 60.0}
    # not light, requested, or read by a task that is not a contraction: g stays
    assert not _reads_twice(dsk, ["dw", "dx"], light=lambda k: False, rules=apart)
    assert not _reads_twice(dsk, ["dw", "dx", "g"], rules=apart)
    assert not _reads_twice(dsk, ["dw", "dx"], stays=lambda k: k == "dw", rules=apart)
    # a reader that waits for another value of g's level: g stays
    late = {**dsk, "h": _t("h", operator.neg, "s")}
    late["dx"] = _t("dx", operator.add, "g", "h")
    assert not _reads_twice(late, ["dw", "dx"])
    # more readers than MAX_COPIES: g stays
    three = {**dsk, "dz": _t("dz", operator.neg, "g")}
    assert not _reads_twice(three, ["dw", "dx", "dz"], stays=lambda k: k[0] == "d")
    # g does not follow a merge (its readers do not start at a point where all wait)
    after_one = {**dsk, "g": _t("g", operator.mul, "p1", "x")}
    assert not _reads_twice(after_one, ["dw", "dx"])


def test_a_light_value_read_by_two_contractions_runs_once_with_both_in_one_task():
    runs = []

    def grad(s, x):
        runs.append(1)
        return s * x

    dsk = _gradient_read_twice()
    dsk["g"] = _t("g", grad, "s", "x")
    dsk["ux"] = _t("ux", operator.neg, "dx")  # dx's reader comes first
    dsk["uw"] = _t("uw", operator.add, "dw", "ux")
    keep = ["uw", "ux"]
    want = _values(dsk, keep)
    runs.clear()
    fused = fuse_into_consumers(
        dsk, keep=keep, light=lambda k: k == "g", stays=lambda k: k in ("dw", "dx")
    )
    assert _values(fused, keep) == want == {"ux": -60.0, "uw": -20.0}
    assert runs == [1]  # g ran once, not inside each reader
    # dx's task runs g and dw; dx's readers and dw's reader take their parts
    assert "dx" in fused and not {"g", "dw"} & set(fused)
    assert set(fused["uw"].dependencies) == {"dx", "ux"}
    # a requested reader keeps its own task: g then runs inside both readers
    fused = fuse_into_consumers(
        dsk, keep=[*keep, "dw"], light=lambda k: k == "g", stays=lambda k: k in ("dw", "dx")
    )
    assert {"dw", "dx"} <= set(fused) and "g" not in fused


def _partials_of_two_tiles():
    """c1, c2 (contractions, one per tile) -> light partials q1, q2 -> their merge m;
    n1 reads its tile and the merge (a normalization's apply), r reads c1 much later."""
    return {
        "x": DataNode("x", 2.0),
        "c1": _t("c1", operator.mul, "x", 3.0),  # 6, level 1
        "c2": _t("c2", operator.mul, "x", 5.0),  # 10
        "q1": _t("q1", operator.add, "c1", 1.0),  # 7, level 2
        "q2": _t("q2", operator.add, "c2", 1.0),  # 11
        "m": _t("m", operator.add, "q1", "q2"),  # 18, level 3: a merge
        "n1": _t("n1", operator.sub, "c1", "m"),  # -12
        "n2": _t("n2", operator.sub, "c2", "m"),  # -8
        "z": _t("z", operator.neg, "n1"),
        "r": _t("r", _total, "z", "n2", "c1"),  # 12 - 8 + 6
    }


def _at_producer(dsk, stays=lambda k: k in ("c1", "c2"), keep=("r",), rules=FuseRules()):
    """The fused graph, checked against the plain one."""
    fused = fuse_into_consumers(
        dsk, keep=list(keep), light=lambda k: k[0] in "qmn", stays=stays, rules=rules
    )
    assert _values(fused, list(keep)) == _values(dsk, list(keep))
    return fused


def test_a_light_partial_of_a_merge_runs_inside_the_contraction_it_reads():
    dsk = _partials_of_two_tiles()
    assert _values(dsk, ["r"]) == {"r": 10.0}
    fused = _at_producer(dsk)
    assert not {"q1", "q2"} & set(fused) and {"c1", "c2", "m"} <= set(fused)
    assert get_sync(fused, "c1") == (6.0, 7.0)  # c1's task returns its partial too
    # the merge reads both tiles' partials, so the merge is what waits: without the
    # rule the partials run one after the other inside it
    plain = _at_producer(dsk, rules=FuseRules(partials_at_producer=False))
    assert get_sync(plain, "c1") == 6.0 and not {"q1", "q2"} & set(plain)


def test_on_several_workers_a_tile_s_work_runs_only_in_a_task_of_its_worker():
    """With ``place`` (several worker processes), a tile's partial is not fused into the
    merge (which has no worker, so it would run where the merge runs, and the tile it
    reads would travel), nor carried by a producer of another worker."""
    dsk = _partials_of_two_tiles()
    place = {"c1": 0, "q1": 0, "n1": 0, "z": 0, "c2": 1, "q2": 1, "n2": 1}.get
    no_carry = FuseRules(partials_at_producer=False)
    plain = _at_producer(dsk, rules=no_carry)
    assert not {"q1", "q2"} & set(plain)  # both partials run inside the merge
    placed = fuse_into_consumers(
        dsk, keep=["r"], light=lambda k: k[0] in "qmn", stays=lambda k: k in ("c1", "c2"),
        rules=no_carry, place=place,
    )  # fmt: skip
    assert {"q1", "q2", "m"} <= set(placed)
    assert _values(placed, ["r"]) == _values(dsk, ["r"])
    # the partial still runs inside the contraction of its own worker (carried)...
    fused = fuse_into_consumers(
        dsk, keep=["r"], light=lambda k: k[0] in "qmn", stays=lambda k: k in ("c1", "c2"),
        place=place,
    )  # fmt: skip
    assert not {"q1", "q2"} & set(fused) and get_sync(fused, "c1") == (6.0, 7.0)
    # ...but not inside one of another worker's
    crossed = fuse_into_consumers(
        dsk, keep=["r"], light=lambda k: k[0] in "qmn", stays=lambda k: k in ("c1", "c2"),
        place={**{k: 0 for k in ("c1", "n1", "z")}, "q1": 1, "c2": 1, "q2": 1, "n2": 1}.get,
    )  # fmt: skip
    assert "q1" in crossed and get_sync(crossed, "c1") == 6.0
    assert _values(crossed, ["r"]) == _values(dsk, ["r"])


def test_on_several_workers_a_chain_is_not_fused_across_workers():
    dsk = {
        "x": DataNode("x", 1.0),
        "a": _t("a", operator.add, "x", 1.0),
        "b": _t("b", operator.mul, "a", 3.0),
    }
    assert set(fuse_into_consumers(dsk, keep=["b"])) == {"x", "b"}
    apart = fuse_into_consumers(dsk, keep=["b"], place={"a": 0, "b": 1}.get)
    assert set(apart) == {"x", "a", "b"} and _values(apart, ["b"]) == {"b": 6.0}
    # a task without a worker of its own may run in any reader
    assert set(fuse_into_consumers(dsk, keep=["b"], place={"b": 1}.get)) == {"x", "b"}


def _tiny_merge():
    """Tiles' partials p1, p2 -> their merge m (``combine``) -> the next layer's tiles
    n1, n2 (contractions one level up), and a later reader late of m."""
    return {
        "x": DataNode("x", np.float32(2.0)),
        "p1": _t("p1", operator.mul, "x", 3.0),  # 6
        "p2": _t("p2", operator.mul, "x", 5.0),  # 10
        "m": Task("m", combine, "sum", TaskRef("p1"), TaskRef("p2")),  # 16
        "n1": _t("n1", operator.sub, "p1", "m"),  # -10
        "n2": _t("n2", operator.sub, "p2", "m"),  # -6
        "z": _t("z", operator.add, "n1", "n2"),  # -16
        "late": _t("late", operator.mul, "z", "m"),  # -256
    }


def _merge_fused(dsk, keep, tiny=lambda k: k == "m", **kw):
    stays = kw.pop("stays", lambda k: k in ("p1", "p2", "n1", "n2"))
    fused = fuse_into_consumers(dsk, keep=keep, light=lambda k: False, stays=stays, tiny=tiny, **kw)
    assert _values(fused, keep) == _values(dsk, keep)
    return fused


def test_a_merge_of_tiny_partials_runs_again_inside_its_next_readers():
    dsk = _tiny_merge()
    assert _values(dsk, ["late"]) == {"late": -256.0}
    fused = _merge_fused(dsk, ["late"])
    # n1 and n2 merge the partials themselves; the later reader still reads m's task
    assert {"m", "n1", "n2"} <= set(fused)
    assert set(fused["n1"].dependencies) == {"p1", "p2"}
    assert set(fused["n2"].dependencies) == {"p1", "p2"}
    assert "m" in fused["late"].dependencies
    # with next-level readers only, the merge is no task at all
    alone = {k: v for k, v in dsk.items() if k != "late"}
    fused = _merge_fused(alone, ["z"])
    assert "m" not in fused and set(fused["n1"].dependencies) == {"p1", "p2"}


def test_a_merge_stays_a_task_unless_tiny_plain_and_not_requested():
    dsk = _tiny_merge()

    def inlined(fused):
        return "m" not in fused["n1"].dependencies

    assert inlined(_merge_fused(dsk, ["late"]))
    assert not inlined(_merge_fused(dsk, ["late"], tiny=lambda k: False))
    assert not inlined(_merge_fused(dsk, ["late"], tiny=None))
    assert not inlined(_merge_fused(dsk, ["late", "m"]))  # requested
    # not a merge of partials (any other function): stays
    other = {**dsk, "m": _t("m", operator.add, "p1", "p2")}
    assert not inlined(_merge_fused(other, ["late"]))
    # a merge that absorbed other work is not tiny any more: stays
    heavy = {**dsk, "q": _t("q", operator.neg, "p2")}
    heavy["m"] = Task("m", combine, "sum", TaskRef("p1"), TaskRef("q"))
    fused = fuse_into_consumers(
        heavy,
        keep=["late"],
        light=lambda k: k == "q",
        stays=lambda k: k in ("p1", "p2", "n1", "n2"),
        tiny=lambda k: k == "m",
    )
    assert _values(fused, ["late"]) == _values(heavy, ["late"])
    assert "q" not in fused and "m" in fused["n1"].dependencies
    assert not inlined(_merge_fused(dsk, ["late"], rules=FuseRules(merges_in_readers=False)))


def test_a_partial_stays_out_of_producers_that_are_light_requested_or_read_early():
    def carried(fused):
        return isinstance(get_sync(fused, "c1"), tuple)

    dsk = _partials_of_two_tiles()
    assert carried(_at_producer(dsk))
    assert not carried(_at_producer(dsk, stays=lambda k: False))  # not a contraction
    assert not carried(_at_producer(dsk, keep=("r", "c1")))  # c1's value is requested
    # a reader of c1 right after it that does not wait for the merge: it would wait
    early = {**dsk, "e": _t("e", operator.neg, "c1")}
    early["r"] = _t("r", _total, "z", "n2", "e")
    assert not carried(_at_producer(early))
    # the partial's one reader is not a merge of several tiles
    single = {**dsk, "m": _t("m", operator.add, "q1", 1.0), "n2": _t("n2", operator.neg, "c2")}
    assert not carried(_at_producer(single))


def _total(*values):
    return sum(values)


def test_carried_values_chain_through_successive_readers():
    dsk = {
        "x": DataNode("x", 3.0),
        "t": _t("t", operator.add, "x", 1.0),  # 4
        "u": _t("u", operator.mul, "t", 10.0),  # 40: carries t
        "t2": _t("t2", operator.add, "u", 1.0),  # 41: reads the carrier, carried by u2
        "u2": _t("u2", operator.mul, "t2", 2.0),  # 82
        "v": _t("v", operator.add, "u2", 1.0),
        "w": _t("w", operator.add, "v", 1.0),  # 84
        "r": _t("r", _total, "w", "t", "u", "t2", "u2"),
    }
    fused = fuse_into_consumers(dsk, keep=["r"], light=bool)
    assert not {"t", "u", "t2"} & set(fused)  # one task runs t, u, t2 and u2
    assert get_sync(fused, "u2") == (82.0, 4.0, 40.0, 41.0)
    assert _values(fused, ["r"]) == _values(dsk, ["r"]) == {"r": 84.0 + 4.0 + 40.0 + 41.0 + 82.0}


def test_data_nodes_are_not_fused():
    dsk = {"x": DataNode("x", np.arange(3)), "s": _t("s", np.sum, "x")}
    assert set(fuse_into_consumers(dsk, keep=["s"])) == {"x", "s"}


def test_a_fused_task_runs_its_members_in_dependency_order_whatever_their_order():
    members = [
        _t("c", operator.sub, "b", "a"),
        _t("b", operator.mul, "a", "w"),
        _t("a", operator.add, "x", 1.0),
    ]
    task = fused(*members, key="out")
    assert task.key == "out" and task.dependencies == {"x", "w"}
    assert task({"x": 2.0, "w": 10.0}) == 27.0  # a = 3, b = 30, c = 27
    # dependencies substituted by inline tasks, as fuse_into_consumers does for readers
    inline = task.substitute({"x": Task("x", operator.neg, TaskRef("z"))})
    assert inline.dependencies == {"z", "w"} and inline({"z": -2.0, "w": 10.0}) == 27.0


def test_a_fused_task_drops_each_value_after_its_last_reader():
    alive = weakref.WeakSet()

    class Tracked:
        def __init__(self, v):
            self.v = v
            alive.add(self)

    def count(*_):  # how many Tracked values exist while this member runs
        return len(alive)

    members = [
        _t("a", Tracked, "x"),
        _t("b", lambda a: Tracked(a.v + 1), "a"),  # a's last reader
        _t("c", count, "b"),  # b's last reader; a must be gone here
        _t("d", operator.add, "c", 0),
    ]
    assert fused(*members, key="d")({"x": 1}) == 1


def test_a_fused_task_must_reduce_to_one_value():
    with pytest.raises(ValueError, match="one output"):
        fused(_t("a", operator.neg, "x"), _t("b", operator.neg, "x"), key="a")


def test_ordered_fusion_is_bit_identical_to_dask_fuse(client, resnet_like):
    _switched("ordered", client, resnet_like)


@pytest.fixture(scope="module")
def resnet_like():
    return dfdl.models.resnet(
        in_channels=2, image_size=8, stem=4, stages=(4, 8), blocks_per_stage=1, num_classes=3
    )


def _train(model, client, engine: EngineOptions, tiles=None):
    """Three steps of ``model`` with ``engine``'s choices: the result and its task count."""
    from distributed import get_task_stream

    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 2, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, size=16)
    with get_task_stream(client) as ts:
        res = dfdl.train(
            model, (x, y), optimizer=dfdl.optim.Adam(lr=1e-2), batch_size=8, steps=3,
            shuffle=False, client=client, progress=False,
            tiles=tiles or {"batch": 2, "model": 1}, engine=engine,
        )  # fmt: skip
    return res, len(ts.data)


def test_fused_training_is_bit_identical_with_fewer_tasks(client, resnet_like):
    plain, n_plain = _train(resnet_like, client, _engine(fuse=False))
    fused, n_fused = _train(resnet_like, client, EngineOptions())
    assert fused.fused and not plain.fused
    assert fused.history["loss"] == plain.history["loss"]
    for k, v in plain.params.items():
        np.testing.assert_array_equal(fused.params[k], v, err_msg=k)
    assert n_fused < 0.9 * n_plain, (n_fused, n_plain)  # measured: 353 of 422


def _engine(base: GraphOptions = GraphOptions(), **change) -> EngineOptions:
    """Engine options with the task-graph options' fields in ``change`` (a name of
    :class:`FuseRules` changes the fusion rules)."""
    rules = {k: v for k, v in change.items() if k in FuseRules.__dataclass_fields__}
    graph = {k: v for k, v in change.items() if k not in rules}
    return EngineOptions(graph=replace(base, rules=replace(base.rules, **rules), **graph))


def _switched(option, client, model, base: GraphOptions = GraphOptions(worker_tasks=False)):
    """Training runs with the task-graph ``option`` (a field of GraphOptions or
    FuseRules) off, then on: the two task counts; their losses and weights must be the
    same bits. The task counts are fusion's: per-worker step tasks are off by default."""
    tiles = {"batch": 2, "model": 1, "split_norms": 1}
    runs = []
    for on in (False, True):
        runs.append(_train(model, client, _engine(base, **{option: on}), tiles))
    (off, n_off), (on, n_on) = runs
    assert on.history["loss"] == off.history["loss"]
    for k, v in off.params.items():
        np.testing.assert_array_equal(on.params[k], v, err_msg=k)
    return n_off, n_on


def test_carrying_activations_is_bit_identical_with_fewer_tasks(client, resnet_like):
    n_plain, n_carried = _switched("carry", client, resnet_like)
    assert n_carried < n_plain, (n_carried, n_plain)


def test_siblings_in_one_task_are_bit_identical_with_fewer_tasks(client, resnet_like):
    n_apart, n_together = _switched("siblings", client, resnet_like)
    assert n_together < n_apart, (n_together, n_apart)


def test_partials_at_their_producers_are_bit_identical(client, resnet_like):
    _switched("partials_at_producer", client, resnet_like)


def test_merges_in_readers_are_bit_identical_with_fewer_tasks(resnet_like):
    from distributed import Client

    # on one worker, step tasks and gangs take in a merge left as a task
    # (tests/taskgraph/test_step_tasks.py, test_gang.py): the task counts here are fusion's
    fusion_only = GraphOptions(step_tasks=False, gangs=False)

    with (
        dfdl.LocalCluster(1, threads_per_worker=2, memory_limit="1GiB") as cluster,
        Client(cluster) as one,
    ):
        n_plain, n_inline = _switched("merges_in_readers", one, resnet_like, fusion_only)
    assert n_inline < n_plain, (n_inline, n_plain)


def test_merges_stay_tasks_on_several_workers(client, resnet_like):
    # each reader would fetch every tile's packed output from the other worker
    assert len(client.scheduler_info()["workers"]) == 2
    n_plain, n_inline = _switched("merges_in_readers", client, resnet_like)
    assert n_inline == n_plain


def test_data_runs_inside_the_tasks_that_read_it():
    big = np.arange(TINY_BYTES // 4 + 1, dtype=np.float32)  # over TINY_BYTES
    dsk = {
        "x": DataNode("x", big),  # one reader: inlined whatever its size
        "lr": DataNode("lr", np.float32(0.5)),  # tiny, two readers: one copy each
        "w": DataNode("w", big),  # large, two readers: stays a task
        "k": DataNode("k", np.float32(2.0)),  # requested: stays
        "a": Task("a", np.sum, TaskRef("x")),
        "b": Task("b", operator.mul, TaskRef("a"), TaskRef("lr")),
        "c": Task("c", operator.mul, TaskRef("lr"), TaskRef("k")),
        "d": Task("d", np.max, TaskRef("w")),
        "e": Task("e", np.min, TaskRef("w")),
    }
    out = inline_data(dsk, keep=["b", "c", "d", "e", "k"])
    assert sorted(out) == ["a", "b", "c", "d", "e", "k", "w"]
    assert out["a"].dependencies == set() and out["b"].dependencies == {"a"}
    assert out["c"].dependencies == {"k"} and out["d"].dependencies == {"w"}
    for key in ("b", "c", "d", "e"):
        assert get_sync(out, key) == get_sync(dsk, key)
