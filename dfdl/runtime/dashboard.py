"""The ``dfdl`` page of the Dask dashboard, and its JSON route.

``/dfdl`` shows, live, for the latest training on the scheduler: the loss curve (training
per step, validation per epoch), samples/s, each step's worker time split into compute,
transfer, spill and idle, and the bytes each worker holds spilled on disk; a table
lists every training the scheduler has seen with its current step, and another each
worker's device (GPU or CPU), the device memory its arrays hold and its spilled bytes;
while :func:`dfdl.tune` runs, a trials view shows the latest study's trials by status and
every trial's validation loss against step (running blue, finished green, pruned grey,
failed red).
``/dfdl/json`` serves the same data (see :mod:`dfdl.runtime.monitor` for where it comes from).

Installing the page: ``dfdl.LocalCluster(..., dashboard_address=...)`` and
``dfdl.cluster.slurm`` do it themselves (their schedulers run in this process). For a
scheduler started elsewhere, preload this module: ``dask scheduler --preload
dfdl.runtime.dashboard``. Importing it installs the page, so that must happen before the
scheduler starts. The page only reads the monitor's data; it never touches a training.

Example:
    >>> cluster = dfdl.LocalCluster(2, dashboard_address="127.0.0.1:8787")  # doctest: +SKIP
    >>> # http://127.0.0.1:8787/dfdl while dfdl.train(..., client=Client(cluster)) runs
"""

from __future__ import annotations

import json
import math

from dask.utils import format_bytes

from dfdl.runtime.monitor import PLUGIN_NAME, TrainingMonitor, monitor_of


def _page(scheduler, extra, doc) -> None:
    """Bokeh document of ``/dfdl`` (Dask's template, navigation bar and theme)."""
    from bokeh.layouts import column, row
    from bokeh.models import ColumnDataSource, Div, HoverTool
    from bokeh.plotting import figure
    from distributed.dashboard.components.scheduler import BOKEH_THEME, env

    loss = ColumnDataSource({"step": [], "loss": []}, name="dfdl-loss")
    val = ColumnDataSource({"step": [], "loss": []}, name="dfdl-val")
    speed = ColumnDataSource({"step": [], "samples_s": []}, name="dfdl-speed")
    parts = ("compute_s", "transfer_s", "spill_s", "idle_s")
    split = ColumnDataSource({"step": [], **{p: [] for p in parts}}, name="dfdl-split")
    spill = ColumnDataSource({"worker": [], "bytes": []}, name="dfdl-spill")
    table = Div(text="<p>No dfdl training has reported to this scheduler yet.</p>")
    devices = Div(text="")
    trials = ColumnDataSource({"xs": [], "ys": [], "trial": [], "color": []}, name="dfdl-trials")
    study = Div(text="")

    kw = {"sizing_mode": "stretch_width", "height": 280, "tools": "pan,wheel_zoom,reset,save"}
    f_loss = figure(title="Loss", x_axis_label="step", **kw)
    f_loss.line("step", "loss", source=loss, color="#1f77b4", line_width=2, legend_label="train")
    f_loss.scatter("step", "loss", source=val, color="#d62728", size=8, legend_label="val")
    f_loss.add_tools(HoverTool(tooltips=[("step", "@step"), ("loss", "@loss")]))
    f_speed = figure(title="Samples/s", x_axis_label="step", **kw)
    f_speed.line("step", "samples_s", source=speed, color="#2ca02c", line_width=2)
    f_split = figure(title="Worker time per step (s)", x_axis_label="step", **kw)
    f_split.vbar_stack(
        list(parts),
        x="step",
        width=0.8,
        source=split,
        color=["#1f77b4", "#ff7f0e", "#9467bd", "#c7c7c7"],
        legend_label=["compute", "transfer", "spill", "idle"],
    )
    f_spill = figure(title="Bytes spilled to disk, per worker", y_range=[], **kw)
    f_spill.hbar(y="worker", right="bytes", height=0.6, source=spill, color="#9467bd")
    f_trials = figure(
        title="Trials: validation loss per step (dfdl.tune)", x_axis_label="step", **kw
    )
    f_trials.multi_line("xs", "ys", source=trials, color="color", line_width=2)
    f_trials.add_tools(HoverTool(tooltips=[("trial", "@trial")]))

    def update() -> None:
        monitor = monitor_of(scheduler)
        if monitor is None:
            return
        snap = monitor.snapshot()
        if snap["runs"]:
            cur = snap["runs"][-1]
            rows = cur["steps"]
            loss.data = {"step": [r["step"] for r in rows], "loss": [r["loss"] for r in rows]}
            v = [x for x in cur["validation"] if "loss" in x]
            val.data = {"step": [x["step"] for x in v], "loss": [x["loss"] for x in v]}
            prev = speed.data["step"]
            if cur["samples_s"] is not None and (not prev or prev[-1] != cur["step"]):
                speed.stream({"step": [cur["step"]], "samples_s": [cur["samples_s"]]}, 2000)
            split.data = {"step": [r["step"] for r in rows[-100:]]} | {
                p: [r[p] for r in rows[-100:]] for p in parts
            }
            table.text = _runs_table(snap["runs"])
        devices.text = workers_table(snap.get("workers", {}))
        if snap.get("studies"):
            name, rows = list(snap["studies"].items())[-1]
            trials.data = trial_curves(rows)
            study.text = study_summary(name, rows)
        workers = sorted(snap["spilled_bytes"])
        f_spill.y_range.factors = workers
        spill.data = {"worker": workers, "bytes": [snap["spilled_bytes"][w] for w in workers]}

    update()
    doc.add_periodic_callback(update, 500)
    doc.title = "Dask: dfdl training"
    doc.add_root(
        column(table, row(f_loss, f_speed, sizing_mode="stretch_width"),
               row(f_split, f_spill, sizing_mode="stretch_width"), devices,
               study, f_trials, sizing_mode="stretch_width")
    )  # fmt: skip
    doc.template = env.get_template("simple.html")
    doc.template_variables.update(extra)
    doc.theme = BOKEH_THEME


#: a trial's line colour by its status (Reporter's end status "stopped": pruned)
TRIAL_COLORS = {"running": "#1f77b4", "done": "#2ca02c", "stopped": "#c7c7c7", "failed": "#d62728"}


def trial_curves(rows: list[dict]) -> dict[str, list]:
    """The trials view's lines: validation loss against step, one line per trial,
    coloured by status (running blue, finished green, pruned grey, failed red).

    Example:
        >>> trial_curves([{"trial": 0, "status": "done",
        ...                "validation": [{"step": 5, "loss": 1.0}]}])["ys"]
        [[1.0]]
    """
    out: dict[str, list] = {"xs": [], "ys": [], "trial": [], "color": []}
    for r in rows:
        points = [v for v in r["validation"] if "loss" in v]
        out["xs"].append([v["step"] for v in points])
        out["ys"].append([v["loss"] for v in points])
        out["trial"].append(str(r["trial"]))
        out["color"].append(TRIAL_COLORS.get(r["status"], "#7f7f7f"))
    return out


def study_summary(name: str, rows: list[dict]) -> str:
    """One line on the latest study: its trials by status and the best validation loss.

    Example:
        >>> study_summary("s", [{"trial": 0, "status": "done", "validation": []}])
        '<h3>dfdl.tune study s</h3><p>1 trials: 0 running, 1 finished, 0 pruned, 0 failed</p>'
    """
    from html import escape

    count = {s: sum(r["status"] == s for r in rows) for s in TRIAL_COLORS}
    losses = [v["loss"] for r in rows for v in r["validation"][-1:] if "loss" in v]
    finite = [v for v in losses if math.isfinite(v)]
    best = f"; best last validation loss {min(finite):.5g}" if finite else ""
    return (
        f"<h3>dfdl.tune study {escape(str(name))}</h3><p>{len(rows)} trials: "
        f"{count['running']} running, {count['done']} finished, {count['stopped']} pruned, "
        f"{count['failed']} failed{best}</p>"
    )


def _runs_table(runs: list[dict]) -> str:
    from html import escape

    head = "<tr><th>run</th><th>model</th><th>status</th><th>step</th><th>samples/s</th>"
    head += "<th>last loss</th><th>rollbacks</th></tr>"
    body = []
    for r in reversed(runs):
        last = f"{r['steps'][-1]['loss']:.5g}" if r["steps"] else ""
        sps = f"{r['samples_s']:.1f}" if r["samples_s"] else ""
        body.append(
            f"<tr><td>{escape(r['run'])}</td><td>{escape(r['model'])}</td>"
            f"<td>{escape(r['status'])}</td><td>{r['step']} / {r['total']}</td>"
            f"<td>{sps}</td><td>{last}</td><td>{r['rollbacks']}</td></tr>"
        )
    return f"<h3>dfdl trainings</h3><table>{head}{''.join(body)}</table>"


def _bytes(n) -> str:
    return "" if n is None else format_bytes(n)


def workers_table(workers: dict) -> str:
    """The page's table of workers: each one's device (``gpu N`` or ``cpu``), the device
    memory its arrays hold, its device memory limit and the bytes its tiles spilled off
    the device (with a limit, :mod:`dfdl.runtime.device_memory`), and its bytes spilled
    to disk.

    Example:
        >>> "gpu 0" in workers_table({"tls://w": {"device": "gpu", "gpu": "0",
        ...     "device_memory_bytes": 3 * 2**20, "spilled_bytes": 0}})
        True
    """
    from html import escape

    head = "<tr><th>worker</th><th>device</th><th>device memory in use</th>"
    head += "<th>device memory limit</th><th>spilled off the device</th>"
    head += "<th>spilled to disk</th></tr>"
    body = []
    for addr in sorted(workers):
        w = workers[addr]
        device = f"gpu {w['gpu']}" if w["device"] == "gpu" and w.get("gpu") else w["device"]
        body.append(
            f"<tr><td>{escape(addr)}</td><td>{escape(device)}</td>"
            f"<td>{_bytes(w.get('device_memory_bytes'))}</td>"
            f"<td>{_bytes(w.get('device_memory_limit'))}</td>"
            f"<td>{_bytes(w.get('device_spilled_bytes'))}</td>"
            f"<td>{_bytes(w.get('spilled_bytes'))}</td></tr>"
        )
    return f"<h3>Workers</h3><table>{head}{''.join(body)}</table>"


def json_body(snapshot: dict) -> str:
    """``snapshot`` as strict JSON: NaN and infinite numbers (a diverged validation loss)
    become ``null``, which browsers' ``JSON.parse`` accepts and ``NaN`` is not.

    Example:
        >>> json_body({"runs": [{"val_loss": float("nan"), "loss": 0.5}]})
        '{"runs": [{"val_loss": null, "loss": 0.5}]}'
    """

    def finite(v):
        if isinstance(v, float):
            return v if math.isfinite(v) else None
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [finite(x) for x in v]
        return v

    return json.dumps(finite(snapshot), allow_nan=False)


def _json_handler():
    from distributed.http.utils import RequestHandler

    class DfdlJSON(RequestHandler):
        def get(self):
            monitor = monitor_of(self.server)
            empty = {"runs": [], "spilled_bytes": {}, "workers": {}, "studies": {}}
            snap = monitor.snapshot() if monitor is not None else empty
            self.set_header("Content-Type", "application/json")
            self.write(json_body(snap))

    return DfdlJSON


def __getattr__(name: str):
    # distributed reads ``routes`` from the modules in distributed.scheduler.http.routes;
    # built lazily so that importing this module does not import tornado's handlers
    if name == "routes":
        return [("dfdl/json", _json_handler(), {})]
    raise AttributeError(name)


def install() -> bool:
    """Add ``/dfdl`` and ``/dfdl/json`` to dashboards of schedulers started from now on,
    in this process. Returns False (and does nothing) without bokeh."""
    import dask

    try:
        import distributed.dashboard.scheduler as pages
    except ImportError:  # no bokeh: Dask serves no dashboard pages either
        return False
    pages.applications.setdefault("/dfdl", _page)
    if not getattr(pages.template_variables, "_dfdl", False):
        original = pages.template_variables

        def template_variables(scheduler):
            out = original(scheduler)
            if "dfdl" not in out["pages"]:
                out["pages"].append("dfdl")
            return out

        template_variables._dfdl = True
        pages.template_variables = template_variables
    routes = list(dask.config.get("distributed.scheduler.http.routes"))
    if __name__ not in routes:
        dask.config.set({"distributed.scheduler.http.routes": [*routes, __name__]})
    return True


def dask_setup(scheduler) -> None:
    """Preload hook (``dask scheduler --preload dfdl.runtime.dashboard``): add the monitor now."""
    if monitor_of(scheduler) is None:
        scheduler.add_plugin(TrainingMonitor(), name=PLUGIN_NAME)


install()
