"""The dashboard's ``/dfdl/json`` body (:func:`dfdl.runtime.dashboard.json_body`); the page
itself, in a browser during a training run, is ``tests/test_dashboard.py``."""

from __future__ import annotations

import json
import math

from dfdl.runtime.dashboard import json_body
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
