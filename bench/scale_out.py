"""Several worker processes against one, on the same cores: the samples/s of ``dfdl.train``
on ``dfdl.LocalCluster()`` (one process, a thread per core) and on
``dfdl.LocalCluster(N)`` (N processes of one thread), same training, same plan.

For each workload of ``bench/run.py`` (``--full`` sizes by default) and each arm, a
fresh embedded cluster trains twice (the first call warms the workers: numba's
compilation, imports); the second call trains one group of :data:`GROUP` steps (the
submission and, on several processes, the share of work per worker: ``unroll``) and then
``--steps`` more, rounded up to whole groups. The step time is the span from the end of
the first group's last task to the end of the last step's, over the steps between
(:func:`group_span`). Windows of whole groups: a share runs a group's steps in one task
and may run a member of an early step late (an update read only at the group's end),
so the end of a step inside a group is no boundary (until 2026-11-28 the span started
at the end of step 0, and a late step-0 member made some 2-process runs look up to
twice as fast as they were). Arms:

* ``one``: one process, a thread per core (the reference);
* ``shares``: N processes, the engine's defaults (each worker's share of a submitted
  group of steps as one task, values passed between workers directly, the updated
  weights too: :mod:`dfdl.taskgraph.exchange`);
* ``step-shares``: N processes, a share per worker and step
  (``GraphOptions(steps_per_task=1)``: the updated weights pass through Dask between
  steps), the default before;
* ``stages``: N processes, a task per worker and stage (``GraphOptions(exchange=False)``);
* ``tiles``: N processes, a task per tile (``GraphOptions(worker_tasks=False)``), what
  several processes ran before;
* ``shares-tcp``: as ``shares``, on a cluster speaking plain ``tcp://``
  (``security=False``) instead of the embedded cluster's TLS: what encrypting the
  values sent between the workers costs;
* ``shares-dask``: as ``shares``, the values sent between the workers as Dask messages
  (Dask config ``dfdl.exchange.transport: dask``) instead of on dfdl's own sockets
  (:mod:`dfdl.taskgraph.wire`), the transport before.

The losses of every arm must be the same bits (the plan is the same: explicit tiles
from the one-process plan); the script stops if they are not.

Usage:
    python bench/scale_out.py [--workload mlp resnet unet3d transformer resnet50]
        [--workers 2] [--steps 4] [--small] [--json out.json]

``resnet50`` (not run by default): ResNet-50 at 224 px, 8 samples a step, the size
``bench/scale_sim.py`` predicts. Each arm also records its tile tasks' mean seconds
inside the timed steps (``<arm>_members``), which the simulation's calibration replays.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import dask
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from run import FULL, SMALL, _step_ends, make_data, member_seconds, train_streamed  # noqa: E402

import dfdl  # noqa: E402
from dfdl.runtime.session import DEFAULT_UNROLL  # noqa: E402
from dfdl.taskgraph.optimize import GraphOptions  # noqa: E402

#: ResNet-50 at 224 px, 8 samples a step (not run by default): the size the scaling
#: simulation predicts (``bench/scale_sim.py``), to calibrate it at that size too
RESNET50 = ({}, 8, "sgd", dict(lr=0.01, momentum=0.9), {})

ARMS = {
    "one": None,
    "shares": GraphOptions(),
    "step-shares": GraphOptions(steps_per_task=1),
    "stages": GraphOptions(exchange=False),
    "tiles": GraphOptions(worker_tasks=False),
    "shares-tcp": GraphOptions(),
    "shares-dask": GraphOptions(),
}
#: the arms' cluster arguments besides the number of workers
CLUSTER = {"shares-tcp": {"security": False}}
#: the arms' Dask config, which the cluster's nannies hand to the workers they start
CONFIG = {"shares-dask": {"dfdl.exchange.transport": "dask"}}
#: steps per submission (and per share of work on several processes): the warm-up
#: and the timed window are whole groups
GROUP = DEFAULT_UNROLL


def timed_steps(steps: int) -> int:
    """``steps`` rounded up to whole groups of :data:`GROUP`.

    Example:
        >>> timed_steps(3), timed_steps(8)
        (4, 8)
    """
    return -(-max(steps, 1) // GROUP) * GROUP


def group_span(records: list[dict], warm: int, last: int) -> float:
    """Seconds from the end of the last task of steps ``< warm`` to the end of the last
    task of steps ``<= last`` (task-stream records keyed ``(name, step, ...)``): a
    step's end is that of every step up to it, so a member of an early step that ran
    late moves the window's start to where its group really ended.

    Example:
        >>> rec = lambda k, a, b: {"key": k, "startstops": [
        ...     {"action": "compute", "start": a, "stop": b}]}
        >>> group_span([rec(("u", 0), 0.0, 5.0), rec(("x", 1), 0.0, 2.0),
        ...             rec(("y", 2), 5.0, 9.0)], 2, 2)
        4.0
    """
    ends = _step_ends(records)
    if not any(s < warm for s in ends) or last not in ends:
        raise RuntimeError(f"the task stream has no tasks before step {warm} or of step {last}")
    t0 = max(v for s, v in ends.items() if s < warm)
    t1 = max(v for s, v in ends.items() if s <= last)
    return t1 - t0


def step_time(
    workers: int | None, engine, model, x, y, cfg, steps: int, tiles, cluster_kw=None, config=None
) -> dict:
    """One arm on a fresh cluster (``workers`` processes, None: one process with a
    thread per core; ``cluster_kw``: more ``dfdl.LocalCluster`` arguments; ``config``:
    Dask config the workers start with): seconds per
    step, the timed call's losses, its tiling and each tile task's mean seconds inside
    the timed steps (``members``, by ``run.member_id``: what ``bench/scale_sim.py``
    replays)."""
    from distributed import Client

    _, batch, kind, okw, _ = cfg
    options = dfdl.EngineOptions() if engine is None else dfdl.EngineOptions(graph=engine)
    with dask.config.set(config or {}):
        cluster = dfdl.LocalCluster(workers, **(cluster_kw or {}))
    with cluster, Client(cluster) as client:
        train_streamed(client, model, x, y, batch, kind, okw, 2, engine=options, tiles=tiles)
        result, records = train_streamed(
            client, model, x, y, batch, kind, okw, GROUP + steps, engine=options, tiles=tiles
        )
    span = group_span(records, GROUP, GROUP + steps - 1)
    return {
        "step_s": span / steps,
        "losses": result.history["loss"],
        "tiles": result.tiles,
        "members": member_seconds(records, GROUP),
    }


def _workload(name: str, cfg: tuple, n: int) -> tuple:
    """The model of workload ``name`` and ``n`` random samples with labels."""
    if name != "resnet50":
        from dfdl.models import ZOO

        return (ZOO[name](**cfg[0]), *make_data(name, cfg[0], n))
    from scale_graph import resnet50

    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, 3, 224, 224), dtype=np.float32)
    return resnet50(**cfg[0]), x, rng.integers(0, 1000, size=(n,), dtype=np.int64)


def main(argv: list[str] | None = None) -> dict:
    """Runs the arms on each workload; prints the table and writes JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", choices=[*FULL, "resnet50"], default=list(FULL))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help=f"rounded up to {GROUP}s")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--small", action="store_true", help="bench/run.py's small sizes")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    configs = {**(SMALL if args.small else FULL), "resnet50": RESNET50}
    args.steps = timed_steps(args.steps)
    out = {
        "workers": args.workers,
        "steps": args.steps,
        "warmup_steps": GROUP,
        "window": "whole groups",
        "load_at_start": os.getloadavg()[0],
    }
    rows = []
    for name in args.workload:
        cfg = configs[name]
        model, x, y = _workload(name, cfg, cfg[1] * (args.steps + GROUP))
        row = {"workload": name, "batch": cfg[1]}
        tiles = None
        for arm in args.arms:
            t0 = time.perf_counter()
            got = step_time(
                None if arm == "one" else args.workers,
                ARMS[arm],
                model,
                x,
                y,
                cfg,
                args.steps,
                tiles,
                CLUSTER.get(arm),
                CONFIG.get(arm),
            )
            tiles = tiles or got["tiles"]  # the one-process plan for every arm
            if "losses" in row and got["losses"] != row["losses"]:
                raise SystemExit(f"{name}: arm {arm} trained other losses than the first arm")
            row.setdefault("losses", got["losses"])
            row[arm] = got["step_s"]
            row[f"{arm}_members"] = got["members"]
            print(f"  {name} {arm}: {got['step_s']:.3f} s/step ({time.perf_counter() - t0:.0f} s)")
        row["tiling"] = tiles
        rows.append(row)
    out["rows"] = rows
    out["load_at_end"] = os.getloadavg()[0]
    head = ["workload", *args.arms, *[f"{a}/one" for a in args.arms if a != "one"]]
    print(" ".join(f"{h:>12}" for h in head))
    for r in rows:
        cells = [r["workload"], *(f"{r[a]:.3f}" for a in args.arms)]
        if "one" in r:
            cells += [f"{r['one'] / r[a]:.2f}" for a in args.arms if a != "one"]
        print(" ".join(f"{c:>12}" for c in cells))
    print(
        f"ratios: one-process step / N-process step (= N-process samples/s over one's);"
        f" load {out['load_at_start']:.1f} at start, {out['load_at_end']:.1f} at end"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
