"""GPU training benchmark: ``dfdl.train`` on one GPU worker against PyTorch CUDA.

For each workload of ``bench/run.py`` (``--full`` sizes by default here: a GPU is idle at
the small ones), in alternation per round:

* dfdl: ``dfdl.train`` for ``W + N`` steps on ``dfdl.LocalCluster(gpus=1)`` (one worker
  process, two threads, the tile kernels of :mod:`dfdl.ops.gpu`), under Dask's task
  stream; the step time is the span from the end of step ``max(W, 1) - 1`` to the end of
  the last step over the steps in it (``bench/run.py``'s estimator). Every step's loss is
  copied to the host on the worker, so a step's span includes its kernels' completion.
* PyTorch: the model's torch twin with the same initial weights on the GPU, fp32 (TF32
  off for matrix products and convolutions), ``W`` untimed steps then ``N`` steps timed
  one by one with ``torch.cuda.synchronize()`` before each clock reading.

Both fp32. Also measured in the same run: cupy's fp32 matmul rate (8192^3) and, per
workload, how many tile runs fell back to an op's CPU function on the host
(:data:`dfdl.ops.gpu.device.FALLBACKS`, read from the worker after the rounds).

Usage:
    python bench/gpu.py [--workload mlp transformer resnet unet3d] [--steps N]
        [--warmup W] [--rounds R] [--small] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (bench/ is not a package)
from dask.utils import key_split  # noqa: E402

import dfdl  # noqa: E402
from dfdl.models import ZOO  # noqa: E402
from dfdl.taskgraph.step_tasks import STEP_NAME  # noqa: E402


def cupy_matmul_tflops(n: int = 8192, repeat: int = 5) -> float:
    """cupy float32 ``n``-cube matrix product rate (TFLOP/s), best of ``repeat``."""
    import cupy as cp

    rng = cp.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=cp.float32)
    b = rng.standard_normal((n, n), dtype=cp.float32)
    a @ b
    cp.cuda.Device().synchronize()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        a @ b
        cp.cuda.Device().synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e12


def _fallbacks() -> dict:
    from dfdl.ops.gpu.device import FALLBACKS

    return dict(FALLBACKS)


def _train_traced(client, model, x, y, batch, kind, okw, steps):
    """``dfdl.train`` under the task stream, with the step tasks' members traced: the
    result, the stream's records (step tasks as tasks) and the members' runs."""
    from distributed import get_task_stream

    client.run(run._trace_gangs, True)
    try:
        with get_task_stream(client) as ts:
            result = dfdl.train(
                model,
                (x, y),
                optimizer=run._dfdl_optimizer(kind, okw),
                batch_size=batch,
                steps=steps,
                shuffle=False,
                client=client,
                progress=False,
            )
    finally:
        traces = client.run(run._trace_gangs, False)
    return result, ts.data, [t for v in traces.values() for t in v]


def group_span(records: list[dict], first: int, last: int) -> tuple[float, int]:
    """``(seconds, steps)``: from the end of the step task before the one that starts at
    or after step ``first`` to the end of the last one starting at or before ``last``,
    and the steps those tasks ran. A GPU worker runs several steps per task, each task
    keyed by its first step (members are keyed inside a compiled step program, so the
    stream's step tasks are what can be timed).

    Example:
        >>> r = lambda s, t: {"key": (f"{STEP_NAME}-0a1b2c3d", s),
        ...                   "startstops": [{"action": "compute", "start": t - 1, "stop": t}]}
        >>> group_span([r(0, 1.0), r(4, 2.0), r(8, 3.5)], 4, 11)
        (2.5, 8)
    """
    ends = {}
    for r in records:
        if key_split(r["key"]) == STEP_NAME:
            for x in r["startstops"]:
                if x["action"] == "compute":
                    ends[r["key"][1]] = max(ends.get(r["key"][1], 0.0), x["stop"])
    starts = sorted(ends)
    timed = [s for s in starts if first <= s <= last]
    before = [s for s in starts if s < timed[0]]
    if not timed or not before:
        raise RuntimeError(f"no step tasks to time between steps {first} and {last}")
    after = [s for s in starts if s > timed[-1]]
    steps = (after[0] if after else last + 1) - timed[0]
    return ends[timed[-1]] - ends[before[-1]], steps


def step_anatomy(records: list[dict], members: list[tuple], first: int, last: int) -> dict:
    """Of the step tasks (a GPU worker runs several steps per task) whose first step lies
    in ``first..last``: how many there were, the median task's run (``task_s``), their
    members' host time per step (``members_s``: launching kernels, host work; the GPU
    runs behind) and the median idle time between one task's end and the next one's
    start (``gap_s``)."""
    runs = []
    for r in records:
        if key_split(r["key"]) == STEP_NAME and first <= r["key"][1] <= last:
            ss = [x for x in r["startstops"] if x["action"] == "compute"]
            if ss:
                runs.append((ss[0]["start"], ss[0]["stop"]))
    runs.sort()
    # members are keyed inside a step program: attribute them to tasks by time
    busy = sum(
        stop - start
        for _key, _thread, start, stop in members
        if any(a <= start <= b for a, b in runs)
    )
    med = statistics.median
    return {
        "step_tasks": len(runs),
        "task_s": med(b - a for a, b in runs) if runs else None,
        "members_s": busy / (last - first + 1),
        "gap_s": med(runs[i + 1][0] - runs[i][1] for i in range(len(runs) - 1))
        if len(runs) > 1
        else None,
    }


def bench_workload(name: str, cfg, steps: int, warmup: int, rounds: int, client) -> dict:
    kw, batch, kind, okw, dims = cfg
    model = ZOO[name](**kw)
    x, y = run.make_data(name, kw, batch * (warmup + steps))
    flops = 3 * run.forward_flops(model, batch, dims)
    torch_step = run._torch_stepper(name, kw, model, kind, okw, x, y, batch, device="cuda")
    dfdl_s, torch_s, losses, parts = [], [], [], []
    for _ in range(rounds):
        result, raw, members = _train_traced(client, model, x, y, batch, kind, okw, warmup + steps)
        span, n = group_span(raw, max(warmup, 1), warmup + steps - 1)
        dfdl_s.append(span / n)
        busy = sum(stop - start for *_, start, stop in members)
        losses.append(result.history["loss"])
        t = result.timings
        parts.append(
            {
                # the client's graph building and submission per step (all steps' graphs
                # are built in groups of `unroll`, overlapping the workers' steps)
                "client_graph_s": (t["graph_s"] + t["submit_s"]) / (warmup + steps),
                # the worker's task time per step inside the span (step tasks: launches
                # and the host's share; the GPU runs behind them)
                # the traced members' host time over all steps of the call
                "worker_task_s": busy / (warmup + steps),
                "tiles": result.tiles,
                **step_anatomy(raw, members, max(warmup, 1), warmup + steps - 1),
            }
        )
        for _ in range(warmup):
            torch_step()
        for _ in range(steps):
            t0 = time.perf_counter()
            torch_step()
            torch_s.append(time.perf_counter() - t0)
        print(
            f"  {name}: dfdl {dfdl_s[-1] * 1e3:.1f} ms/step (client graph "
            f"{parts[-1]['client_graph_s'] * 1e3:.1f} ms; {parts[-1]['step_tasks']} step tasks"
            f" of {(parts[-1]['task_s'] or 0) * 1e3:.1f} ms, members' host time "
            f"{(parts[-1]['members_s'] or 0) * 1e3:.1f} ms, gap "
            f"{(parts[-1]['gap_s'] or 0) * 1e3:.1f} ms), torch "
            f"{statistics.median(torch_s[-steps:]) * 1e3:.1f} ms/step",
            file=sys.stderr,
            flush=True,
        )
    d, t = statistics.median(dfdl_s), statistics.median(torch_s)
    return {
        **run.workload_record(name, cfg, steps, warmup, rounds),
        "train_gflop_per_step": flops / 1e9,
        "dfdl": {
            "step_seconds": dfdl_s,
            "median_step_s": d,
            "tflop_per_s": flops / d / 1e12,
            "per_step_parts": parts,
        },
        "torch": {"step_seconds": torch_s, "median_step_s": t, "tflop_per_s": flops / t / 1e12},
        "dfdl_over_torch_samples_per_s": t / d,
        "dfdl_losses_repeat": all(v == losses[0] for v in losses),
        "host_fallbacks_per_op": client.run(_fallbacks),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", choices=list(run.FULL), default=list(run.FULL))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="bench/run.py's small sizes")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    import torch
    from distributed import Client

    configs = run.SMALL if args.small else run.FULL
    machine = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cupy_fp32_matmul_tflops": cupy_matmul_tflops(),
    }
    print(f"{machine['gpu']}: cupy fp32 matmul {machine['cupy_fp32_matmul_tflops']:.1f} TFLOP/s")
    records = []
    with dfdl.LocalCluster(gpus=1) as cluster, Client(cluster) as client:
        for name in args.workload:
            records.append(
                bench_workload(name, configs[name], args.steps, args.warmup, args.rounds, client)
            )
            client.run(_reset_fallbacks)
            if args.json:  # after each workload: a run cut short keeps what it measured
                with open(args.json, "w") as f:
                    json.dump({"machine": machine, "workloads": records}, f, indent=1)
    print(f"{'workload':12s} {'batch':>5s} {'dfdl ms':>8s} {'torch ms':>8s} {'dfdl/torch':>10s}")
    for r in records:
        print(
            f"{r['workload']:12s} {r['batch']:5d} {r['dfdl']['median_step_s'] * 1e3:8.1f}"
            f" {r['torch']['median_step_s'] * 1e3:8.1f} {r['dfdl_over_torch_samples_per_s']:10.3f}"
        )
    return records


def _reset_fallbacks() -> None:
    from dfdl.ops.gpu.device import FALLBACKS

    FALLBACKS.clear()


if __name__ == "__main__":
    main()
