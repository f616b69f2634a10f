"""``bench/scale_sim.py``'s discrete-event simulation on graphs whose answer is known
(exact makespans, what latency, bandwidth and the scheduler add), and on the graph the
engine builds for two workers (its figures: ``bench/reference/scale-sim-*.json``)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import scale_sim as sim  # noqa: E402
from scale_graph import Cost  # noqa: E402

FREE = sim.Overheads(task_s=0.0, rtt_s=0.0, fetch_s=0.0)
NO_WIRE = sim.Network("instant", 0.0, math.inf)


def test_durations_alone_give_the_exact_makespan():
    tasks = [
        sim.SimTask("a", 0, 1.0, ()),
        sim.SimTask("b", 1, 2.5, ()),
        sim.SimTask("c", 0, 0.5, ("a",)),
        sim.SimTask("d", 1, 1.0, ("b", "c")),  # reads both workers' values
    ]
    res = sim.simulate(tasks, FREE, NO_WIRE)
    assert res.makespan == pytest.approx(3.5)  # b (2.5) then d (1.0); a, c end at 1.5
    assert res.compute_s == [1.5, 3.5]
    assert res.fetches == 1  # d fetches c from worker 0


def test_one_worker_is_the_sum_of_durations_plus_the_scheduler_per_task():
    durations = [0.2, 0.1, 0.4, 0.3]
    tasks = [sim.SimTask(i, 0, d, (i - 1,) if i else ()) for i, d in enumerate(durations)]
    over = sim.Overheads(task_s=0.01, rtt_s=0.002, fetch_s=0.5)  # no fetch on one worker
    res = sim.simulate(tasks, over, sim.Network("n", 1e-3, 1e9))
    # each task waits for its dispatch: scheduler + rtt + one latency; each end sends one
    per_task = over.task_s + over.rtt_s + 1e-3
    expect = sum(durations) + len(durations) * per_task + (len(durations) - 1) * 1e-3
    assert res.makespan == pytest.approx(expect)
    assert res.fetches == 0


def test_latency_and_bandwidth_add_what_they_should_on_a_two_worker_exchange():
    nbytes, bw, lat = 4e6, 2e9, 5e-6
    over = sim.Overheads(task_s=1e-3, rtt_s=2e-4, fetch_s=3e-4)
    tasks = [
        sim.SimTask("a", 0, 1.0, (), nbytes),
        sim.SimTask("b", 1, 1.0, ("a",)),
    ]
    res = sim.simulate(tasks, over, sim.Network("n", lat, bw))
    start_a = over.task_s + lat + over.rtt_s
    finished = start_a + 1.0 + lat + over.task_s  # a's end reaches the scheduler
    dispatched = finished + lat + over.rtt_s
    fetched = dispatched + over.fetch_s + lat + nbytes / bw + lat
    assert res.makespan == pytest.approx(fetched + 1.0)
    assert res.fetched_bytes == nbytes
    # twice the bytes cost one more transfer time, nothing else
    tasks[0].out_bytes = 2 * nbytes
    assert sim.simulate(tasks, over, sim.Network("n", lat, bw)).makespan == pytest.approx(
        fetched + 1.0 + nbytes / bw
    )


def test_the_scheduler_handles_one_message_at_a_time():
    n, cost = 16, 1e-3
    tasks = [sim.SimTask(i, i, 0.0, ()) for i in range(n)]
    res = sim.simulate(tasks, sim.Overheads(cost, 0.0, 0.0), NO_WIRE)
    # n dispatches one after another, then n finishes: the last one ends at n * cost
    assert res.makespan == pytest.approx(n * cost)
    assert res.scheduler_busy_s == pytest.approx(2 * n * cost)


def test_a_link_carries_one_transfer_at_a_time():
    size, bw = 1e6, 1e6  # one second per transfer
    tasks = [
        sim.SimTask("x", 0, 0.0, (), size, source=True, home=0),
        sim.SimTask("r1", 1, 0.0, ("x",)),
        sim.SimTask("r2", 2, 0.0, ("x",)),
    ]
    # worker 0's outgoing link sends to 1, then to 2
    assert sim.simulate(tasks, FREE, sim.Network("n", 0.0, bw)).makespan == pytest.approx(2.0)


def test_a_source_every_worker_holds_moves_nothing():
    tasks = [
        sim.SimTask("batch", 0, 0.0, (), 1e9, source=True, home=None),
        sim.SimTask("r", 3, 1.0, ("batch",)),
    ]
    res = sim.simulate(tasks, FREE, sim.Network("n", 0.0, 1.0))
    assert res.makespan == pytest.approx(1.0) and res.fetches == 0


def test_fit_recovers_known_rates_per_kind():
    recs = [("Conv", f, b, 1e-4 + 2e-11 * f + 1e-10 * b) for f in (1e6, 1e8, 1e9) for b in (0, 1e6)]
    recs += [("elementwise", 0.0, b, 5e-6 + 1e-9 * b) for b in (1e3, 1e5, 1e6, 1e7)]
    model = sim.fit(recs)
    assert model(Cost("Conv", 5e8, 2e6, 0)) == pytest.approx(1e-4 + 1e-2 + 2e-4, rel=1e-6)
    assert model(Cost("elementwise", 0, 4e6, 0)) == pytest.approx(5e-6 + 4e-3, rel=1e-6)


@pytest.fixture(scope="module")
def two_workers():
    sp = sim.step_plan("resnet", sim.RESNET_TINY, batch=8, n=2, tiles=sim.TWO_TILES)
    dsk, carried = sim.step_graph(sp, 2)
    return sp, dsk, carried


def test_the_engine_s_graph_for_two_workers_conserves_the_work(two_workers):
    sp, dsk, carried = two_workers
    model = sim.DurationModel({"*": (1e-3, 0.0, 0.0)})  # 1 ms per tile task
    tasks = sim.sim_tasks(sp, dsk, carried, model)
    run = [t for t in tasks if not t.source]
    assert {t.worker for t in run} == {0, 1}
    # every tile task of one worker's graph runs on two (replicated merges once per
    # worker): at least as much work as on one
    total = sum(t.duration for t in run)
    one = sim.sim_tasks(
        sp,
        *sim.step_graph(
            sim.step_plan("resnet", sim.RESNET_TINY, batch=8, n=1, tiles=sim.TWO_TILES), 1
        ),
        model,
    )
    assert total >= sum(t.duration for t in one if not t.source) - 1e-9
    # the weights' next values come from workers 0 and 1: some sources live on each
    assert {t.home for t in tasks if t.source and t.home is not None} == {0, 1}
    free = sim.simulate(tasks, FREE, NO_WIRE)
    assert max(free.compute_s) <= free.makespan + 1e-9 <= total + 1e-9


def test_slower_networks_and_schedulers_never_shorten_the_step(two_workers):
    sp, dsk, carried = two_workers
    model = sim.DurationModel({"*": (1e-4, 1e-10, 1e-10)})
    tasks = sim.sim_tasks(sp, dsk, carried, model)
    fast = sim.simulate(tasks, FREE, sim.NETWORKS["ib100"]).makespan
    slow = sim.simulate(tasks, FREE, sim.NETWORKS["eth25"]).makespan
    busy = sim.simulate(tasks, sim.Overheads(1e-3, 1e-3, 1e-3), sim.NETWORKS["eth25"])
    assert fast <= slow < busy.makespan
    # one message per task's end, and one per task sent when the graph arrives
    sources = {t.key for t in tasks if t.source}
    run = [t for t in tasks if not t.source]
    roots = [t for t in run if not set(t.deps) - sources]
    assert busy.scheduler_busy_s == pytest.approx(1e-3 * (len(run) + len(roots)))


def test_the_plot_has_one_polyline_per_curve(tmp_path):
    out = tmp_path / "p.svg"
    sim.svg_plot(
        [
            ("strong", {"a": [(1, 1.0), (4, 0.5)], "b (what-if)": [(1, 1.0), (4, 0.9)]}),
            ("weak", {"a": [(1, 1.0), (4, 0.8)]}),
        ],
        str(out),
    )
    text = out.read_text()
    assert text.startswith("<svg") and text.count("<polyline") == 3
    assert 'stroke-dasharray="5,3"' in text


# -- the direct-exchange design: each worker's share of a step one task ----------------


def _share(key, worker, members, deps=()):
    return sim.SimTask(key, worker, sum(m.duration for m in members), deps, program=members)


def test_two_workers_one_exchange_take_send_latency_and_bandwidth():
    nbytes, bw, lat, send, rest = 4e6, 2e9, 5e-6, 3e-4, 1e-4
    over = sim.Overheads(task_s=0.0, rtt_s=0.0, fetch_s=0.0, send_s=send, message_s=rest)
    tasks = [
        _share("s0", 0, (sim.Member("a", 1.0, (), ((1, nbytes),)),)),
        _share("s1", 1, (sim.Member("b", 2.0, (1,)), sim.Member("a", 0.0, remote=True))),
    ]
    res = sim.simulate(tasks, over, sim.Network("n", lat, bw))
    # both shares start one latency after the graph arrives; b waits for a's message
    arrives = lat + 1.0 + send + nbytes / bw + lat + rest
    assert res.makespan == pytest.approx(arrives + 2.0)
    assert res.messages == 1 and res.message_bytes == nbytes
    assert res.compute_s == [1.0, 2.0]
    # the brief's formula with the rest of the software taken away
    over0 = sim.Overheads(0.0, 0.0, 0.0, send_s=send)
    plain = sim.simulate(tasks, over0, sim.Network("n", lat, bw)).makespan
    assert plain == pytest.approx(lat + 1.0 + (send + lat + nbytes / bw) + 2.0)


@pytest.mark.parametrize(("other", "expect"), [(3.0, 4.0), (0.5, 2.0)])
def test_a_share_runs_the_first_member_it_can_and_waits_only_when_none_can(other, expect):
    tasks = [
        _share("s0", 0, (sim.Member("a", 1.0, (), ((1, 0.0),)),)),
        # c comes first but reads a (arrives at 1.0); d reads nothing
        _share(
            "s1",
            1,
            (
                sim.Member("c", 1.0, (2,)),
                sim.Member("d", other, ()),
                sim.Member("a", 0.0, remote=True),
            ),
        ),
    ]
    # other = 3: d runs 0-3 while a is on its way, then c 3-4; other = 0.5: d 0-0.5,
    # the worker waits, c 1-2
    assert sim.simulate(tasks, FREE, NO_WIRE).makespan == pytest.approx(expect)


def test_a_worker_sends_one_message_at_a_time_and_its_link_one_transfer():
    size, bw, send = 1e6, 1e6, 0.25  # one second per transfer
    tasks = [
        _share("s0", 0, (sim.Member("a", 1.0, (), ((1, size), (2, size))),)),
        _share("s1", 1, (sim.Member("r1", 0.0, (1,)), sim.Member("a", 0.0, remote=True))),
        _share("s2", 2, (sim.Member("r2", 0.0, (1,)), sim.Member("a", 0.0, remote=True))),
    ]
    over = sim.Overheads(0.0, 0.0, 0.0, send_s=send)
    res = sim.simulate(tasks, over, sim.Network("n", 0.0, bw))
    # to 1: leaves at 1.25, arrives 2.25; to 2: leaves the loop at 1.5, waits for the
    # link until 2.25, arrives 3.25
    assert res.makespan == pytest.approx(3.25)
    assert res.messages == 2


def test_a_message_for_a_share_not_started_waits_in_its_mailbox():
    tasks = [
        _share("s0", 0, (sim.Member("a", 1.0, (), ((1, 0.0),)),)),
        sim.SimTask("pre", 1, 5.0, ()),
        _share("s1", 1, (sim.Member("b", 1.0, (1,)), sim.Member("a", 0.0, remote=True)), ("pre",)),
    ]
    # a arrives at 1.0, s1 starts at 5.0 (after pre) and runs b at once
    assert sim.simulate(tasks, FREE, NO_WIRE).makespan == pytest.approx(6.0)


def test_a_share_whose_value_never_comes_is_an_error():
    tasks = [_share("s1", 1, (sim.Member("b", 1.0, (1,)), sim.Member("a", 0.0, remote=True)))]
    with pytest.raises(RuntimeError, match="never ended"):
        sim.simulate(tasks, FREE, NO_WIRE)


@pytest.fixture(scope="module")
def two_direct():
    sp = sim.step_plan("resnet", sim.RESNET_TINY, batch=8, n=2, tiles=sim.TWO_TILES)
    return sp, *sim.step_graph(sp, 2, direct=True)


def test_the_engine_s_direct_graph_is_one_share_per_worker_that_sends_what_others_read(
    two_direct, two_workers
):
    sp, dsk, carried = two_direct
    model = sim.DurationModel({"*": (1e-3, 0.0, 0.0)})
    tasks = sim.sim_tasks(sp, dsk, carried, model)
    shares = [t for t in tasks if t.program is not None]
    assert sorted(t.worker for t in shares) == [0, 1]
    sent = {(m.key, p) for t in shares for m in t.program for p, _ in m.sends}
    wanted = {(m.key, t.worker) for t in shares for m in t.program if m.remote}
    assert sent == wanted and wanted  # every value a share waits for, one share sends
    # the same tile tasks as the stage design's graph for two workers
    stages = sim.sim_tasks(two_workers[0], two_workers[1], two_workers[2], model)
    total = sum(m.duration for t in shares for m in t.program)
    assert total == pytest.approx(sum(t.duration for t in stages if not t.source))
    res = sim.simulate(tasks, FREE, NO_WIRE)
    assert res.messages == len(wanted)
    assert max(res.compute_s) <= res.makespan + 1e-9 <= total + 1e-9
    # sending only the parts a reader takes never sends more
    parted = sim.sim_tasks(sp, dsk, carried, model, parts_only=True)
    assert sim.simulate(parted, FREE, NO_WIRE).message_bytes <= res.message_bytes


def test_the_simulated_messages_are_those_the_engine_s_shares_really_send(monkeypatch):
    """Both shares of the tiny ResNet's step run for real (``run_exchange`` on two
    threads of this process, whose mailbox then serves both): every value one sends
    the other is recorded with its size, and the simulation's messages must be the
    same values with the same bytes (a fused task's packed outputs, whole)."""
    import threading

    from dask.sizeof import sizeof
    from dask.task_spec import DataNode

    from dfdl.taskgraph import exchange

    sp = sim.step_plan("resnet", sim.RESNET_TINY, batch=8, n=2, tiles=sim.TWO_TILES)
    dsk, carried = sim.step_graph(sp, 2, direct=True, arrays=True)
    data = {k: v.value for k, v in dsk.items() if isinstance(v, DataNode)}
    sent: dict = {}
    deliver = exchange.deliver

    def record(key, value):
        sent[exchange.name(key)] = sent.get(exchange.name(key), 0) + sizeof(value)
        deliver(key, value)

    monkeypatch.setattr(exchange, "deliver", record)
    shares = [k for k, v in dsk.items() if getattr(v, "func", None) is sim.run_exchange]
    done: dict = {}
    threads = [threading.Thread(target=lambda k=k: done.update({k: dsk[k](data)})) for k in shares]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(done) == 2
    simulated: dict = {}
    for t in sim.sim_tasks(sp, dsk, carried, sim.DurationModel({"*": (0.0, 0.0, 0.0)})):
        for m in t.program or ():
            for _, nbytes in m.sends:
                simulated[exchange.name(m.key)] = simulated.get(exchange.name(m.key), 0) + nbytes
    assert set(simulated) == set(sent)
    for k, nbytes in sent.items():  # sizeof adds a few hundred bytes of Python objects
        assert simulated[k] == pytest.approx(nbytes, rel=0.1, abs=300), k


def test_member_seconds_average_each_task_over_the_timed_steps():
    import run

    rec = lambda k, a, b: {"key": k, "startstops": [{"action": "compute", "start": a, "stop": b}]}  # noqa: E731
    records = [
        rec(("conv-fwd-aaaa", 0, 1), 0.0, 9.0),  # a warm-up step: left out
        rec(("conv-fwd-bbbb", 1, 1), 0.0, 1.0),
        rec(("conv-fwd-cccc", 2, 1), 5.0, 8.0),
        rec(("conv-fwd-cccc", 2, 0), 5.0, 5.5),
        rec("not-a-tile", 0.0, 4.0),
    ]
    assert run.member_seconds(records, 1) == {
        "('conv-fwd', 1)": pytest.approx(2.0),
        "('conv-fwd', 0)": pytest.approx(0.5),
    }


def test_a_real_two_process_run_s_members_are_the_simulated_graph_s():
    """The member times ``bench/scale_out.py`` records of a real 2-process training
    name every member of the graph the simulation builds for it, so a calibration
    replays the run's own times, not the model's."""
    import scale_out

    from dfdl.models import ZOO

    cfg = (sim.RESNET_TINY, 8, "sgd", {"lr": 0.1}, {})
    model = ZOO["resnet"](**sim.RESNET_TINY)
    x, y = scale_out.make_data("resnet", sim.RESNET_TINY, 8 * 8)
    got = scale_out.step_time(2, scale_out.ARMS["shares"], model, x, y, cfg, 4, dict(sim.TWO_TILES))
    assert got["members"] and all(s >= 0 for s in got["members"].values())
    sp = sim.step_plan("resnet", sim.RESNET_TINY, 8, 2, ("sgd", {"lr": 0.1}), {}, got["tiles"])
    dsk, carried = sim.step_graph(sp, 2, direct=True)
    assert sim._members_found(dsk, got["members"]) == 1.0
    own = sim.sim_tasks(
        sp, dsk, carried, sim.DurationModel({"*": (1.0, 0.0, 0.0)}), 1, got["members"]
    )
    # every member lasts its run's time (milliseconds), none the model's 1 s
    assert sim.simulate(own, FREE, NO_WIRE).makespan < 1.0
