"""Several worker processes against one, on the same cores: the samples/s of ``dfdl.train``
on ``dfdl.LocalCluster()`` (one process, a thread per core) and on
``dfdl.LocalCluster(N)`` (N processes of one thread), same training, same plan.

For each workload of ``bench/run.py`` (``--full`` sizes by default) and each arm, a
fresh embedded cluster trains ``1 + --steps`` steps twice (the first call warms the
workers: numba's compilation, imports); the step time is the task stream's span over the
steps after the first of the second call (as ``bench/run.py`` measures it). Arms:

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
  values sent between the workers costs.

The losses of every arm must be the same bits (the plan is the same: explicit tiles
from the one-process plan); the script stops if they are not.

Usage:
    python bench/scale_out.py [--workload mlp resnet unet3d transformer] [--workers 2]
        [--steps 3] [--small] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from run import FULL, SMALL, _step_span, make_data, train_streamed  # noqa: E402

import dfdl  # noqa: E402
from dfdl.taskgraph.optimize import GraphOptions  # noqa: E402

ARMS = {
    "one": None,
    "shares": GraphOptions(),
    "step-shares": GraphOptions(steps_per_task=1),
    "stages": GraphOptions(exchange=False),
    "tiles": GraphOptions(worker_tasks=False),
    "shares-tcp": GraphOptions(),
}
#: the arms' cluster arguments besides the number of workers
CLUSTER = {"shares-tcp": {"security": False}}


def step_time(
    workers: int | None, engine, model, x, y, cfg, steps: int, tiles, cluster_kw=None
) -> dict:
    """One arm on a fresh cluster (``workers`` processes, None: one process with a
    thread per core; ``cluster_kw``: more ``dfdl.LocalCluster`` arguments): seconds per
    step, the timed call's losses and its tiling."""
    from distributed import Client

    _, batch, kind, okw, _ = cfg
    options = dfdl.EngineOptions() if engine is None else dfdl.EngineOptions(graph=engine)
    with dfdl.LocalCluster(workers, **(cluster_kw or {})) as cluster, Client(cluster) as client:
        train_streamed(client, model, x, y, batch, kind, okw, 2, engine=options, tiles=tiles)
        result, records = train_streamed(
            client, model, x, y, batch, kind, okw, 1 + steps, engine=options, tiles=tiles
        )
    span, _ = _step_span(records, 1, steps)
    return {"step_s": span / steps, "losses": result.history["loss"], "tiles": result.tiles}


def main(argv: list[str] | None = None) -> dict:
    """Runs the arms on each workload; prints the table and writes JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", choices=list(FULL), default=list(FULL))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--small", action="store_true", help="bench/run.py's small sizes")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from dfdl.models import ZOO

    configs = SMALL if args.small else FULL
    out = {"workers": args.workers, "steps": args.steps, "load_at_start": os.getloadavg()[0]}
    rows = []
    for name in args.workload:
        cfg = configs[name]
        model = ZOO[name](**cfg[0])
        x, y = make_data(name, cfg[0], cfg[1] * (args.steps + 1))
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
            )
            tiles = tiles or got["tiles"]  # the one-process plan for every arm
            if "losses" in row and got["losses"] != row["losses"]:
                raise SystemExit(f"{name}: arm {arm} trained other losses than the first arm")
            row.setdefault("losses", got["losses"])
            row[arm] = got["step_s"]
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
