"""A user's own cluster: ``dfdl.train(model, client=Client(cluster))`` on a plain
``distributed.LocalCluster`` with Dask's default memory thresholds and no dfdl preload.

An MLP (``--width`` wide, ``--depth`` hidden layers, SGD with momentum) is trained for
``--steps`` steps on ``--workers`` single-threaded worker processes of ``--memory-limit``
each (spill at 0.7, pause at 0.8, restart at 0.95 of the limit: Dask's defaults), then on
the same plan (same tiles) with no memory limit. Reported: the working set against the
limits together, each worker's peak resident memory (sampled every 20 ms) against its
limit, whether a worker was restarted (its pid changed, or a nanny logged a
``worker-restart-memory`` event), the rollbacks, the training time, and whether the
capped run's losses and weights equal the uncapped run's bit for bit.

Usage:
    python bench/user_cluster.py [--width 8192] [--depth 6] [--batch 64] [--steps 2]
        [--workers 2] [--memory-limit 512MiB] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

import numpy as np
import psutil
from distributed import Client, LocalCluster

import dfdl
import dfdl.models
from dfdl.ir.onnx_io import to_ir
from dfdl.ops.registry import TensorType
from dfdl.plan.compile import plan_graph
from dfdl.plan.estimate import working_set
from dfdl.runtime.cluster import parse_memory
from dfdl.training.graph import build_training_graph


class RssSampler:
    """Peak resident memory of some processes, sampled on a thread."""

    def __init__(self, pids: dict[str, int], every: float = 0.02):
        self.procs = {k: psutil.Process(p) for k, p in pids.items()}
        self.peak = dict.fromkeys(pids, 0)
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for k, p in self.procs.items():
                try:
                    self.peak[k] = max(self.peak[k], p.memory_info().rss)
                except psutil.Error:
                    pass
            time.sleep(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _train(client, sizes, data, batch, steps, tiles=None):
    return dfdl.train(
        dfdl.models.mlp(sizes),
        data=data,
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=1e-3, momentum=0.9),
        batch_size=batch,
        steps=steps,
        shuffle=False,
        client=client,
        tiles=tiles,
        progress=False,
    )


def _working_set(sizes, batch) -> int:
    tg = build_training_graph(
        to_ir(dfdl.models.mlp(sizes)),
        {"x": TensorType((batch, sizes[0]), np.float32)},
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=1e-3, momentum=0.9),
        labels=TensorType((batch,), np.int64),
    )
    return working_set(plan_graph(tg, {"batch": 1}))


def run(limit, sizes, data, batch, steps, workers, tiles=None) -> dict:
    with (
        tempfile.TemporaryDirectory(prefix="dfdl-user-cluster-") as spill,
        LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            memory_limit=limit,
            processes=True,
            local_directory=spill,
            dashboard_address=None,
        ) as cluster,
        Client(cluster) as client,
    ):
        pids = client.run(os.getpid)
        t0 = time.perf_counter()
        with RssSampler(pids) as rss:
            result = _train(client, sizes, data, batch, steps, tiles)
        seconds = time.perf_counter() - t0
        restarts = [e for _, e in client.get_events("worker-restart-memory")]
        after = client.run(os.getpid)
    return {
        "result": result,
        "seconds": seconds,
        "peak_rss": rss.peak,
        "same_workers": sorted(pids.values()) == sorted(after.values()),
        "memory_restarts": restarts,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--n-in", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-limit", default="512MiB")
    ap.add_argument("--no-uncapped", action="store_true", help="skip the uncapped run")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    limit = parse_memory(args.memory_limit)
    sizes = (args.n_in, *([args.width] * args.depth), 10)
    rng = np.random.default_rng(0)
    n = args.batch * args.steps
    data = rng.standard_normal((n, args.n_in), dtype=np.float32), rng.integers(0, 10, n)
    ws = _working_set(sizes, args.batch)
    print(f"working set {ws / 2**30:.2f} GiB = {ws / (args.workers * limit):.2f}x the limits")
    capped = run(limit, sizes, data, args.batch, args.steps, args.workers)
    res = capped["result"]
    report = {
        "sizes": sizes,
        "batch": args.batch,
        "steps": args.steps,
        "memory_limit": limit,
        "working_set": ws,
        "factor": ws / (args.workers * limit),
        "capped_s": capped["seconds"],
        "peak_rss_fraction": {k: v / limit for k, v in capped["peak_rss"].items()},
        "same_workers": capped["same_workers"],
        "memory_restarts": capped["memory_restarts"],
        "rollbacks": res.rollbacks,
        "tiles": res.tiles,
        "spilled_bytes": res.history["spilled_bytes"],
        "losses": res.history["loss"],
    }
    print(json.dumps({k: v for k, v in report.items() if k != "losses"}, default=str))
    if not args.no_uncapped:
        free = run(0, sizes, data, args.batch, args.steps, args.workers, tiles=res.tiles)
        fr = free["result"]
        report["uncapped_s"] = free["seconds"]
        report["uncapped_losses"] = fr.history["loss"]
        report["bit_for_bit"] = fr.history["loss"] == res.history["loss"] and all(
            np.array_equal(fr.params[k], res.params[k]) for k in fr.params
        )
        print("uncapped", free["seconds"], "bit for bit:", report["bit_for_bit"])
    print("losses", report["losses"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
