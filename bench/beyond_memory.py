"""Beyond memory: train an MLP whose working set is many times the workers' memory.

The MLP (``--in``-W-...-W-10, ``--depth`` hidden layers, SGD with momentum) is sized so
that its training working set (weights, momentum, gradients, the batch and the
activations kept for the backward pass, as :func:`dfdl.graph.estimate.working_set`
counts them) is at least ``--factor`` times the sum of the workers' memory limits. It
is trained for ``--steps`` steps

* **capped**: ``--workers`` worker processes (one thread each) with ``--memory-limit``
  each, spilling to a fresh local directory, planned for that limit;
* **uncapped**: the same plan (same tiles) on workers with limits large enough that
  nothing spills.

Dask's memory manager is configured as in dfdl's spill test: tiles (the bytes Dask
manages) are kept under ``target = 0.6`` of the limit and the rest spilled; Dask's
process-memory thresholds (spill/pause/terminate on the process's RSS) are off, because
at limits of a few hundred MiB the worker process's own footprint (interpreter, numpy,
numba, dfdl: about 200 MB, measured and reported) would already exceed them
(``--process-thresholds`` keeps them, for limits well above that footprint). Each
worker's resident memory is sampled every 20 ms; the report gives its peak, its idle
footprint before training (after one step of a tiny MLP has loaded the kernels and
freed memory has been returned to the system), and the peak above that footprint,
which is what the plan's estimate (:func:`dfdl.graph.estimate.estimate_memory`, "tile
memory per worker") predicts.

Also reported: samples/s of each run (steps x batch / training seconds, setup
excluded), throughput retention (capped / uncapped), bytes spilled per step from the
workers' spill metrics (``result.history``), the local disk's bandwidth measured in the
same run (1 GiB written with fsync, then read back), whether a worker process was
restarted (its pid changed) and whether the capped run's losses equal the uncapped
run's bit for bit, and PyTorch training the same MLP in a subprocess whose address
space (``RLIMIT_AS``) is capped at the workers' limits together: the stage it reached
and its error.

``memory="recompute"`` (checkpointing) is not implemented yet; the report says so.

Usage:
    python bench/beyond_memory.py [--workers 2] [--memory-limit 256MiB] [--factor 8]
        [--steps 3] [--batch 64] [--process-thresholds] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

import dask
import numpy as np
import psutil
from distributed import Client

import dfdl
import dfdl.models
from dfdl.graph.estimate import estimate_memory, working_set
from dfdl.graph.onnx_io import to_ir
from dfdl.graph.training import build_training_graph
from dfdl.ops.registry import TensorType
from dfdl.scheduler.cluster import parse_memory

MANAGED_ONLY = {
    "distributed.worker.memory.target": 0.6,
    "distributed.worker.memory.spill": False,
    "distributed.worker.memory.pause": False,
    "distributed.worker.memory.terminate": False,
}
UNCAPPED_LIMIT = 64 * 2**30


def _optimizer():
    return dfdl.optim.SGD(lr=1e-3, momentum=0.9)


def _sizes(n_in: int, width: int, depth: int) -> tuple[int, ...]:
    return (n_in, *([width] * depth), 10)


def _training_plan(sizes, batch: int, memory_limit: int | None, tiles=None):
    tg = build_training_graph(
        to_ir(dfdl.models.mlp(sizes)),
        {"x": TensorType((batch, sizes[0]), np.dtype("float32"))},
        loss="cross_entropy",
        optimizer=_optimizer(),
        labels=TensorType((batch,), np.dtype("int64")),
    )
    return tg.plan(tiles, cores=1, memory_limit=memory_limit)


def size_mlp(goal: int, n_in: int, depth: int, batch: int) -> int:
    """Smallest width (a multiple of 256) whose working set reaches ``goal`` bytes."""
    # 12 bytes per weight (value, momentum, gradient): start from that, then check
    width = max(256, int((goal / 12 / depth) ** 0.5) // 256 * 256)
    while working_set(_training_plan(_sizes(n_in, width, depth), batch, None)) < goal:
        width += 256
    return width


class RssSampler:
    """Peak resident memory of some processes, sampled on a thread."""

    def __init__(self, pids: dict[str, int], every: float = 0.02):
        self.procs = {k: psutil.Process(p) for k, p in pids.items()}
        self.peak = {k: 0 for k in pids}
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


def _pids(client) -> dict[str, int]:
    return client.run(os.getpid)


def _trim() -> None:
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def _warm_up(client) -> None:
    """One step of a tiny MLP loads every kernel the big one runs; then freed memory goes
    back to the system, and what stays is the worker's own footprint."""
    rng = np.random.default_rng(1)
    data = (rng.standard_normal((8, 16), dtype=np.float32), rng.integers(0, 10, 8))
    dfdl.train(
        dfdl.models.mlp((16, 32, 32, 10)),
        data=data,
        loss="cross_entropy",
        optimizer=_optimizer(),
        batch_size=8,
        steps=1,
        client=client,
        progress=False,
    )
    client.run(_trim)


def train_once(sizes, data, batch, steps, workers, limit, tiles, spill_dir, config) -> dict:
    """One training run on a fresh cluster; figures about it."""
    with (
        dask.config.set(config),
        dfdl.LocalCluster(workers, memory_limit=limit, local_directory=spill_dir) as cluster,
        Client(cluster) as client,
    ):
        _warm_up(client)
        before = _pids(client)
        idle = {w: psutil.Process(p).memory_info().rss for w, p in before.items()}
        with RssSampler(before) as rss:
            result = dfdl.train(
                dfdl.models.mlp(sizes),
                data=data,
                loss="cross_entropy",
                optimizer=_optimizer(),
                batch_size=batch,
                steps=steps,
                shuffle=False,
                client=client,
                tiles=tiles,
                progress=False,
            )
        after = _pids(client)
    t = result.timings
    seconds = t["total_s"] - t.get("setup_s", 0.0)
    history = result.history
    del result  # the trained model and parameters: as large as the weights
    gc.collect()
    return {
        "history": history,
        "seconds": seconds,
        "samples_per_s": steps * batch / seconds,
        "peak_rss": rss.peak,
        "idle_rss": idle,
        "peak_above_idle": {w: rss.peak[w] - idle[w] for w in idle},
        "restarted": sorted(w for w in before if after.get(w) != before[w]),
        "spilled_per_step": float(np.mean(history["spilled_bytes"])),
        "unspilled_per_step": float(np.mean(history["unspilled_bytes"])),
        "client_peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def disk_bandwidth(folder: str, nbytes: int = 2**30) -> dict:
    """Write ``nbytes`` with fsync, then read them back (MB/s)."""
    block = np.random.default_rng(0).bytes(16 * 2**20)
    path = os.path.join(folder, "bandwidth.bin")
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(nbytes // len(block)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    write = nbytes / (time.perf_counter() - t0) / 1e6
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(16 * 2**20):
            pass
    read = nbytes / (time.perf_counter() - t0) / 1e6
    os.remove(path)
    return {"write_MBps": write, "read_MBps": read}


TORCH_CHILD = r"""
import json, resource, sys
cap, sizes, batch = int(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
stage = "import torch"
try:
    import torch
    stage = "build the model"
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    stage = "train one step"
    x = torch.randn(batch, sizes[0])
    y = torch.randint(0, sizes[-1], (batch,))
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
    print(json.dumps({"outcome": "success", "stage": stage}))
except BaseException as e:
    error = f"{type(e).__name__}: {e}"[:300]
    print(json.dumps({"outcome": "failed", "stage": stage, "error": error}))
"""


def torch_under_cap(cap: int, sizes, batch: int) -> dict:
    """PyTorch training the same MLP with its address space capped at ``cap`` bytes."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return {"outcome": "not run", "error": "PyTorch is not installed (pip install dfdl[torch])"}
    proc = subprocess.run(
        [sys.executable, "-c", TORCH_CHILD, str(cap), json.dumps(list(sizes)), str(batch)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if lines:
        return json.loads(lines[-1])
    return {"outcome": "failed", "stage": "start", "error": proc.stderr.strip()[-300:]}


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-limit", default="256MiB", help="per worker (capped run)")
    ap.add_argument("--factor", type=float, default=8.0, help="working set / limits together")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--in", dest="n_in", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument(
        "--process-thresholds",
        action="store_true",
        help="keep Dask's process-memory spill/pause/terminate thresholds (default: off)",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    limit = parse_memory(args.memory_limit, "--memory-limit")
    cap = args.workers * limit
    width = size_mlp(int(args.factor * cap), args.n_in, args.depth, args.batch)
    sizes = _sizes(args.n_in, width, args.depth)
    plan = _training_plan(sizes, args.batch, limit)
    est = estimate_memory(plan, args.workers)
    ws = est.working_set
    print(f"MLP {'-'.join(map(str, sizes))}, batch {args.batch}, {args.steps} steps")
    print(f"plan for {_mib(limit)} per worker: tiles={plan.tiles}, {plan.n_tasks()} tasks/step")
    for line in est.lines():
        print("  " + line)

    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.batch * args.steps, args.n_in), dtype=np.float32)
    y = rng.integers(0, 10, args.batch * args.steps)
    report: dict = {
        "model": {"sizes": sizes, "batch": args.batch, "steps": args.steps},
        "workers": args.workers,
        "memory_limit": limit,
        "dask_process_thresholds": args.process_thresholds,
        "working_set": ws,
        "working_set_over_cap": ws / cap,
        "tiles": plan.tiles,
        "estimate": {
            "peak_per_worker": est.peak_per_worker,
            "spilled_per_step": est.spilled_per_step,
        },
    }
    with tempfile.TemporaryDirectory(prefix="dfdl-spill-") as spill:
        report["disk"] = disk_bandwidth(spill)
        config = {} if args.process_thresholds else MANAGED_ONLY
        common = ((X, y), args.batch, args.steps, args.workers)
        capped = train_once(sizes, *common, limit, plan.tiles, spill, config)
        uncapped = train_once(sizes, *common, UNCAPPED_LIMIT, plan.tiles, spill, config)
    report["torch_under_cap"] = torch_under_cap(cap, sizes, args.batch)
    same = capped["history"]["loss"] == uncapped["history"]["loss"]
    for name, run in (("capped_spill", capped), ("uncapped", uncapped)):
        report[name] = dict(run)
    report["losses_bit_identical"] = same
    report["retention"] = capped["samples_per_s"] / uncapped["samples_per_s"]
    report["recompute"] = "not implemented (memory='recompute' is future work)"
    peaks = capped["peak_above_idle"]
    report["estimate_error"] = {w: (est.peak_per_worker - p) / p for w, p in peaks.items() if p > 0}

    print(f"\nworking set {_mib(ws)} = {ws / cap:.1f}x the limits together ({_mib(cap)})")
    print(
        f"disk: write {report['disk']['write_MBps']:.0f} MB/s (fsync), "
        f"read {report['disk']['read_MBps']:.0f} MB/s"
    )
    print(f"{'run':14s} {'samples/s':>10s} {'spilled/step':>13s} {'read/step':>11s}  restarted")
    for name, run in (("capped spill", capped), ("uncapped", uncapped)):
        print(
            f"{name:14s} {run['samples_per_s']:10.1f} {_mib(run['spilled_per_step']):>13s} "
            f"{_mib(run['unspilled_per_step']):>11s}  {run['restarted'] or 'none'}"
        )
    print(f"throughput retention (capped / uncapped): {report['retention']:.1%}")
    print(f"losses bit for bit equal: {same}")
    print(
        f"client process peak RSS: {_mib(uncapped['client_peak_rss'])} "
        "(the weights are built, sent and gathered there)"
    )
    print(f"predicted spilled/step {_mib(est.spilled_per_step)}")
    for w in sorted(peaks):
        idle = capped["idle_rss"][w]
        print(
            f"worker {w}: peak RSS {_mib(capped['peak_rss'][w])} (idle {_mib(idle)},"
            f" above idle {_mib(peaks[w])}; predicted {_mib(est.peak_per_worker)}, "
            f"limit {_mib(limit)})"
        )
    t = report["torch_under_cap"]
    print(
        f"PyTorch under RLIMIT_AS={_mib(cap)}: {t['outcome']} at '{t.get('stage')}'"
        + (f" ({t['error']})" if t.get("error") else "")
    )
    print("memory='recompute': not implemented")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
