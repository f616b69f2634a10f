"""The task graph dfdl submits for one training step on N worker processes, and what
each of its tasks costs: the input of ``bench/scale_sim.py``'s simulation.

:func:`step_plan` plans a step as ``dfdl.train`` does for ``N`` worker processes of one
thread (:class:`dfdl.plan.compile.Workers`); :func:`step_graph` lowers it and runs the
engine's optimizer on it with ``nthreads=lambda: [1] * N`` (no cluster needed), leaving
the task bodies unpacked and the step's inputs as keys of their own so that every
member of a per-worker task and every value a task reads can be seen;
:class:`TaskCosts` gives each tile task its FLOPs, bytes read and written and output
bytes, from the plan's static shapes (:func:`dfdl.ops.registry.node_cost` of its node,
times the tile's share of the node).

Also here: :func:`resnet50`, a ResNet-50 (bottleneck blocks 3-4-6-3, 25.6 M weights
and BatchNorm statistics) written with the model zoo's ONNX builder.

Example:
    >>> sp = step_plan("mlp", dict(sizes=(8, 4, 2)), batch=4, n=2)  # doctest: +SKIP
    >>> dsk, carried = step_graph(sp, n=2)  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

import numpy as np
import onnx
from dask.task_spec import DataNode, Task, TaskRef

import dfdl
from dfdl.ir.onnx_io import to_ir
from dfdl.models import ZOO
from dfdl.models._build import Builder, float_input
from dfdl.ops import lookup
from dfdl.ops.registry import TensorType, node_cost
from dfdl.plan.compile import StepPlan, Workers, compile_step
from dfdl.plan.tiling import REDUCE_FAN_IN
from dfdl.taskgraph.fuse import run_fused
from dfdl.taskgraph.lower import lower, task_name
from dfdl.taskgraph.optimize import GraphOptions, optimize
from dfdl.taskgraph.step_tasks import run_exchange, run_local, run_serial

#: the run token of every simulated graph's keys
TOKEN = "sim0"
#: optimizers as bench/run.py names them
OPTIMIZERS = {"sgd": dfdl.optim.SGD, "adam": dfdl.optim.Adam, "adamw": dfdl.optim.AdamW}


def resnet50(image_size: int = 224, num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """ResNet-50: 7x7/2 stem, 2x2/2 max pool, bottleneck stages of 3, 4, 6, 3 blocks
    (widths 64, 128, 256, 512, expansion 4), global average pool, a dense classifier.
    The only difference from torchvision's is the stem pool (2x2 stride 2, not 3x3 with
    padding), which gives the same 56x56 map at 224 px.

    Example:
        >>> m = resnet50(image_size=32, num_classes=10)
        >>> sum(int(np.prod(t.dims)) for t in m.graph.initializer) > 23_000_000
        True
    """
    b = Builder("resnet50", seed, 21)
    y = b.conv("x", "stem.conv", 3, 64, [7, 7], stride=2, pad=3)
    y = b.op("Relu", [b.batch_norm(y, "stem.bn", 64)], "stem.relu")
    y = b.op("MaxPool", [y], "stem.pool", kernel_shape=[2, 2], strides=[2, 2])
    c_in = 64
    for s, (width, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
        for k in range(blocks):
            stride = 2 if (s > 0 and k == 0) else 1
            y = _bottleneck(b, y, f"layer{s + 1}.{k}", c_in, width, stride)
            c_in = width * 4
    y = b.op("GlobalAveragePool", [y], "pool")
    y = b.op("Flatten", [y], "flatten", axis=1)
    y = b.rename(b.gemm(y, "fc", c_in, num_classes), "logits")
    return b.model(
        [float_input("x", ["batch", 3, image_size, image_size])],
        [float_input("logits", ["batch", num_classes])],
    )


def _bottleneck(b: Builder, x: str, prefix: str, c_in: int, width: int, stride: int) -> str:
    c_out = width * 4
    y = b.conv(x, f"{prefix}.conv1", c_in, width, [1, 1])
    y = b.op("Relu", [b.batch_norm(y, f"{prefix}.bn1", width)], f"{prefix}.relu1")
    y = b.conv(y, f"{prefix}.conv2", width, width, [3, 3], stride=stride, pad=1)
    y = b.op("Relu", [b.batch_norm(y, f"{prefix}.bn2", width)], f"{prefix}.relu2")
    y = b.batch_norm(b.conv(y, f"{prefix}.conv3", width, c_out, [1, 1]), f"{prefix}.bn3", c_out)
    shortcut = x
    if stride != 1 or c_in != c_out:
        shortcut = b.conv(x, f"{prefix}.down.conv", c_in, c_out, [1, 1], stride=stride)
        shortcut = b.batch_norm(shortcut, f"{prefix}.down.bn", c_out)
    return b.op("Relu", [b.op("Add", [y, shortcut], f"{prefix}.add")], f"{prefix}.relu3")


def model_of(name: str, kw: dict) -> onnx.ModelProto:
    """The zoo's model ``name`` (or ``"resnet50"``) built with ``kw``.

    Example:
        >>> model_of("mlp", dict(sizes=(8, 4, 2))).graph.name
        'mlp'
    """
    return resnet50(**kw) if name == "resnet50" else ZOO[name](**kw)


def step_plan(
    name: str,
    kw: dict,
    batch: int,
    n: int,
    optimizer: tuple[str, dict] = ("sgd", {"lr": 0.01, "momentum": 0.9}),
    dims: dict | None = None,
    tiles: dict | None = None,
) -> StepPlan:
    """The step plan ``dfdl.train`` makes for ``batch`` samples of workload ``name`` on
    ``n`` worker processes of one thread each (no memory limit; ``tiles`` as
    :func:`dfdl.plan.compile.compile_step` takes them, None: automatic).

    Example:
        >>> sp = step_plan("mlp", dict(sizes=(8, 4, 2)), batch=4, n=2, tiles={"batch": 2})
        >>> sp.plan.chunks["x"][0]
        (2, 2)
    """
    from dfdl.api import _input_types

    graph = to_ir(model_of(name, kw))
    types = _input_types(graph, batch, dims)
    (x,) = types
    if name == "unet3d":
        labels = TensorType((batch, *types[x].shape[2:]), np.int64)
    else:
        labels = TensorType((batch,), np.int64)
    kind, okw = optimizer
    return compile_step(
        graph,
        types,
        loss="cross_entropy",
        optimizer=OPTIMIZERS[kind](**okw),
        labels=labels,
        tiles=tiles,
        workers=Workers(cores=n, processes=n, threads=1),
    )


def sources(sp: StepPlan, token: str = TOKEN, step: int = 0, arrays: bool = False):
    """Every input of the step as tiles: ``(dsk, sources)`` where ``dsk`` holds one
    :class:`~dask.task_spec.DataNode` per tile, keyed ``(f"{name}-src-{token}", step,
    *idx)``, and ``sources`` maps each input to TaskRefs to them (for
    :func:`dfdl.taskgraph.lower.lower`). With ``arrays``, the tiles hold zeros (the
    constants their values) and the graph can run; else None, to build big graphs.

    Example:
        >>> sp = step_plan("mlp", dict(sizes=(8, 4, 2)), batch=4, n=1)
        >>> dsk, src = sources(sp)
        >>> sorted(src["x"])
        [(0, 0)]
    """
    from dfdl.taskgraph.lower import split_tiles

    graph = sp.plan.graph
    made = {o for n in graph.nodes for o in n.outputs}
    dsk: dict = {}
    out: dict = {}
    for name, chunks in sp.plan.chunks.items():
        if name in made:
            continue
        if arrays:
            full = (
                np.asarray(graph.initializers[name])
                if name in graph.initializers
                else np.zeros(graph.types[name].shape, graph.types[name].dtype)
            )
            tiles = split_tiles(full, chunks)
        else:
            tiles = {idx: None for idx in _indices(chunks)}
        out[name] = {}
        for idx, value in tiles.items():
            key = (task_name(f"{name}-src", token), step, *idx)
            dsk[key] = DataNode(key, value)
            out[name][idx] = TaskRef(key)
    return dsk, out


def _indices(chunks: tuple) -> Iterator[tuple[int, ...]]:
    import itertools

    return itertools.product(*(range(len(c)) for c in chunks))


def addresses(n: int) -> list[str]:
    """Made-up addresses of ``n`` workers (the optimizer needs them only as names).

    Example:
        >>> addresses(2)
        ['tcp://w0:1', 'tcp://w1:1']
    """
    return [f"tcp://w{i}:1" for i in range(n)]


def step_graph(
    sp: StepPlan,
    n: int,
    token: str = TOKEN,
    arrays: bool = False,
    direct: bool = False,
    threads: int = 1,
) -> tuple[dict, dict]:
    """The optimized graph of one step (step 0) for ``n`` worker processes of ``threads``
    threads, as :func:`dfdl.runtime.trainer.run_steps` builds it, with the task bodies
    unpacked and the step's inputs left as keys of their own (``GraphOptions(pack=False,
    inline_data=False)``: the trainer inlines them, which moves no byte differently).
    ``direct``: the workers' addresses are known (:func:`addresses`), so on several
    workers each worker's share of the step is one task that exchanges values with the
    others directly (``run_exchange``, the engine's default on a cluster); else one task
    per worker and stage (the first design, ``GraphOptions(exchange=False)``).

    Returns:
        ``(dsk, carried)``: the graph, and for each carried input tile's key (a weight,
        an optimizer state) the key of the task that computes its next value.

    Example:
        >>> kw = dict(in_channels=2, image_size=8, stem=4, stages=(4, 8), blocks_per_stage=1)
        >>> sp = step_plan("resnet", kw, batch=8, n=2, tiles={"batch": 2, "model": 1})
        >>> dsk, carried = step_graph(sp, 2)
        >>> sorted({k[2] for k in dsk if k[0] == f"train-step-{TOKEN}"})
        [0, 1]
    """
    dsk, src = sources(sp, token, arrays=arrays)
    tasks, outs = lower(sp.plan, src, step=0, attrs=sp.tg.seeds(0, 0), token=token)
    dsk.update(tasks)
    carried = {}
    for name in sp.tg.carried():
        for idx, (key, _) in outs[sp.tg.new[name]].items():
            carried[(task_name(f"{name}-src", token), 0, *idx)] = key
    keep = sorted(set(carried.values()) | {key for key, _ in outs[sp.tg.loss].values()}, key=str)
    options = GraphOptions(pack=False, inline_data=False)
    if direct:
        roster = dict.fromkeys(addresses(n), threads)
        nthreads = lambda: roster  # noqa: E731
    else:
        nthreads = lambda: [threads] * n  # noqa: E731
    dsk = optimize(dsk, keep, [sp], token=token, nthreads=nthreads, options=options)
    return dsk, carried


def members(node: object) -> Iterator[Task]:
    """The tile tasks a task of an optimized graph runs: its members' members, through
    step tasks and fused tasks, down to the lowered tasks.

    Example:
        >>> list(members(Task("a", abs, 1)))[0].key
        'a'
    """
    if not isinstance(node, Task):
        return
    if node.func in (run_local, run_serial, run_exchange):
        for t in node.args[0]:
            yield from members(t)
    elif node.func is run_fused:
        for t, _ in node.args[0]:
            yield from members(t)
    elif getattr(node.func, "__name__", "") == "_execute_subgraph":  # Task.fuse
        for t in node.args[0].values():
            yield from members(t)
    else:
        yield node


@dataclass(frozen=True)
class Cost:
    """What one tile task computes and moves (from the plan's static shapes).

    Example:
        >>> Cost("Conv", 2e9, 1e6, 5e5).flops
        2000000000.0
    """

    kind: str
    flops: float
    io_bytes: float
    out_bytes: float


class TaskCosts:
    """The :class:`Cost` of each tile task key of a step plan's lowered graph.

    Example:
        >>> sp = step_plan("mlp", dict(sizes=(8, 4, 2)), batch=4, n=1)
        >>> costs = TaskCosts(sp)
        >>> costs(("nothing", 0)).kind
        'other'
    """

    def __init__(self, sp: StepPlan, token: str = TOKEN):
        types = dict(sp.plan.graph.types)
        for k, v in sp.plan.graph.initializers.items():
            types.setdefault(k, TensorType(np.shape(v), np.asarray(v).dtype))
        self.table: dict[str, tuple] = {}
        for np_ in sp.plan.nodes:
            node = np_.node
            base = f"{node.name}-{node.phase}"
            try:
                cost = node_cost(node, types)
            except Exception:  # an op without a cost rule that one-FLOP-per-element fails
                cost = None
            flops = float(cost.flops) if cost else 0.0
            if node.op_type in CONV_GRADS:  # no cost rule: the forward's multiply-adds
                flops = _conv_grad_flops(node, types)
            io = float(cost.bytes) if cost else 0.0
            out = float(sum(types[o].nbytes for o in node.outputs if o and o in types))
            op = lookup(node.op_type, node.domain)
            kind = node.op_type if op is not None and op.contraction else "elementwise"
            entry = (np_, flops, io, out, kind)
            self.table[task_name(base, token)] = (*entry, "tile")
            self.table[task_name(f"{base}-partial", token)] = (*entry, "partial")
            self.table[task_name(f"{base}-sum", token)] = (*entry, "sum")

    def __call__(self, key: Hashable) -> Cost:
        hit = self.table.get(key[0]) if isinstance(key, tuple) and key else None
        if hit is None:
            return Cost("other", 0.0, 0.0, 0.0)
        np_, flops, io, out, kind, role = hit
        idx = tuple(i for i in key[2:] if isinstance(i, int))
        grid = np_.grid_letters()
        share = _share_of(np_, grid, idx[: len(grid)])
        combos = math.prod(len(np_.letters[c]) for c in np_.spec.contracted())
        if role == "tile" and combos == 1:
            return Cost(kind, flops * share, io * share, out * share)
        if role == "partial" and len(idx) == len(grid) + 1:
            return Cost(kind, flops * share / combos, io * share / combos, out * share)
        # a sum of partials (at most REDUCE_FAN_IN; where the node's contracted axes are
        # split, its tile task is the last such sum): an elementwise add
        tile_out = out * share
        fan_in = min(combos, REDUCE_FAN_IN)
        return Cost("sum", tile_out / 4 * fan_in, tile_out * (fan_in + 1), tile_out)


#: the convolution gradients, which have no cost rule of their own
CONV_GRADS = ("ConvGradInput", "ConvGradWeight")


def _conv_grad_flops(node, types) -> float:
    """FLOPs of a convolution's input or weight gradient: the forward's, 2 x the output
    gradient's elements x the weight's elements per output channel.

    ``ConvGradInput`` reads ``(dY, W)``; ``ConvGradWeight`` reads ``(X, dY)`` and
    writes ``dW``.
    """
    if node.op_type == "ConvGradInput":
        dy, w = (types[i].shape for i in node.inputs[:2])
    else:
        dy, w = types[node.inputs[1]].shape, types[node.outputs[0]].shape
    return 2.0 * math.prod(dy) * math.prod(w[1:])


def _share_of(np_, grid: list[str], idx: tuple) -> float:
    """The share of a node's output that the tile ``idx`` of its grid holds."""
    share = 1.0
    for c, i in zip(grid, idx):
        chunks = np_.letters[c]
        share *= chunks[i] / sum(chunks) if i < len(chunks) else 1.0 / len(chunks)
    return share
