"""The dashboard's ``dfdl`` page, loaded in headless Chromium during a training run.

A real LocalCluster with its dashboard on, a training running in a thread, and Debian's
Chromium opening ``/dfdl`` while it runs: the Bokeh plots must hold data in the
browser, the loss line must be drawn in the screenshot (saved under
``$DFDL_TEST_ARTIFACTS``, default ``build/test-artifacts``), and ``/dfdl/json`` must
return the steps trained so far and, at the end, exactly the losses ``dfdl.train``
returned.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from distributed import Client

import dfdl
import dfdl.models
from tests import browser

SIZES = (64, 256, 256, 10)
BATCH = 64
N = BATCH * 100
EPOCHS = 4  # the run outlasts the browser's look at the live page
LOSS_RGB = (0x1F, 0x77, 0xB4)  # the loss line's colour in dfdl/dashboard.py
#: every named data source of the page, and the column whose length tells its rows
SOURCES = {
    "dfdl-loss": "step",
    "dfdl-val": "step",
    "dfdl-speed": "step",
    "dfdl-split": "step",
    "dfdl-spill": "worker",
}
ROWS_JS = """(() => {
  if (!window.Bokeh || !Bokeh.documents || !Bokeh.documents.length) return null;
  const out = {};
  for (const [name, column] of Object.entries(SOURCES_JSON)) {
    const m = Bokeh.documents[0].get_model_by_name(name);
    if (!m) continue;
    const col = (m.data instanceof Map) ? m.data.get(column) : m.data[column];
    out[name] = col ? col.length : 0;
  }
  return out["dfdl-loss"] > 0 ? out : null;
})()""".replace("SOURCES_JSON", json.dumps(SOURCES))


def _artifacts() -> Path:
    root = Path(__file__).resolve().parents[1]
    d = Path(os.environ.get("DFDL_TEST_ARTIFACTS", root / "build" / "test-artifacts"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.headers["Content-Type"] == "application/json"
        return json.load(r)


@pytest.fixture(scope="module")
def chromium():
    why = browser.missing()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="module")
def dashboard():
    with (
        dfdl.LocalCluster(2, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        yield client, cluster.dashboard_link.rsplit("/", 1)[0]


def test_empty_scheduler_serves_no_runs(dashboard):
    _client, base = dashboard
    assert _get_json(f"{base}/dfdl/json") == {
        "runs": [],
        "spilled_bytes": {},
        "workers": {},
        "studies": {},
    }
    with urllib.request.urlopen(f"{base}/status", timeout=10) as r:
        assert 'href="dfdl"' in r.read().decode()  # in Dask's navigation bar


def test_page_renders_live_and_json_has_the_steps(dashboard, chromium):
    client, base = dashboard
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, SIZES[0]), dtype=np.float32)
    y = rng.integers(0, SIZES[-1], N)
    out: dict = {}

    def train():
        try:
            out["result"] = dfdl.train(
                dfdl.models.mlp(SIZES),
                data=(x, y),
                validation=(x[:256], y[:256]),
                loss="cross_entropy",
                optimizer=dfdl.optim.SGD(lr=0.01, momentum=0.9),
                batch_size=BATCH,
                epochs=EPOCHS,
                client=client,
                progress=False,
            )
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            out["error"] = e

    worker = threading.Thread(target=train)
    worker.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and worker.is_alive():
            runs = _get_json(f"{base}/dfdl/json")["runs"]
            if runs and runs[-1]["step"] >= 5:
                break
            time.sleep(0.2)
        live = _get_json(f"{base}/dfdl/json")["runs"][-1]
        assert live["status"] == "running", "training ended before the page was checked"
        assert [s["step"] for s in live["steps"]] == list(range(live["step"]))
        with browser.Chromium() as tab:
            tab.open(f"{base}/dfdl")
            rows = tab.wait_for(ROWS_JS, timeout=60)
            time.sleep(1.0)  # let the plots draw what the sources hold
            png = tab.screenshot(_artifacts() / "dashboard-dfdl.png")
        during = _get_json(f"{base}/dfdl/json")["runs"][-1]
    finally:
        worker.join()
    if "error" in out:
        raise out["error"]
    assert during["status"] == "running"
    assert rows is not None, "the page's plots never received data"
    assert rows["dfdl-loss"] > 0 and rows["dfdl-split"] > 0
    assert rows["dfdl-spill"] == 2  # one bar per worker
    from PIL import Image

    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    assert image.shape[0] >= 800 and image.shape[1] >= 1300  # the window, less its chrome
    line = np.all(np.abs(image.astype(int) - LOSS_RGB) <= 8, axis=-1)
    assert line.sum() > 200, f"the loss line is not drawn ({line.sum()} pixels of its colour)"

    result = out["result"]
    final = _get_json(f"{base}/dfdl/json")["runs"][-1]
    assert final["run"] == live["run"] and final["status"] == "done"
    assert final["step"] == final["total"] == EPOCHS * N // BATCH
    assert [s["step"] for s in final["steps"]] == list(range(final["total"]))
    assert [s["loss"] for s in final["steps"]] == result.history["loss"]
    assert [v["loss"] for v in final["validation"]] == result.history["val_loss"]
    for s in final["steps"]:
        assert min(s["compute_s"], s["transfer_s"], s["spill_s"], s["idle_s"]) >= 0
    assert sum(s["compute_s"] for s in final["steps"]) > 0
