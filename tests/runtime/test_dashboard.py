"""The dashboard's ``/dfdl/json`` body (:func:`dfdl.runtime.dashboard.json_body`); the page
itself, in a browser during a training run, is ``tests/test_dashboard.py``."""

from __future__ import annotations

import json
import math

import numpy as np
from dask.utils import format_bytes

import dfdl
from dfdl.models import ZOO
from dfdl.runtime.dashboard import json_body, workers_table
from dfdl.runtime.monitor import TrainingMonitor


def test_non_finite_numbers_become_null_in_strict_json():
    snap = {
        "runs": [{"steps": [{"loss": math.nan}, {"loss": 0.25}], "val": (math.inf, -math.inf)}],
        "spilled_bytes": {"w": 3},
    }
    body = json_body(snap)
    parsed = json.loads(body, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert parsed == {
        "runs": [{"steps": [{"loss": None}, {"loss": 0.25}], "val": [None, None]}],
        "spilled_bytes": {"w": 3},
    }


def test_a_monitor_with_a_nan_validation_loss_serves_strict_json():
    m = TrainingMonitor()
    m.record(
        {"kind": "start", "run": "r", "model": "m", "batch_size": 8, "total": 4, "threads": 2,
         "t": 100.0}
    )  # fmt: skip
    m.record({"kind": "token", "run": "r", "token": "0123abcd"})
    m.record({"kind": "steps", "run": "r", "items": [(0, 2.0, 101.0)]})
    m.record({"kind": "validation", "run": "r", "step": 1, "metrics": {"val_loss": math.nan}})
    snap = m.snapshot()
    assert "NaN" in json.dumps(snap)  # what the page served before
    body = json_body(snap)
    assert "NaN" not in body
    assert json.loads(body)["runs"][0]["steps"][0]["loss"] == 2.0


def test_the_workers_table_names_each_workers_device():
    html = workers_table(
        {
            "tls://a": {"device": "gpu", "gpu": "1", "device_memory_bytes": 3 << 20,
                        "spilled_bytes": 0},
            "tls://b": {"device": "cpu", "gpu": None, "device_memory_bytes": None,
                        "spilled_bytes": 5 << 30},
        }
    )  # fmt: skip
    a, b = html.split("<tr>")[2:4]
    assert "gpu 1" in a and format_bytes(3 << 20) in a
    assert "<td>cpu</td>" in b and format_bytes(5 << 30) in b


def _device_rows(dask_scheduler=None) -> dict:
    from dfdl.runtime.monitor import monitor_of

    return monitor_of(dask_scheduler).snapshot()["workers"]


def test_cpu_workers_report_no_gpu_and_no_device_memory(client):
    x = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    dfdl.train(ZOO["mlp"](sizes=(4, 8, 3)), data=(x, np.arange(16) % 3), batch_size=8,
               client=client)  # fmt: skip
    rows = client.run_on_scheduler(_device_rows)
    assert rows and set(rows) == set(client.scheduler_info()["workers"])
    for row in rows.values():
        assert row["device"] == "cpu" and row["gpu"] is None
        assert row["device_memory_bytes"] is None


def test_the_trials_view_draws_every_trial_of_the_latest_study():
    """Trials of dfdl.tune (runs tagged with a study and a trial number) on the page: one
    validation-loss line per trial of the latest study, coloured by status, and its
    summary; the page's Bokeh document built on a scheduler holding the monitor."""
    from types import SimpleNamespace

    from bokeh.document import Document

    from dfdl.runtime.dashboard import TRIAL_COLORS, _page
    from dfdl.runtime.monitor import PLUGIN_NAME

    m = TrainingMonitor()
    for study, trial, losses, status in [
        ("old", 0, [3.0], "done"),
        ("s", 0, [2.0, 1.0], "done"),
        ("s", 1, [2.5], "stopped"),
        ("s", 2, [], "failed"),
    ]:
        run = f"{study}-{trial}"
        m.record({"kind": "start", "run": run, "model": "m", "batch_size": 4, "total": 8,
                  "study": study, "trial": trial})  # fmt: skip
        m.record({"kind": "token", "run": run, "token": "0123abcd"})
        for i, v in enumerate(losses):
            m.record({"kind": "validation", "run": run, "step": 4 * (i + 1),
                      "metrics": {"loss": v}})  # fmt: skip
        m.record({"kind": "end", "run": run, "status": status})
    snap = m.snapshot()["studies"]
    assert list(snap) == ["old", "s"] and [r["trial"] for r in snap["s"]] == [0, 1, 2]
    doc = Document()
    _page(SimpleNamespace(plugins={PLUGIN_NAME: m}, workers={}), {}, doc)
    lines = doc.get_model_by_name("dfdl-trials").data
    assert lines["trial"] == ["0", "1", "2"]
    assert lines["xs"] == [[4, 8], [4], []] and lines["ys"] == [[2.0, 1.0], [2.5], []]
    assert lines["color"] == [TRIAL_COLORS[s] for s in ("done", "stopped", "failed")]
