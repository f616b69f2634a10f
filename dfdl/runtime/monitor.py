"""Training progress on the scheduler: the data behind the dashboard's ``dfdl`` page.

``/dfdl`` shows, live, for the latest training on the scheduler: the loss curve (training
per step, validation per epoch), samples/s, each step's worker time split into compute,
transfer, spill and idle, and the bytes each worker holds spilled on disk; a table
lists every training the scheduler has seen with its current step. ``/dfdl/json``
serves the same data.

How the data gets there: :func:`dfdl.train` registers :class:`TrainingMonitor` (a
scheduler plugin) and logs its progress as Dask events (topic ``"dfdl"``, one event
per gathered batch of steps, no extra round trips per task). The plugin adds the
timings of each finished task to its step: the step is the second element of every
dfdl task key, ``(f"{node}-{phase}-{token}", step, *tile)``.

Guarantee: monitoring never changes or stops a training: a scheduler that cannot take
the plugin, or a failed event, switches reporting off (:class:`Reporter`). The page
itself is :mod:`dfdl.runtime.dashboard`.

Example:
    >>> monitor = TrainingMonitor()
    >>> monitor.record({"kind": "start", "run": "r1", "batch_size": 8, "total": 2})
    >>> monitor.record({"kind": "token", "run": "r1", "token": "0123abcd"})
    >>> monitor.record({"kind": "steps", "run": "r1", "items": [(0, 2.5, 1.0e9)]})
    >>> monitor.snapshot()["runs"][0]["step"]
    1
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import defaultdict, deque
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

logger = logging.getLogger("dfdl")

PLUGIN_NAME = "dfdl-monitor"
EVENT_TOPIC = "dfdl"
#: steps kept per training for the plots and the JSON route
KEEP_STEPS = 10_000
#: runs kept (oldest dropped first)
KEEP_RUNS = 20
#: studies (dfdl.tune) whose trials' validation curves are kept (oldest dropped first)
KEEP_STUDIES = 5
#: one registration at a time: trials of dfdl.tune start their reporters from threads
_REGISTERING = threading.Lock()
_TOKEN = re.compile(r"-([0-9a-f]{8})$")
_SPILL = ("disk-read", "disk-write")


class TrainingMonitor(SchedulerPlugin):
    """Scheduler plugin: every training's progress, from dfdl's events and task timings."""

    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.runs: dict[str, dict] = {}
        self.token_run: dict[str, str] = {}
        #: study -> trial number -> its status and validation metrics (every trial of a
        #: study, beyond the KEEP_RUNS runs whose steps are kept)
        self.studies: dict[str, dict[int, dict]] = {}
        # (token, step) -> seconds per action, summed over the step's tasks
        self.busy: dict[tuple[str, int], dict[str, float]] = defaultdict(
            lambda: {"compute": 0.0, "transfer": 0.0, "spill": 0.0}
        )
        self.scheduler = None

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler

    def log_event(self, topic: str, msg: Any) -> None:
        if topic == EVENT_TOPIC and isinstance(msg, dict):
            try:
                self.record(msg)
            except Exception:  # a malformed event must not break the scheduler
                logger.exception("dfdl dashboard: ignored event %r", msg)

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if start != "processing" or finish != "memory" or not isinstance(key, tuple):
            return
        if len(key) < 2 or not isinstance(key[0], str) or not isinstance(key[1], int):
            return
        m = _TOKEN.search(key[0])
        if m is None or m.group(1) not in self.token_run:
            return
        spent = self.busy[(m.group(1), key[1])]
        for ss in kwargs.get("startstops") or ():
            action = ss.get("action")
            seconds = max(0.0, ss.get("stop", 0.0) - ss.get("start", 0.0))
            if action == "compute":
                spent["compute"] += seconds
            elif action == "transfer":
                spent["transfer"] += seconds
            elif action in _SPILL:
                spent["spill"] += seconds

    def record(self, msg: dict) -> None:
        """Apply one event from the trainer (see :class:`Reporter`)."""
        kind, run_id = msg["kind"], msg["run"]
        if kind == "start":
            self.runs[run_id] = {
                "run": run_id,
                "model": msg.get("model", ""),
                "status": "running",
                "batch_size": msg.get("batch_size"),
                "total": msg.get("total"),
                "threads": msg.get("threads", 1),
                "started": msg.get("t", time.time()),
                "steps": deque(maxlen=KEEP_STEPS),
                "validation": [],
                "rollbacks": 0,
                "study": msg.get("study"),
                "trial": msg.get("trial"),
            }
            while len(self.runs) > KEEP_RUNS:
                self.runs.pop(next(iter(self.runs)))
            if msg.get("study") is not None:
                trials = self.studies.pop(msg["study"], {})
                self.studies[msg["study"]] = trials  # the latest study last
                trials[msg.get("trial")] = {"status": "running", "validation": []}
                while len(self.studies) > KEEP_STUDIES:
                    self.studies.pop(next(iter(self.studies)))
            return
        run = self.runs.get(run_id)
        if run is None:
            return
        if kind == "token":
            self.token_run[msg["token"]] = run_id
            run["token"] = msg["token"]
        elif kind == "steps":
            for step, loss, t in msg["items"]:
                run["steps"].append({"step": step, "loss": loss, "t": t, "token": run["token"]})
        elif kind == "validation":
            run["validation"].append({"step": msg["step"], **msg["metrics"]})
            trial = self._trial(run)
            if trial is not None:
                trial["validation"].append({"step": msg["step"], **msg["metrics"]})
        elif kind == "rollback":
            run["rollbacks"] += 1
            keep = [s for s in run["steps"] if s["step"] < msg["step"]]
            run["steps"] = deque(keep, maxlen=KEEP_STEPS)
        elif kind == "end":
            run["status"] = msg.get("status", "done")
            trial = self._trial(run)
            if trial is not None:
                trial["status"] = run["status"]

    def _trial(self, run: dict) -> dict | None:
        """The study's record of the trial ``run`` trains, if it is one."""
        return self.studies.get(run.get("study"), {}).get(run.get("trial"))

    def snapshot(self) -> dict:
        """Every run's progress, the workers' spilled bytes and, per worker
        (``"workers"``), its device (``"gpu"``/``"cpu"``, by the ``GPU`` resource), the GPU
        it uses, the device memory its arrays hold and its bytes spilled to disk, as
        JSON-able data."""
        runs = []
        for run in self.runs.values():
            steps = list(run["steps"])
            rows = []
            # steps arrive in batches (one per submission): each step of a batch gets an
            # even share of the time since the previous batch
            share, prev_t, i = {}, run["started"], 0
            while i < len(steps):
                j = i
                while j < len(steps) and steps[j]["t"] == steps[i]["t"]:
                    j += 1
                for k in range(i, j):
                    share[k] = max(steps[i]["t"] - prev_t, 0.0) / (j - i)
                prev_t, i = steps[i]["t"], j
            for i, s in enumerate(steps):
                spent = self.busy.get((s["token"], s["step"]), {})
                wall = share[i]
                busy = sum(spent.values())
                rows.append(
                    {
                        "step": s["step"],
                        "loss": s["loss"],
                        "compute_s": spent.get("compute", 0.0),
                        "transfer_s": spent.get("transfer", 0.0),
                        "spill_s": spent.get("spill", 0.0),
                        "idle_s": max(0.0, run["threads"] * wall - busy),
                    }
                )
            window = steps[-9:]
            elapsed = window[-1]["t"] - window[0]["t"] if len(window) > 1 else 0.0
            samples_s = (
                (len(window) - 1) * (run["batch_size"] or 0) / elapsed if elapsed > 0 else None
            )
            runs.append(
                {
                    "run": run["run"],
                    "model": run["model"],
                    "status": run["status"],
                    "step": steps[-1]["step"] + 1 if steps else 0,
                    "total": run["total"],
                    "batch_size": run["batch_size"],
                    "samples_s": samples_s,
                    "rollbacks": run["rollbacks"],
                    "steps": rows,
                    "validation": list(run["validation"]),
                }
            )
        spilled, workers = {}, {}
        if self.scheduler is not None:
            for addr, ws in self.scheduler.workers.items():
                spilled[addr] = int((ws.metrics.get("spilled_bytes") or {}).get("disk", 0))
                dev = ws.metrics.get("dfdl_device") or {}
                workers[addr] = {
                    "device": "gpu" if (ws.resources or {}).get("GPU", 0) > 0 else "cpu",
                    "gpu": dev.get("gpu"),
                    "device_memory_bytes": dev.get("memory_bytes"),
                    "device_memory_limit": dev.get("limit"),
                    "device_spilled_bytes": dev.get("spilled_bytes"),
                    "spilled_bytes": spilled[addr],
                }
        studies = {
            name: [
                {"trial": n, "status": t["status"], "validation": list(t["validation"])}
                for n, t in sorted(trials.items(), key=lambda item: _number(item[0]))
            ]
            for name, trials in self.studies.items()
        }
        return {"runs": runs, "spilled_bytes": spilled, "workers": workers, "studies": studies}


def _number(trial) -> int:
    return trial if isinstance(trial, int) else -1


def monitor_of(scheduler) -> TrainingMonitor | None:
    """The scheduler's :class:`TrainingMonitor`, if a training registered one."""
    plugin = scheduler.plugins.get(PLUGIN_NAME)
    return plugin if isinstance(plugin, TrainingMonitor) else None


def _has_monitor(dask_scheduler=None) -> bool:
    return monitor_of(dask_scheduler) is not None


def ensure_monitor(client) -> None:
    """Register :class:`TrainingMonitor` on the client's scheduler unless it has one
    (once, when trainings start from several threads at once).

    Example:
        >>> ensure_monitor(client)  # doctest: +SKIP
    """
    with _REGISTERING:
        if not client.run_on_scheduler(_has_monitor):
            client.register_plugin(TrainingMonitor(), name=PLUGIN_NAME)


class Reporter:
    """The trainer's side: registers the monitor once, then logs progress as events.

    Reporting never stops training: a scheduler that cannot load dfdl (so cannot take
    the plugin) or a failed event is logged at debug level and reporting switches off.
    """

    def __init__(self, client, run: str, **start: Any):
        self.client, self.run, self.pending = client, run, []
        self.on = True
        try:
            ensure_monitor(client)
            self._log("start", t=time.time(), **start)
        except Exception as e:  # noqa: BLE001
            logger.debug("dfdl dashboard: reporting off (%s)", e)
            self.on = False

    def _log(self, kind: str, **fields: Any) -> None:
        if not self.on:
            return
        try:
            self.client.log_event(EVENT_TOPIC, {"kind": kind, "run": self.run, **fields})
        except Exception as e:  # noqa: BLE001
            logger.debug("dfdl dashboard: reporting off (%s)", e)
            self.on = False

    def token(self, token: str) -> None:
        """The key token of the steps submitted from now on."""
        self._log("token", token=token)

    def step(self, step: int, loss: float) -> None:
        """A step's loss, sent with the next :meth:`flush`."""
        self.pending.append((step, loss, time.time()))

    def flush(self) -> None:
        """Send the steps gathered since the last flush, stamped with one time (they
        were gathered together; the page shares the time since the last batch)."""
        if self.pending:
            now = time.time()
            self._log("steps", items=[(step, loss, now) for step, loss, _ in self.pending])
            self.pending = []

    def validation(self, step: int, metrics: dict[str, float]) -> None:
        self._log("validation", step=step, metrics=dict(metrics))

    def rollback(self, step: int) -> None:
        self.pending = []
        self._log("rollback", step=step)

    def end(self, status: str) -> None:
        self.flush()
        self._log("end", status=status)
