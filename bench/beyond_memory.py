"""Beyond memory: train a model whose working set is many times the workers' memory.

``--model unet3d`` (default): a 3-D U-Net (``--base`` channels, 3 levels, Adam) whose
cubic volume is sized; ``--model mlp``: an MLP (``--in``-W-...-W-10, ``--depth`` hidden
layers, SGD with momentum) whose width is sized. Either is sized so that its training
working set (weights, optimizer state, gradients, the batch and the activations kept for
the backward pass, as :func:`dfdl.plan.estimate.working_set` counts them) is at least
``--factor`` times the sum of the workers' memory limits. It is trained for ``--steps``
steps

* **capped, spill**: ``--workers`` worker processes (one thread each) with
  ``--memory-limit`` each, spilling to a fresh local directory, planned for that limit,
  ``memory="spill"``;
* **capped, recompute**: the same, ``memory="recompute"`` (activations rebuilt from
  checkpoints in the backward pass);
* **capped, auto**: the same, ``memory="auto"`` (what it recomputes is reported);
* **uncapped**: the same plan (same tiles) on workers with limits large enough that
  nothing spills (``--uncapped-limit``, when the working set does not fit this machine's
  memory: the run's spilled bytes are reported), ``memory="spill"``.

Dask's memory manager runs with its defaults: tiles kept under ``target = 0.6`` of the
limit, and the process's resident memory spilled at 0.7, paused at 0.8 and the worker
restarted at 0.95 of the limit, so the limit bounds each worker's whole resident memory,
and the plan counts the worker process's own footprint (:mod:`dfdl.plan.estimate`).
``--managed-only`` switches the process thresholds off (the limit then bounds the tiles
Dask manages, as in dfdl's spill tests), for limits of a few hundred MiB, below what a
worker process takes by itself (about 210 MiB, measured and reported). Each worker's
resident memory is sampled every 20 ms; the report gives its peak, its idle footprint
before training (after one step of a tiny model has loaded the kernels and freed memory
has been returned to the system), and the plan's prediction
(:func:`dfdl.plan.estimate.estimate_memory`): the whole process's peak with the
thresholds on, the peak above the idle footprint with ``--managed-only``.

Also reported: samples/s of each run (steps x batch / training seconds, setup
excluded), throughput retention (capped / uncapped), bytes spilled per step from the
workers' spill metrics (``result.history``), the local disk's bandwidth measured in the
same run (1 GiB written with fsync, then read back), whether a worker process was
restarted (its pid changed) and whether each capped run's losses equal the uncapped
run's bit for bit, and PyTorch training the same model in a subprocess whose address
space (``RLIMIT_AS``) is capped at the workers' limits together: the stage it reached
and its error.

Usage:
    python bench/beyond_memory.py [--model unet3d|mlp] [--workers 2]
        [--memory-limit 1GiB] [--factor 8] [--steps 3] [--batch N]
        [--modes spill,recompute,auto] [--managed-only] [--json out.json]
"""

from __future__ import annotations

import abc
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
from dfdl.ir.onnx_io import to_ir
from dfdl.ops.registry import TensorType
from dfdl.plan.compile import Workers, choose_variant, plan_graph, training_plan
from dfdl.plan.estimate import estimate_memory, working_set
from dfdl.runtime.cluster import parse_memory, worker_memory_config
from dfdl.training.graph import build_training_graph

MANAGED_ONLY = {
    "distributed.worker.memory.target": 0.6,
    "distributed.worker.memory.spill": False,
    "distributed.worker.memory.pause": False,
    "distributed.worker.memory.terminate": False,
}
UNCAPPED_LIMIT = 64 * 2**30


class Workload(abc.ABC):
    """A zoo model sized by one number (the MLP's width, the U-Net's volume)."""

    name = ""
    step = 1  # sizes tried go up by this much

    @abc.abstractmethod
    def kwargs(self, size: int) -> dict:
        """The zoo builder's arguments at ``size``."""

    def model(self, size: int):
        return dfdl.models.ZOO[self.name](**self.kwargs(size))

    def optimizer(self):
        return dfdl.optim.SGD(lr=1e-3, momentum=0.9)

    @abc.abstractmethod
    def data(self, size: int, n: int):
        """``n`` samples and labels."""

    @abc.abstractmethod
    def first_size(self, goal: int) -> int:
        """The size sizing starts from."""

    def training_graph(self, size: int, batch: int):
        x, y = self.data(size, batch)
        return build_training_graph(
            to_ir(self.model(size)),
            {"x": TensorType(x.shape, x.dtype)},
            loss="cross_entropy",
            optimizer=self.optimizer(),
            labels=TensorType(y.shape, y.dtype),
        )

    def sized(self, goal: int, batch: int) -> int:
        """The smallest size whose training working set reaches ``goal`` bytes."""
        size = self.first_size(goal)
        while working_set(plan_graph(self.training_graph(size, batch), {"batch": 1})) < goal:
            size += self.step
        return size


class Mlp(Workload):
    name = "mlp"
    step = 256

    def __init__(self, n_in: int, depth: int):
        self.n_in, self.depth = n_in, depth

    def kwargs(self, size: int) -> dict:
        return {"sizes": (self.n_in, *([size] * self.depth), 10)}

    def data(self, size: int, n: int):
        rng = np.random.default_rng(0)
        return rng.standard_normal((n, self.n_in), dtype=np.float32), rng.integers(0, 10, n)

    def first_size(self, goal: int) -> int:
        # 12 bytes per weight (value, momentum, gradient): start from that, then check
        return max(256, int((goal / 12 / self.depth) ** 0.5) // 256 * 256)


class Unet(Workload):
    name = "unet3d"
    levels = 3
    step = 2 ** (levels - 1)

    def __init__(self, base: int):
        self.base = base

    def kwargs(self, size: int) -> dict:
        return {"base": self.base, "levels": self.levels, "volume": size}

    def optimizer(self):
        return dfdl.optim.Adam(lr=1e-3)

    def data(self, size: int, n: int):
        rng = np.random.default_rng(0)
        x = rng.standard_normal((n, 1, size, size, size), dtype=np.float32)
        return x, rng.integers(0, 2, (n, size, size, size))

    def first_size(self, goal: int) -> int:
        return 4 * self.step


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


def _warm_up(client, work: Workload) -> None:
    """One step of a tiny model of the same kind loads every kernel the big one runs;
    then freed memory goes back to the system, and what stays is the worker's own
    footprint."""
    tiny = work.first_size(0) if work.name == "unet3d" else 32
    dfdl.train(
        work.model(tiny),
        data=work.data(tiny, 2),
        loss="cross_entropy",
        optimizer=work.optimizer(),
        batch_size=2,
        steps=1,
        client=client,
        progress=False,
        memory="recompute",
    )
    client.run(_trim)


def train_once(work, size, data, batch, steps, workers, limit, tiles, spill_dir, config, memory):
    """One training run on a fresh cluster; figures about it."""
    with (
        dask.config.set(config),
        dfdl.LocalCluster(workers, memory_limit=limit, local_directory=spill_dir) as cluster,
        Client(cluster) as client,
    ):
        _warm_up(client, work)
        before = _pids(client)
        idle = {w: psutil.Process(p).memory_info().rss for w, p in before.items()}
        with RssSampler(before) as rss:
            result = dfdl.train(
                work.model(size),
                data=data,
                loss="cross_entropy",
                optimizer=work.optimizer(),
                batch_size=batch,
                steps=steps,
                shuffle=False,
                client=client,
                tiles=tiles,
                progress=False,
                memory=memory,
            )
        after = _pids(client)
    t = result.timings
    seconds = t["total_s"] - t.get("setup_s", 0.0)
    history = result.history
    recomputed = result.recomputed
    del result  # the trained model and parameters: as large as the weights
    gc.collect()
    return {
        "history": history,
        "memory": memory,
        "recomputed": recomputed,
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
cap, name, kwargs, batch = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
stage = "import torch"
try:
    import torch
    stage = "build the model"
    from dfdl.models.torch_twins import twin
    net = twin(name, **kwargs).train()
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    stage = "train one step"
    if name == "mlp":
        x = torch.randn(batch, kwargs["sizes"][0])
        y = torch.randint(0, kwargs["sizes"][-1], (batch,))
    else:
        v = kwargs["volume"]
        x = torch.randn(batch, 1, v, v, v)
        y = torch.randint(0, 2, (batch, v, v, v))
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
    print(json.dumps({"outcome": "success", "stage": stage}))
except BaseException as e:
    error = f"{type(e).__name__}: {e}"[:300]
    print(json.dumps({"outcome": "failed", "stage": stage, "error": error}))
"""


def torch_under_cap(cap: int, work: Workload, size: int, batch: int) -> dict:
    """PyTorch training the same model with its address space capped at ``cap`` bytes."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return {"outcome": "not run", "error": "PyTorch is not installed (pip install dfdl[torch])"}
    kwargs = json.dumps(work.kwargs(size))
    proc = subprocess.run(
        [sys.executable, "-c", TORCH_CHILD, str(cap), work.name, kwargs, str(batch)],
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


MODES = ("spill", "recompute", "auto")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("unet3d", "mlp"), default="unet3d")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-limit", default="1GiB", help="per worker (capped runs)")
    ap.add_argument("--factor", type=float, default=8.0, help="working set / limits together")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=None, help="default: 2 (unet3d), 64 (mlp)")
    ap.add_argument("--base", type=int, default=8, help="unet3d: channels of the first level")
    ap.add_argument("--in", dest="n_in", type=int, default=1024, help="mlp: input features")
    ap.add_argument("--depth", type=int, default=4, help="mlp: hidden layers")
    ap.add_argument(
        "--modes",
        default=",".join(MODES),
        help="capped runs' memory= modes, comma-separated (default: spill,recompute,auto)",
    )
    ap.add_argument(
        "--managed-only",
        action="store_true",
        help="switch Dask's process-memory spill/pause/restart thresholds off (default: on)",
    )
    ap.add_argument(
        "--uncapped-limit",
        default=f"{UNCAPPED_LIMIT // 2**30}GiB",
        help="per worker in the reference run (default: large enough that nothing spills; "
        "give less when the working set does not fit this machine's memory, and read its "
        "spilled bytes in the report)",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes: choose from {', '.join(MODES)}")

    work: Workload = Unet(args.base) if args.model == "unet3d" else Mlp(args.n_in, args.depth)
    batch = args.batch or (2 if args.model == "unet3d" else 64)
    limit = parse_memory(args.memory_limit, "--memory-limit")
    cap = args.workers * limit
    size = work.sized(int(args.factor * cap), batch)
    tg = work.training_graph(size, batch)
    config = MANAGED_ONLY if args.managed_only else {}
    # the plan counts the worker footprint with thresholds on, and dfdl's pause line: as
    # dfdl.train plans for these workers (dfdl.plan.compile)
    workers = Workers(
        cores=args.workers,
        processes=args.workers,
        memory_limit=limit,
        thresholds={**config, **worker_memory_config()},
    )
    spilling = training_plan(tg, None, workers)
    plan = spilling.plan
    rc_plan = choose_variant(spilling, "recompute", workers).plan
    with dask.config.set(config), dask.config.set(worker_memory_config()):
        est = estimate_memory(plan, args.workers)
        rc_est = estimate_memory(rc_plan, args.workers)
    ws = est.working_set
    print(f"{work.name} {work.kwargs(size)}, batch {batch}, {args.steps} steps")
    print(f"plan for {_mib(limit)} per worker: tiles={plan.tiles}, {plan.n_tasks()} tasks/step")
    for line in est.lines():
        print("  spill:     " + line)
    for line in rc_est.lines():
        print("  recompute: " + line)

    X, y = work.data(size, batch * args.steps)
    report: dict = {
        "model": {"name": work.name, **work.kwargs(size), "batch": batch, "steps": args.steps},
        "workers": args.workers,
        "memory_limit": limit,
        "dask_process_thresholds": not args.managed_only,
        "uncapped_limit": args.uncapped_limit,
        "working_set": ws,
        "working_set_over_cap": ws / cap,
        "tiles": plan.tiles,
        "estimate": {
            "spill": {
                "working_set": est.working_set,
                "peak_per_worker": est.peak_per_worker,
                "spilled_per_step": est.spilled_per_step,
            },
            "recompute": {
                "working_set": rc_est.working_set,
                "peak_per_worker": rc_est.peak_per_worker,
                "spilled_per_step": rc_est.spilled_per_step,
            },
        },
    }
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="dfdl-spill-") as spill:
        report["disk"] = disk_bandwidth(spill)
        common = (work, size, (X, y), batch, args.steps, args.workers)
        for mode in modes:
            runs[f"capped_{mode}"] = train_once(*common, limit, plan.tiles, spill, config, mode)
        reference = parse_memory(args.uncapped_limit, "--uncapped-limit")
        runs["uncapped"] = train_once(*common, reference, plan.tiles, spill, config, "spill")
    report["torch_under_cap"] = torch_under_cap(cap, work, size, batch)
    uncapped = runs["uncapped"]
    for name, run in runs.items():
        run["losses_bit_identical"] = run["history"]["loss"] == uncapped["history"]["loss"]
        run["retention"] = run["samples_per_s"] / uncapped["samples_per_s"]
        predicted = rc_est if run["memory"] == "recompute" else est
        measured = run["peak_above_idle"] if args.managed_only else run["peak_rss"]
        run["estimate_error"] = {
            w: (predicted.peak_per_worker - p) / p for w, p in measured.items() if p > 0
        }
        run["under_limit"] = all(p < limit for p in run["peak_rss"].values())
        report[name] = run

    print(f"\nworking set {_mib(ws)} = {ws / cap:.1f}x the limits together ({_mib(cap)})")
    print(
        f"disk: write {report['disk']['write_MBps']:.0f} MB/s (fsync), "
        f"read {report['disk']['read_MBps']:.0f} MB/s"
    )
    print(
        f"{'run':18s} {'samples/s':>10s} {'retention':>9s} {'spilled/step':>13s} "
        f"{'read/step':>11s} {'bit-equal':>9s} {'recomputed':>10s}  restarted"
    )
    for name, run in runs.items():
        print(
            f"{name:18s} {run['samples_per_s']:10.3g} {run['retention']:9.1%} "
            f"{_mib(run['spilled_per_step']):>13s} {_mib(run['unspilled_per_step']):>11s} "
            f"{str(run['losses_bit_identical']):>9s} {len(run['recomputed']):>10d}  "
            f"{run['restarted'] or 'none'}"
        )
    print(
        f"predicted spilled/step: spill {_mib(est.spilled_per_step)}, "
        f"recompute {_mib(rc_est.spilled_per_step)}"
    )
    for name, run in runs.items():
        if name == "uncapped":
            continue
        predicted = rc_est if run["memory"] == "recompute" else est
        for w in sorted(run["peak_rss"]):
            print(
                f"{name} worker {w}: peak RSS {_mib(run['peak_rss'][w])} "
                f"({run['peak_rss'][w] / limit:.0%} of the limit {_mib(limit)}; idle "
                f"{_mib(run['idle_rss'][w])}, above idle {_mib(run['peak_above_idle'][w])}); "
                f"predicted {_mib(predicted.peak_per_worker)} "
                f"({'above idle' if args.managed_only else 'whole process'}, error "
                f"{run['estimate_error'].get(w, float('nan')):+.0%})"
            )
    print(
        f"client process peak RSS: {_mib(uncapped['client_peak_rss'])} "
        "(the weights are built, sent and gathered there)"
    )
    t = report["torch_under_cap"]
    print(
        f"PyTorch under RLIMIT_AS={_mib(cap)}: {t['outcome']} at '{t.get('stage')}'"
        + (f" ({t['error']})" if t.get("error") else "")
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
