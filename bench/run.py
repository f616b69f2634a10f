"""Training benchmark: ``dfdl.train`` against the PyTorch twin on the model zoo.

For each workload, times training steps of

* ``dfdl.train`` on dfdl's embedded cluster (:func:`dfdl.runtime.cluster.local_cluster`,
  one worker process with a thread per core) started once and reused, or on the
  cluster at ``--scheduler ADDRESS``,
* the model's torch twin with the same initial weights (``load_onnx_weights``), in
  ``.train()`` mode, fp32, same batch size, same optimizer and hyperparameters,
  ``torch.set_num_threads(os.cpu_count())``,

in alternation (dfdl, torch, dfdl, torch, ...; ``--rounds`` rounds, at least 2).

Step time, dfdl: each round runs ``dfdl.train`` for ``W + N`` steps (W = ``--warmup``,
N = ``--steps``) under Dask's task stream. Task keys are ``(name, step, *tile)``, so the
stream gives the time each step's last task ended; the step time is the span from the
end of step ``max(W, 1) - 1`` to the end of the last step, divided by the steps in it.
That is the steady-state throughput of the pipeline (steps are submitted ``unroll``,
default 4, at a time), measured inside one call, free of the call's fixed costs
(building the training graph, planning, scattering and gathering weights).
The earlier estimator, ``(t(W + N) - t(W)) / N`` from a second, ``W``-step call (each t
without ``TrainResult.timings["setup_s"]``), is still recorded
(``step_seconds_call_difference``): on 2026-11-24 its two rounds of one MLP run gave
1.64 and 0.61 s per step, since the fixed costs it subtracts vary by seconds.

Step time, torch: per round, W untimed steps, then N steps timed one by one (forward,
loss, backward, optimizer step). Reported figures are medians over rounds (dfdl) or over
all timed steps (torch).

FLOPs: 3x the forward FLOPs of Gemm/MatMul/Conv/ConvTranspose (1x forward, 2x backward
for the input and weight gradients), counted from the static shapes of
``dfdl.plan(model, batch_size=..., dims=...).graph``: a multiply-add is 2 FLOPs;
Gemm/MatMul 2*prod(output)*K; Conv 2*prod(output)*prod(W.shape[1:]); ConvTranspose
2*prod(input)*prod(W.shape[1:]). Elementwise ops, norms, softmax, the loss and the
optimizer update are not counted. GFLOP/s are compared with the machine's matmul rate,
measured in the same run (numpy float32 4096x4096 @ 4096x4096, best of 3) in the
benchmark's process, whose environment the workers inherit. The JSON records which
OpenBLAS kernels numpy runs (``OPENBLAS_CORETYPE`` and OpenBLAS's own report): an
environment that pins older kernels (``OPENBLAS_CORETYPE=Haswell`` on an AVX-512 CPU)
halves the matmul rate of every numpy GEMM, dfdl's included, but not PyTorch's.

Time outside kernels: the thread-seconds workers spent executing tasks within the
span above (the task stream's "compute" intervals, clipped to the span: tile kernels
and the tile bookkeeping around them), over ``threads x`` the span, is the share inside
kernels (until 2026-11-26 the tasks were picked by the step in their key instead, which
counted the first timed step's tasks that ran before the span: the MLP's share read
6.9% where it was 11.5%); the rest is outside kernels: scheduling, idle threads
waiting on dependencies and transfers (the task stream's "transfer" intervals, reported separately).
A gang or chain of tasks (:mod:`dfdl.taskgraph.gang`) is one task in the stream, on one
thread, while its members run on that thread and the worker's helper threads: every
dfdl call here records the members' runs (``dfdl.taskgraph.gang.TRACE``) and counts them
in its place (:func:`with_members`), so ``threads`` is the worker's cores, helpers
included.

Dask's floor (``bench/dask_floor.py``): the run times a level of no-op tasks (one per
worker thread, each reading every task of the level before) on the cluster, and for
each workload counts the tasks on the longest dependency chain of one step in the
graphs ``dfdl.train`` submits. Every link of that chain waits for a round trip through
the scheduler; where no task off the chain fills those round trips (graphs whose
levels hold one tile per thread), the step cannot be shorter than the kernels'
thread-seconds per step over the threads plus chain x level latency (``bound``).

CPU by role (``bench/cpu_use.py``, Linux): the CPU seconds of every thread of the
trainer's, the scheduler's and the workers' processes, read from ``/proc`` every 0.25 s
during each call; between the first and the last reading inside the timed span, per
second, times the step: ``kernels`` (the workers' task threads), ``worker`` (their event
loops, profilers, nannies), ``scheduler`` (on the embedded cluster, the loop thread of
the trainer's process) and ``trainer`` (graph building and submission: a call of a
few steps submits them all before the span, so this one is the call's graph-building
and submission time per step instead, ``TrainResult.timings``). Their sum over
the cores is the shortest step that CPU allows with no core ever idle (``cpu-bound``);
``idle`` is the cores' time none of them used. The readings themselves cost the
scheduler and the workers a few milliseconds of CPU per second (in every round, so in
the dfdl step times too).

Cold and warm start: a fresh process (``--first-step``) starts the embedded cluster and
times two one-step ``dfdl.train`` calls; the first pays for numba compilation (cold: an
empty ``NUMBA_CACHE_DIR``; warm: the cache the cold run filled) and first imports, the
second does not. The difference is the start-up cost over a steady call.

The full-size workloads (``--full``, the sizes of the issue) take far longer than 10
minutes on a small machine, so the default is ``--small``: every workload scaled down
about 8x (batch or volume).

Usage:
    python bench/run.py [--workload mlp resnet unet3d transformer] [--steps N] [--warmup W]
        [--rounds R] [--full] [--json out.json] [--scheduler ADDRESS | --workers N]
        [--no-start]
    python bench/run.py --device gpu [bench/gpu.py's arguments]   # dfdl on a GPU worker
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from dask.utils import key_split

import dfdl
from dfdl.models import ZOO, example_inputs
from dfdl.ops.cpu import blas as dfdl_blas
from dfdl.ops.registry import TensorType, node_cost
from dfdl.runtime.cluster import default_workers, local_cluster, total_threads
from dfdl.taskgraph.step_tasks import STEP_NAME

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_use  # noqa: E402
import dask_floor  # noqa: E402
from forward import _machine  # noqa: E402  (bench/ is not a package)

#: name -> (builder kwargs, batch, optimizer kind, optimizer kwargs, dims for dfdl.plan)
FULL: dict[str, tuple[dict, int, str, dict, dict]] = {
    "mlp": (dict(sizes=(784, 4096, 4096, 4096, 10)), 1024, "sgd", dict(lr=0.01, momentum=0.9), {}),
    "resnet": (
        dict(in_channels=3, image_size=32, stem=64, stages=(64, 128, 256), blocks_per_stage=2),
        128,
        "sgd",
        dict(lr=0.01, momentum=0.9),
        {},
    ),
    "unet3d": (
        dict(in_channels=1, base=16, levels=3, volume=64, num_classes=2),
        2,
        "adam",
        dict(lr=1e-3),
        {},
    ),
    "transformer": (
        dict(vocab=1000, d_model=512, heads=8, ff=2048, layers=4, seq=256),
        16,
        "adamw",
        dict(lr=1e-3, weight_decay=1e-2),
        {"seq": 256},
    ),
}

#: about 8x less work per step: 8x smaller batch, or 8x fewer voxels for unet3d
SMALL: dict[str, tuple[dict, int, str, dict, dict]] = {
    "mlp": (*FULL["mlp"][:1], 128, *FULL["mlp"][2:]),
    "resnet": (*FULL["resnet"][:1], 16, *FULL["resnet"][2:]),
    "unet3d": ({**FULL["unet3d"][0], "volume": 32}, 2, *FULL["unet3d"][2:]),
    "transformer": (*FULL["transformer"][:1], 2, *FULL["transformer"][2:]),
}


def matmul_gflops(n: int = 4096, repeat: int = 3) -> float:
    """GFLOP/s of a numpy float32 n x n matmul, best of ``repeat``."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def dfdl_matmul_gflops(n: int = 4096, repeat: int = 5) -> float:
    """GFLOP/s of dfdl's own CPU matmul (:mod:`dfdl.ops.cpu.blas`) as its workers run
    it: with MKL (sequential), one float32 n x n product per core at once, best of
    ``repeat``; with numpy's BLAS, :func:`matmul_gflops` (all cores on one product)."""
    from concurrent.futures import ThreadPoolExecutor

    from dfdl.ops.cpu.blas import backend, matmul

    if backend() == "numpy":
        return matmul_gflops(n, repeat)
    cores = default_workers()
    rng = np.random.default_rng(0)
    pairs = [
        (
            rng.standard_normal((n, n), dtype=np.float32),
            rng.standard_normal((n, n), dtype=np.float32),
        )
        for _ in range(cores)
    ]
    best = math.inf
    with ThreadPoolExecutor(cores) as pool:
        for _ in range(repeat):
            t0 = time.perf_counter()
            list(pool.map(lambda ab: matmul(*ab), pairs))
            best = min(best, time.perf_counter() - t0)
    return cores * 2 * n**3 / best / 1e9


def openblas_kernels() -> str:
    """Which OpenBLAS kernels numpy runs here, and whether the environment chose them."""
    try:
        from threadpoolctl import threadpool_info

        cores = sorted(
            {
                i.get("architecture", "?")
                for i in threadpool_info()
                if i["internal_api"] == "openblas"
            }
        )
    except ImportError:
        cores = ["?"]
    pinned = os.environ.get("OPENBLAS_CORETYPE")
    return "/".join(cores) + (f", pinned by OPENBLAS_CORETYPE={pinned}" if pinned else "")


def forward_flops(model, batch: int, dims: dict) -> int:
    """Forward FLOPs of Gemm/MatMul/Conv/ConvTranspose from the plan's static shapes."""
    graph = dfdl.plan(model, batch_size=batch, dims=dims or None).graph
    types = dict(graph.types)
    for k, v in graph.initializers.items():
        types.setdefault(k, TensorType(np.shape(v), np.asarray(v).dtype))
    counted = ("Gemm", "MatMul", "Conv", "ConvTranspose")
    return sum(
        node_cost(n, types).flops for n in graph.nodes if n.op_type in counted and not n.domain
    )


def _stream_seconds(records: list[dict]) -> dict[str, float]:
    """Thread-seconds of task execution ("compute") and transfers in task-stream data."""
    out = {"compute_s": 0.0, "transfer_s": 0.0}
    for rec in records:
        for ss in rec.get("startstops", ()):
            if ss["action"] in ("compute", "transfer"):
                out[f"{ss['action']}_s"] += ss["stop"] - ss["start"]
    return out


def _occupancy(records: list[dict], first: int, last: int, threads: int) -> list[float]:
    """Shares of the span of :func:`_step_span` during which 0, 1, ..., ``threads``
    worker threads were executing a task (task stream "compute" intervals).

    All threads idle is the dependency round trips (a level's last task has ended, the
    next level's first has not started); some idle is imbalance between the tiles of a
    level and single tasks (merges) that only one thread can run.

    Example:
        >>> rec = lambda k, a, b: {"key": (k, 0), "startstops": [
        ...     {"action": "compute", "start": a, "stop": b}]}
        >>> rec1 = lambda k, a, b: {**rec(k, a, b), "key": (k, 1)}
        >>> _occupancy([rec("x", 0, 1), rec1("y", 1, 2), rec1("z", 1.5, 3)], 1, 1, 2)
        [0.0, 0.75, 0.25]
    """
    ends = _step_ends(records)
    t0, t1 = ends[first - 1], ends[last]
    events = sorted(e for a, b in _computing(records, t0, t1) for e in ((a, 1), (b, -1)))
    spent = [0.0] * (threads + 1)
    running, at = 0, t0
    for t, d in events:
        spent[min(running, threads)] += t - at
        running, at = running + d, t
    spent[min(running, threads)] += t1 - at
    return [v / (t1 - t0) for v in spent]


def _computing(records: list[dict], t0: float, t1: float):
    """The task-stream "compute" intervals, clipped to ``[t0, t1]`` (empty ones left out)."""
    for rec in records:
        for ss in rec.get("startstops", ()):
            a, b = max(ss["start"], t0), min(ss["stop"], t1)
            if ss["action"] == "compute" and a < b:
                yield a, b


def _step_of(key) -> int | None:
    """The step of a task key ``(name, step, *tile)``; None for other keys."""
    step = key[1] if isinstance(key, tuple) and len(key) > 1 else None
    return step if isinstance(step, int) else None


def _step_ends(records: list[dict]) -> dict[int, float]:
    """``{step: when its last task ended}`` from task-stream records."""
    ends: dict[int, float] = {}
    for rec in records:
        step = _step_of(rec["key"])
        if step is None:
            continue
        for ss in rec.get("startstops", ()):
            if ss["action"] == "compute":
                ends[step] = max(ends.get(step, 0.0), ss["stop"])
    return ends


def member_id(key) -> str:
    """A tile task's key without its run token and step, as a string: the same for the
    task in every step and every run.

    Example:
        >>> member_id(("conv-fwd-ab12cd34", 3, 0, 1))
        "('conv-fwd', 0, 1)"
    """
    return repr((key[0].rsplit("-", 1)[0], *key[2:]))


def member_seconds(records: list[dict], first: int) -> dict[str, float]:
    """Each tile task's mean compute seconds over steps ``>= first`` (task-stream
    records, step tasks' members included as :func:`with_members` gives them), by
    :func:`member_id`: what a real step's tasks took inside it.

    Example:
        >>> rec = lambda k, a, b: {"key": k, "startstops": [
        ...     {"action": "compute", "start": a, "stop": b}]}
        >>> member_seconds([rec(("a-x1", 0, 0), 0, 9), rec(("a-x2", 1, 0), 0, 1),
        ...                 rec(("a-x3", 2, 0), 0, 3)], 1)
        {"('a', 0)": 2.0}
    """
    times: dict = {}
    for rec in records:
        step = _step_of(rec["key"])
        if step is None or step < first:
            continue
        for ss in rec.get("startstops", ()):
            if ss["action"] == "compute":
                times.setdefault(member_id(rec["key"]), []).append(ss["stop"] - ss["start"])
    return {k: sum(v) / len(v) for k, v in times.items()}


def _step_span(records: list[dict], first: int, last: int) -> tuple[float, float]:
    """(seconds, task thread-seconds) from the end of step ``first - 1`` to the end of
    step ``last``, from task-stream records of one ``dfdl.train`` call.

    Task keys are ``(name, step, *tile)``; a step ends when its last task does. The
    span covers steps ``first..last`` in the steady state of one call: no planning,
    scattering or gathering in it, so it is not a difference of two noisy call times.
    The thread-seconds are those of every task interval inside the span, clipped to it
    (by time, not by the step in the key: steps overlap, and step ``first``'s tasks that
    ran before the span, while step ``first - 1`` finished, are not in it. Counted by
    key they were: the MLP's outside-kernels share measured 6.9% that way against
    11.5% by time, in the same round; the other workloads within 1.2 points).

    Example:
        >>> rec = lambda k, a, b: {"key": k, "startstops": [
        ...     {"action": "compute", "start": a, "stop": b}]}
        >>> _step_span([rec(("x", 0), 0.0, 2.0), rec(("y", 1), 1.0, 3.0)], 1, 1)
        (1.0, 1.0)
    """
    ends = _step_ends(records)
    if first - 1 not in ends or last not in ends:
        raise RuntimeError(f"the task stream has no tasks of step {first - 1} or {last}")
    t0, t1 = ends[first - 1], ends[last]
    return t1 - t0, sum(b - a for a, b in _computing(records, t0, t1))


def _node_ops(model, x: np.ndarray, y: np.ndarray, batch: int, kind: str, okw: dict) -> dict:
    """``f"{node}-{phase}"`` -> op type, for the training graph dfdl.train builds."""
    from dfdl.ir.onnx_io import to_ir
    from dfdl.training.graph import build_training_graph

    graph = to_ir(model)
    tg = build_training_graph(
        graph,
        {graph.inputs[0]: TensorType((batch, *x.shape[1:]), x.dtype)},
        loss="cross_entropy",
        optimizer=_dfdl_optimizer(kind, okw),
        labels=TensorType((batch, *y.shape[1:]), y.dtype),
    )
    return {f"{n.name}-{n.phase}": n.op_type for n in tg.graph.nodes}


def _by_op(records: list[dict], op_of: dict) -> dict[str, dict[str, float]]:
    """Task count and thread-seconds per op type (and phase), from task-stream data."""
    from dask.utils import key_split

    out: dict[str, dict[str, float]] = {}
    for rec in records:
        name = key_split(rec["key"])
        for suffix in ("-partial", "-sum"):
            name = name.removesuffix(suffix)
        phase = name.rsplit("-", 1)[-1]
        op = op_of.get(name, "other")
        label = f"{op} ({phase})" if op != "other" else "other (inputs, rechunks)"
        d = out.setdefault(label, {"tasks": 0, "seconds": 0.0})
        for ss in rec.get("startstops", ()):
            if ss["action"] == "compute":
                d["tasks"] += 1
                d["seconds"] += ss["stop"] - ss["start"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["seconds"]))


def first_step(name: str, full: bool) -> dict:
    """In this (fresh) process: start the embedded cluster, time two one-step trains."""
    kw, batch, kind, okw, _dims = (FULL if full else SMALL)[name]
    model = ZOO[name](**kw)
    x, y = make_data(name, kw, batch)
    from distributed import Client

    t0 = time.perf_counter()
    with local_cluster() as cluster, Client(cluster) as client:
        out = {"cluster_start_s": time.perf_counter() - t0}
        for label in ("first_call_s", "second_call_s"):
            t0 = time.perf_counter()
            dfdl.train(
                model,
                (x, y),
                optimizer=_dfdl_optimizer(kind, okw),
                batch_size=batch,
                steps=1,
                shuffle=False,
                client=client,
                progress=False,
            )
            out[label] = time.perf_counter() - t0
    out["start_overhead_s"] = out["first_call_s"] - out["second_call_s"]
    return out


def start_costs(name: str, full: bool) -> dict:
    """Cold- and warm-cache start costs, each measured in a fresh process."""
    import subprocess
    import tempfile

    out = {}
    with tempfile.TemporaryDirectory(prefix="dfdl-numba-cache-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        for label in ("cold", "warm"):
            cmd = [sys.executable, os.path.abspath(__file__), "--first-step", name]
            cmd += ["--full"] if full else []
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"--first-step {name} failed:\n{done.stderr[-2000:]}")
            out[label] = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"  {name} {label} start: {out[label]}", file=sys.stderr, flush=True)
    return out


def make_data(name: str, kw: dict, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random samples and integer labels (per voxel for unet3d)."""
    x = next(iter(example_inputs(name, batch=n, **kw).values()))
    rng = np.random.default_rng(1)
    classes = kw.get("num_classes", 10 if name != "mlp" else kw["sizes"][-1])
    if name == "unet3d":
        y = rng.integers(0, classes, size=(n, *x.shape[2:]), dtype=np.int64)
    else:
        y = rng.integers(0, classes, size=(n,), dtype=np.int64)
    return x, y


def train_streamed(
    client, model, x, y, batch: int, kind: str, okw: dict, steps: int, engine=None, tiles=None
):
    """One ``steps``-step ``dfdl.train`` call on ``client`` under Dask's task stream, as
    every dfdl measurement here runs it (with ``engine``: :class:`dfdl.EngineOptions`;
    ``tiles``: ``dfdl.train``'s, None for automatic); returns ``(TrainResult,
    task-stream records)``."""
    from distributed import get_task_stream

    client.run(_trace_gangs, True)
    try:
        with get_task_stream(client) as ts:
            result = dfdl.train(
                model,
                (x, y),
                optimizer=_dfdl_optimizer(kind, okw),
                batch_size=batch,
                steps=steps,
                shuffle=False,
                client=client,
                progress=False,
                engine=engine,
                tiles=tiles,
            )
    finally:
        traces = client.run(_trace_gangs, False)
    return result, with_members(ts.data, [t for v in traces.values() for t in v])


def _trace_gangs(on: bool) -> list:
    """On a worker: start recording gang members' runs (:data:`dfdl.taskgraph.gang.TRACE`),
    or stop and return what was recorded."""
    from dfdl.taskgraph import gang

    got = gang.TRACE or []
    gang.TRACE = [] if on else None
    return got


def with_members(records: list[dict], members: list[tuple]) -> list[dict]:
    """Task-stream ``records`` with each step task, gang or chain
    (:mod:`dfdl.taskgraph.step_tasks`, :mod:`dfdl.taskgraph.gang`), which the stream shows as
    one task on one thread, replaced by its members' runs on the threads that ran them
    (``(key, thread, start, stop)`` from ``gang.TRACE``): the kernels' thread-seconds
    and the threads' occupancy count the helper threads too.

    Example:
        >>> rec = {"key": ("a", 0, 0), "startstops": [
        ...     {"action": "compute", "start": 0.0, "stop": 2.0}]}
        >>> out = with_members([rec], [(("a", 0, 0), "t0", 0.0, 1.0),
        ...                            (("a", 0, 1), "dfdl-gang_0", 0.1, 0.9),
        ...                            (("b", 0, 0), "t0", 1.0, 2.0)])
        >>> [(r["key"], r["thread"]) for r in out]
        [(('a', 0, 0), 't0'), (('a', 0, 1), 'dfdl-gang_0'), (('b', 0, 0), 't0')]
    """
    traced = {key for key, *_ in members}
    # a step task (dfdl.taskgraph.step_tasks) is its members' runs, recorded one by one
    out = [r for r in records if r["key"] not in traced and key_split(r["key"]) != STEP_NAME]
    for key, thread, start, stop in members:
        out.append(
            {
                "key": key,
                "thread": thread,
                "startstops": [{"action": "compute", "start": start, "stop": stop}],
            }
        )
    return out


def _dfdl_optimizer(kind: str, okw: dict):
    return {"sgd": dfdl.optim.SGD, "adam": dfdl.optim.Adam, "adamw": dfdl.optim.AdamW}[kind](**okw)


def _torch_stepper(
    name: str, kw: dict, model, kind: str, okw: dict, x, y, batch: int, device: str = "cpu"
):
    """One training step of the torch twin per call, on ``device`` (``"cuda"``: fp32 with
    TF32 off, synchronized before it returns)."""
    import torch
    import torch.nn.functional as F

    from dfdl.models.torch_twins import load_onnx_weights, twin

    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    module = load_onnx_weights(twin(name, **kw), model).to(device).train()
    opt_cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    opt = opt_cls[kind](module.parameters(), **okw)
    xt, yt = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
    n_batches = len(x) // batch
    state = {"i": 0}

    def step() -> float:
        i = state["i"] % n_batches
        state["i"] += 1
        sl = slice(i * batch, (i + 1) * batch)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(module(xt[sl]), yt[sl])
        loss.backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        return float(loss.detach())

    return step


def step_chain(client, model, x, y, batch: int, kind: str, okw: dict) -> tuple[int, int]:
    """``(tasks, tasks on the longest dependency chain)`` of the middle step of a 3-step
    ``dfdl.train`` call, from the graphs its scheduler received (``dask_floor``)."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(dask_floor)  # a remote scheduler lacks bench/
    client.register_plugin(dask_floor.GraphRecorder())
    try:
        train_streamed(client, model, x, y, batch, kind, okw, 3)
        deps = dask_floor.recorded(client)
    finally:
        client.unregister_scheduler_plugin(dask_floor.GraphRecorder.name)
    chains = dask_floor.longest_chain_per_step(deps)
    counts = dask_floor.tasks_per_step(deps)
    middle = sorted(chains)[len(chains) // 2]
    return counts[middle], chains[middle]


def workload_record(name: str, cfg, steps: int, warmup: int, rounds: int) -> dict:
    """The fields that say what was measured: workload, model, batch, optimizer, steps."""
    kw, batch, kind, okw, _ = cfg
    return {
        "workload": name,
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in kw.items()},
        "batch": batch,
        "optimizer": {"kind": kind, **okw},
        "steps": steps,
        "warmup": warmup,
        "rounds": rounds,
    }


def bench_workload(
    name: str, cfg, steps: int, warmup: int, rounds: int, client, level_s: float | None = None
) -> dict:
    """Times dfdl and torch on one workload; returns a JSON-ready record. With
    ``level_s`` (:func:`dask_floor.level_latency`), also the step's Dask floor: its
    longest dependency chain times ``level_s``, and that plus the step's task
    thread-seconds over the threads (``bound_s``), the shortest step Dask's round trips
    allow at this kernel time."""
    kw, batch, kind, okw, dims = cfg
    model = ZOO[name](**kw)
    x, y = make_data(name, kw, batch * (warmup + steps))
    fwd = forward_flops(model, batch, dims)
    step_flops = 3 * fwd

    threads = total_threads(client)
    op_of = _node_ops(model, x, y, batch, kind, okw)
    profiles: list[dict] = []

    def dfdl_time(k: int) -> tuple[float, dict]:
        t0 = time.perf_counter()
        with cpu_use.Sampler(client) as cpu:
            res, records = train_streamed(client, model, x, y, batch, kind, okw, k)
        wall = time.perf_counter() - t0
        profiles.append(_by_op(records, op_of))
        return wall, {**_stream_seconds(records), **res.timings, "records": records, "cpu": cpu}

    torch_step = _torch_stepper(name, kw, model, kind, okw, x, y, batch)
    dfdl_steps: list[float] = []
    dfdl_diff_steps: list[float] = []
    dfdl_runs: list[tuple[float, float]] = []
    torch_steps: list[float] = []
    breakdowns: list[dict] = []
    for _ in range(rounds):
        t_long, b_long = dfdl_time(warmup + steps)
        t_short, b_short = dfdl_time(warmup) if warmup > 0 else (0.0, {})
        dfdl_runs.append((t_long, t_short))
        records = b_long.pop("records")
        b_short.pop("records", None)
        # the steady state of the long call: from the end of the last warm-up step to
        # the end of the last step (step 0 carries the call's start-up)
        span, busy = _step_span(records, max(warmup, 1), warmup + steps - 1)
        n_span = warmup + steps - max(warmup, 1)
        step_s = span / n_span
        dfdl_steps.append(step_s)
        # the earlier estimator, kept for comparison: difference of the two calls'
        # times without their setup; the spread of the fixed costs it subtracts
        # (gathering, scattering) was measured as large as a step
        diff_s = ((t_long - b_long["setup_s"]) - (t_short - b_short.get("setup_s", 0.0))) / steps
        dfdl_diff_steps.append(diff_s)
        sampler = b_long.pop("cpu")
        b_short.pop("cpu", None)
        per_step = {k: (b_long[k] - b_short.get(k, 0.0)) / steps for k in b_long}
        # CPU by role over the timed span (the samples inside it), per step
        ends = _step_ends(records)
        rates = sampler.per_second(ends[max(warmup, 1) - 1], ends[warmup + steps - 1])
        per_step["cpu_s"] = {r: v * step_s for r, v in rates.items()} if rates else None
        if rates:  # the call built every step's graph up front, before the span
            built = b_long["graph_s"] + b_long["submit_s"]
            per_step["cpu_s"]["trainer"] = built / (warmup + steps)
        per_step["compute_s"] = busy / n_span
        per_step["outside_kernels_share"] = 1 - busy / (threads * span)
        per_step["threads_busy_shares"] = _occupancy(
            records, max(warmup, 1), warmup + steps - 1, threads
        )
        breakdowns.append(per_step)
        for _ in range(warmup):
            torch_step()
        for _ in range(steps):
            t0 = time.perf_counter()
            torch_step()
            torch_steps.append(time.perf_counter() - t0)
        t_med = statistics.median(torch_steps[-steps:])
        msg = f"  {name}: dfdl {dfdl_steps[-1]:.3f} s/step, torch {t_med:.3f} s/step"
        print(msg, file=sys.stderr, flush=True)
    rec = {
        **workload_record(name, cfg, steps, warmup, rounds),
        "forward_gflop_per_step": fwd / 1e9,
        "train_gflop_per_step": step_flops / 1e9,
        "backends": {},
    }
    for backend, ts in (("dfdl", dfdl_steps), ("torch", torch_steps)):
        med = statistics.median(ts)
        rec["backends"][backend] = {
            "step_seconds": ts,
            "median_step_s": med,
            "samples_per_s": batch / med if med > 0 else math.inf,
            "gflop_per_s": step_flops / med / 1e9 if med > 0 else math.inf,
        }
    rec["backends"]["dfdl"]["train_call_seconds_long_short"] = dfdl_runs
    rec["backends"]["dfdl"]["step_seconds_call_difference"] = dfdl_diff_steps
    rec["backends"]["dfdl"]["threads"] = threads
    rec["backends"]["dfdl"]["by_op_first_long_call"] = profiles[0]
    rec["backends"]["dfdl"]["per_step_breakdown"] = breakdowns
    rec["backends"]["dfdl"]["outside_kernels_share"] = statistics.median(
        b["outside_kernels_share"] for b in breakdowns
    )
    # the round whose step was the median one
    middle = sorted(range(len(dfdl_steps)), key=dfdl_steps.__getitem__)[len(dfdl_steps) // 2]
    rec["backends"]["dfdl"]["threads_busy_shares"] = breakdowns[middle]["threads_busy_shares"]
    b = rec["backends"]
    rec["dfdl_over_torch_samples_per_s"] = b["dfdl"]["samples_per_s"] / b["torch"]["samples_per_s"]
    cpu_step = breakdowns[middle]["cpu_s"]
    if cpu_step and any(cpu_step.values()):  # Linux: /proc was there to read
        bound = cpu_use.cpu_bound(cpu_step, threads)
        rec["cpu"] = {
            "per_step_s": cpu_step,
            "bound_s": bound,
            "bound_over_torch_samples_per_s": b["torch"]["median_step_s"] / bound,
            "idle_share": 1 - sum(cpu_step.values()) / (threads * dfdl_steps[middle]),
        }
    if level_s is not None:
        tasks, chain = step_chain(client, model, x, y, batch, kind, okw)
        kernels = statistics.median(p["compute_s"] for p in breakdowns) / threads
        bound = kernels + chain * level_s
        rec["dask_floor"] = {
            "tasks_per_step": tasks,
            "chain_tasks": chain,
            "level_latency_s": level_s,
            "floor_s": chain * level_s,
            "kernels_per_thread_s": kernels,
            "bound_s": bound,
            "bound_over_torch_samples_per_s": b["torch"]["median_step_s"] / bound,
        }
    return rec


def _table(records: list[dict], matmul: float, own: float) -> str:
    head = (
        f"{'workload':12s} {'batch':>5s} {'GFLOP/step':>10s}"
        f" {'dfdl s/step':>11s} {'samples/s':>9s} {'GFLOP/s':>8s}"
        f" {'torch s/step':>12s} {'samples/s':>9s} {'GFLOP/s':>8s} {'dfdl/torch':>10s}"
        f" {'dfdl %mm':>8s} {'torch %mm':>9s} {'%blas':>6s} {'outside':>7s}"
        f" {'cold+s':>6s} {'warm+s':>6s} {'chain':>5s} {'bound':>6s} {'bnd/torch':>9s}"
    )
    lines = [head]
    for r in records:
        d, t = r["backends"]["dfdl"], r["backends"]["torch"]
        lines.append(
            f"{r['workload']:12s} {r['batch']:5d} {r['train_gflop_per_step']:10.2f}"
            f" {d['median_step_s']:11.3f} {d['samples_per_s']:9.1f} {d['gflop_per_s']:8.1f}"
            f" {t['median_step_s']:12.3f} {t['samples_per_s']:9.1f} {t['gflop_per_s']:8.1f}"
            f" {r['dfdl_over_torch_samples_per_s']:10.3f}"
            f" {100 * d['gflop_per_s'] / matmul:7.1f}% {100 * t['gflop_per_s'] / matmul:8.1f}%"
            f" {100 * d['gflop_per_s'] / own:5.1f}%"
            f" {100 * d['outside_kernels_share']:6.1f}%"
            f" {_start(r, 'cold'):>6s} {_start(r, 'warm'):>6s}"
            + (_floor(f) if (f := r.get("dask_floor")) else "")
        )
    return "\n".join(lines)


def _floor(f: dict) -> str:
    ratio = f["bound_over_torch_samples_per_s"]
    return f" {f['chain_tasks']:5d} {f['bound_s']:6.3f} {ratio:9.3f}"


def _start(rec: dict, which: str) -> str:
    got = rec.get("start", {}).get(which)
    return "-" if got is None else f"{got['start_overhead_s']:.1f}"


def main(argv: list[str] | None = None) -> list[dict]:
    """Parses arguments, runs the benchmark, prints the table and writes JSON
    (``--device gpu``: ``bench/gpu.py`` with the other arguments)."""
    pick = argparse.ArgumentParser(add_help=False)
    pick.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    known, rest = pick.parse_known_args(argv)
    if known.device == "gpu":
        import gpu

        return gpu.main(rest)
    argv = rest
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", choices=list(FULL), default=list(FULL))
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per round")
    parser.add_argument("--rounds", type=int, default=2, help="dfdl/torch rounds (>= 2)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--small", action="store_true", help="~8x smaller workloads (default)")
    size.add_argument("--full", action="store_true", help="the issue's full-size workloads")
    parser.add_argument("--json", default=None, help="write the results to this file")
    parser.add_argument("--scheduler", default=None, help="address of an existing cluster")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes of the embedded cluster, one thread each (default: one process"
        " with a thread per core)",
    )
    parser.add_argument(
        "--no-start", action="store_true", help="skip the cold/warm start measurements"
    )
    parser.add_argument("--first-step", default=None, help=argparse.SUPPRESS)  # internal
    args = parser.parse_args(argv)
    if args.first_step:
        print(json.dumps(first_step(args.first_step, args.full)))
        return []
    if args.steps < 1 or args.warmup < 0 or args.rounds < 2 or args.steps + args.warmup < 2:
        parser.error("need --steps >= 1, --warmup >= 0, --steps + --warmup >= 2, --rounds >= 2")
    import torch
    from distributed import Client

    torch.set_num_threads(os.cpu_count())
    configs = FULL if args.full else SMALL
    machine = _machine()  # before the cluster starts: load average of other jobs
    machine.update(os_cpu_count=os.cpu_count(), torch_threads=torch.get_num_threads())
    machine["matmul_gflops"] = mm = matmul_gflops()
    machine["openblas"] = blas = openblas_kernels()
    print(f"numpy float32 4096^2 matmul: {mm:.1f} GFLOP/s ({blas})", file=sys.stderr, flush=True)
    # in a fresh process: this one runs PyTorch, where dfdl's products stay on numpy
    here = os.path.dirname(os.path.abspath(__file__))
    code = f"import sys; sys.path.insert(0, {here!r}); import run; print(run.dfdl_matmul_gflops())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    machine["dfdl_matmul_gflops"] = dmm = float(out.stdout.split()[-1])
    records = []
    if args.scheduler:
        cluster, client = None, Client(args.scheduler)
    else:
        cluster = local_cluster(args.workers)
        client = Client(cluster)
    try:
        machine["dfdl_workers"] = len(client.scheduler_info()["workers"])
        machine["dfdl_blas"] = "/".join(sorted(set(client.run(dfdl_blas.backend).values())))
        print(f"dfdl's matmul ({machine['dfdl_blas']}): {dmm:.1f} GFLOP/s", file=sys.stderr)
        width = total_threads(client)
        dask_floor.level_latency(client, width, 20, 1)  # warm-up
        machine["level_latency_s"] = level = dask_floor.level_latency(client, width)
        print(f"Dask: {level * 1e3:.2f} ms per level of {width} no-op tasks", file=sys.stderr)
        for name in args.workload:
            records.append(
                bench_workload(
                    name, configs[name], args.steps, args.warmup, args.rounds, client, level
                )
            )
            if not args.no_start:
                records[-1]["start"] = start_costs(name, args.full)
            print(f"done {name}", file=sys.stderr, flush=True)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    machine["loadavg_end"] = os.getloadavg()
    print(_table(records, mm, dmm))
    start, end = machine["loadavg_start"][0], machine["loadavg_end"][0]
    print(
        f"{'full' if args.full else 'small'} workloads; steps={args.steps} warmup={args.warmup}"
        f" rounds={args.rounds}; {default_workers()} cores; matmul {mm:.1f} GFLOP/s"
        f" (OpenBLAS {machine['openblas']});"
        f" 1-min load average {start:.1f} at start, {end:.1f} at end"
    )
    print("%mm: achieved GFLOP/s (3x forward Gemm/MatMul/Conv FLOPs) / numpy matmul GFLOP/s")
    print(
        f"%blas: dfdl's achieved GFLOP/s / its own BLAS ({machine['dfdl_blas']}) at 4096,"
        f" one product per core at once: {dmm:.1f} GFLOP/s"
    )
    print("outside: share of dfdl's thread time per step not spent executing tasks (gang members")
    print("  on helper threads counted as tasks)")
    print("cold+s / warm+s: first one-step train of a fresh process minus the second, seconds")
    print(
        f"chain: tasks on a step's longest dependency chain; bound: kernels' thread-seconds"
        f" per step / threads + chain x {machine['level_latency_s'] * 1e3:.2f} ms (a level"
        f" of {width} no-op tasks here), the shortest step Dask's round trips allow;"
        f" bnd/torch: torch's step / bound"
    )
    for r in records:
        shares = r["backends"]["dfdl"].get("threads_busy_shares")
        if shares:
            shown = ", ".join(f"{k} busy {100 * v:.1f}%" for k, v in enumerate(shares))
            print(f"{r['workload']}: share of the median round's steps with threads {shown}")
    for r in records:
        if c := r.get("cpu"):
            roles = ", ".join(f"{k} {v:.3f}" for k, v in c["per_step_s"].items())
            print(
                f"{r['workload']}: CPU s per step by role: {roles}; idle"
                f" {100 * c['idle_share']:.0f}%; cpu-bound {c['bound_s']:.3f}"
                f" s/step (torch's step / that: {c['bound_over_torch_samples_per_s']:.3f})"
            )
    for r in records:
        d = r["backends"]["dfdl"]
        calls = d["train_call_seconds_long_short"][0][0]
        top = list(d["by_op_first_long_call"].items())[:8]
        shown = ", ".join(f"{k} {v['seconds']:.1f}s/{v['tasks']}" for k, v in top)
        print(f"{r['workload']}: task thread-seconds in one {calls:.0f} s train call: {shown}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "args": vars(args), "results": records}, f, indent=2)
    return records


if __name__ == "__main__":
    main()
