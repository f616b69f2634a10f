"""Forward-pass benchmark: ``dfdl.run`` against onnxruntime and PyTorch on the model zoo.

For each zoo model at a realistic size, times one forward pass of

* ``dfdl.run`` on dfdl's embedded cluster (:func:`dfdl.runtime.cluster.local_cluster`,
  one single-threaded worker process per core), started once and reused; each call
  includes what ``dfdl.run`` does on the client (load, bind, plan, ship the weights),
* onnxruntime on the same model (``intra_op_num_threads`` = cores),
* the model's torch twin in eval mode with the same weights (``torch.set_num_threads``
  = cores), when torch is installed,

in alternation (dfdl, onnxruntime, torch, dfdl, ...). Each backend's first call is a
warm-up and is not timed. Outputs are checked cheaply: the largest difference from
onnxruntime relative to the output's largest magnitude is printed. This is a benchmark,
not a test.

Usage:
    python bench/forward.py [--model mlp resnet ...] [--batch N] [--repeat R] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

import dfdl
from dfdl.models import ZOO, example_inputs
from dfdl.runtime.cluster import default_workers, local_cluster

#: builder arguments and batch per model; each forward takes ~0.2-2 s on 2 cores
CONFIGS: dict[str, tuple[dict, int]] = {
    "mlp": (dict(sizes=(784, 4096, 4096, 10)), 1024),
    "resnet": (dict(image_size=32, stem=64, stages=(64, 128, 256), blocks_per_stage=2), 64),
    "unet3d": (dict(base=16, levels=3, volume=32), 2),
    "transformer": (dict(vocab=1000, d_model=256, heads=4, ff=1024, layers=2, seq=128), 16),
}


def _ort_runner(model, feeds: dict[str, np.ndarray], cores: int) -> Callable[[], np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = cores
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, feeds)[0]


def _torch_runner(name: str, kw: dict, model, feeds: dict, cores: int):
    """The twin's forward pass, or None when torch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    from dfdl.models.torch_twins import load_onnx_weights, twin

    torch.set_num_threads(cores)
    module = load_onnx_weights(twin(name, **kw), model).eval()
    args = [torch.from_numpy(v) for v in feeds.values()]

    def run() -> np.ndarray:
        with torch.inference_mode():
            return module(*args).numpy()

    return run


def _max_rel_diff(out: np.ndarray, ref: np.ndarray) -> float:
    """max |out - ref| / max |ref|: one number per output, insensitive to near-zero entries."""
    return float(np.abs(out - ref).max() / max(float(np.abs(ref).max()), 1e-30))


def bench_model(name: str, batch: int | None, repeat: int, client, cores: int) -> dict:
    """Times every backend on one model; returns a JSON-ready record."""
    kw, default_batch = CONFIGS[name]
    batch = batch or default_batch
    model = ZOO[name](**kw)
    feeds = example_inputs(name, batch=batch, **kw)
    runners = {
        "dfdl": lambda: dfdl.run(model, feeds, client=client)["logits"],
        "onnxruntime": _ort_runner(model, feeds, cores),
    }
    torch_run = _torch_runner(name, kw, model, feeds, cores)
    if torch_run is not None:
        runners["torch"] = torch_run
    times: dict[str, list[float]] = {k: [] for k in runners}
    outputs: dict[str, np.ndarray] = {}
    for r in range(repeat + 1):  # round 0 is the warm-up
        for backend, fn in runners.items():
            t0 = time.perf_counter()
            out = fn()
            dt = time.perf_counter() - t0
            if r == 0:
                outputs[backend] = out
            else:
                times[backend].append(dt)
    ref = outputs["onnxruntime"]
    record = {"model": name, "config": kw, "batch": batch, "repeat": repeat, "backends": {}}
    for backend, ts in times.items():
        median = statistics.median(ts)
        record["backends"][backend] = {
            "seconds": ts,
            "median_s": median,
            "samples_per_s": batch / median,
            "max_rel_diff_vs_ort": _max_rel_diff(outputs[backend], ref),
        }
    if "torch" in times:
        b = record["backends"]
        record["dfdl_over_torch"] = b["dfdl"]["median_s"] / b["torch"]["median_s"]
    return record


def _table(records: list[dict]) -> str:
    backends = ["dfdl", "onnxruntime", "torch"]
    head = f"{'model':12s} {'batch':>5s}"
    for b in backends:
        head += f" {b + ' s':>14s} {'samples/s':>10s}"
    head += f" {'dfdl/torch':>10s}  max rel diff vs ort (dfdl, torch)"
    lines = [head]
    for rec in records:
        line = f"{rec['model']:12s} {rec['batch']:5d}"
        for b in backends:
            got = rec["backends"].get(b)
            line += (
                f" {got['median_s']:14.3f} {got['samples_per_s']:10.1f}"
                if got
                else f" {'-':>14s} {'-':>10s}"
            )
        ratio = rec.get("dfdl_over_torch")
        line += f" {ratio:10.2f}" if ratio is not None else f" {'-':>10s}"
        diffs = [rec["backends"][b]["max_rel_diff_vs_ort"] for b in ("dfdl", "torch")
                 if b in rec["backends"]]  # fmt: skip
        line += "  " + ", ".join(f"{d:.1e}" for d in diffs)
        lines.append(line)
    return "\n".join(lines)


def _machine() -> dict:
    import dask
    import onnxruntime

    info = {
        "cores": default_workers(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "dask": dask.__version__,
        "onnxruntime": onnxruntime.__version__,
        "dfdl": dfdl.__version__,
        "loadavg_start": os.getloadavg(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info


def main(argv: list[str] | None = None) -> list[dict]:
    """Parses arguments, runs the benchmark, prints the table and writes JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--batch", type=int, default=None, help="override every batch size")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per backend")
    parser.add_argument("--json", default=None, help="write the results to this file")
    args = parser.parse_args(argv)
    from distributed import Client

    cores = default_workers()
    machine = _machine()  # before the cluster starts: load average of other jobs
    records = []
    with local_cluster() as cluster, Client(cluster) as client:
        for name in args.model:
            records.append(bench_model(name, args.batch, args.repeat, client, cores))
            print(f"done {name}", file=sys.stderr, flush=True)
    machine["loadavg_end"] = os.getloadavg()
    print(_table(records))
    start, end = machine["loadavg_start"][0], machine["loadavg_end"][0]
    print(f"{cores} cores; 1-min load average {start:.1f} at start, {end:.1f} at end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "results": records}, f, indent=2)
    return records


if __name__ == "__main__":
    main()
