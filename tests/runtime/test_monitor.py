"""The training monitor (scheduler plugin) fed with the trainer's events and task timings."""

from __future__ import annotations

import pytest

from dfdl.runtime.monitor import TrainingMonitor


def _started(monitor: TrainingMonitor, t0: float = 100.0) -> None:
    monitor.record(
        {
            "kind": "start",
            "run": "r",
            "model": "m",
            "batch_size": 8,
            "total": 6,
            "threads": 2,
            "t": t0,
        }
    )
    monitor.record({"kind": "token", "run": "r", "token": "0123abcd"})


def _finished(monitor, key, **seconds):
    startstops = [
        {"action": a.replace("_", "-"), "start": 0.0, "stop": s} for a, s in seconds.items()
    ]
    monitor.transition(key, "processing", "memory", startstops=startstops)


def test_steps_timings_and_idle_share():
    m = TrainingMonitor()
    _started(m)
    _finished(m, ("layer-fwd-0123abcd", 0, 0), compute=0.5, transfer=0.25)
    _finished(m, ("layer-bwd-0123abcd", 1, 0, 1), compute=1.0, disk_read=0.5)
    _finished(m, ("other-fwd-ffffffff", 0, 0), compute=9.0)  # not this run's token
    _finished(m, "not-a-dfdl-key", compute=9.0)
    m.record({"kind": "steps", "run": "r", "items": [(0, 2.0, 104.0), (1, 1.5, 104.0)]})
    snap = m.snapshot()
    (run,) = snap["runs"]
    assert run["step"] == 2 and run["total"] == 6 and run["status"] == "running"
    s0, s1 = run["steps"]
    assert (s0["compute_s"], s0["transfer_s"], s0["spill_s"]) == (0.5, 0.25, 0.0)
    assert (s1["compute_s"], s1["spill_s"]) == (1.0, 0.5)
    # the batch's 4 s are shared by its 2 steps: 2 threads x 2 s each, less the busy time
    assert s0["idle_s"] == pytest.approx(4.0 - 0.75)
    assert s1["idle_s"] == pytest.approx(4.0 - 1.5)


def test_samples_per_second_validation_rollback_and_end():
    m = TrainingMonitor()
    _started(m)
    m.record({"kind": "steps", "run": "r", "items": [(0, 3.0, 101.0), (1, 2.0, 102.0)]})
    m.record({"kind": "steps", "run": "r", "items": [(2, 1.0, 103.0)]})
    assert m.snapshot()["runs"][0]["samples_s"] == pytest.approx(2 * 8 / 2.0)
    m.record({"kind": "validation", "run": "r", "step": 3, "metrics": {"loss": 0.5}})
    m.record({"kind": "rollback", "run": "r", "step": 1})
    run = m.snapshot()["runs"][0]
    assert [s["step"] for s in run["steps"]] == [0] and run["rollbacks"] == 1
    assert run["validation"] == [{"step": 3, "loss": 0.5}]
    m.record({"kind": "end", "run": "r", "status": "done"})
    assert m.snapshot()["runs"][0]["status"] == "done"


def test_bad_events_are_ignored():
    m = TrainingMonitor()
    m.log_event("dfdl", {"kind": "steps", "run": "unknown", "items": [(0, 1.0, 1.0)]})
    m.log_event("dfdl", {"no": "kind"})
    m.log_event("other-topic", {"kind": "start", "run": "x"})
    assert m.snapshot() == {"runs": [], "spilled_bytes": {}, "workers": {}, "studies": {}}
