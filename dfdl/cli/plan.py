"""``dfdl plan``: print how a model's inference or training step would be tiled, and the
memory it would take, without running anything.

The training step is planned by :mod:`dfdl.plan.compile`, as :func:`dfdl.train` plans
it: the training graph, its tiling (:func:`~dfdl.plan.compile.training_plan`) and its
variant (:func:`~dfdl.plan.compile.choose_variant`: activations spilled, or recomputed
with ``--recompute``), for a :class:`~dfdl.plan.compile.Workers` description of the
cluster.

Example:
    .. code-block:: console

        $ dfdl plan model.onnx --batch-size 64 --training --memory-limit 4GiB
        $ dfdl plan model.onnx --batch-size 64 --workers 8 --tensors
"""

from __future__ import annotations

import argparse

from dfdl.cli.common import (
    OPTIMIZERS,
    TILES_HELP,
    labels_type,
    make_optimizer,
    parse_dims,
    parse_tiles,
)


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``plan`` to the ``dfdl`` subcommands (``sub``: ``add_subparsers()``'s result).

    Example:
        >>> add_parser(Parser(prog="dfdl").add_subparsers())  # doctest: +SKIP
    """
    p = sub.add_parser(
        "plan",
        help="print how a model would be tiled (nothing runs)",
        description="Print the tiling plan of MODEL: the task count, the tiling, the "
        "largest task and the memory estimate. With --training, plan the training step "
        "(forward, loss, backward, optimizer update) as dfdl train does, instead of "
        "inference. Each tensor's shape and tiles are listed only with --tensors, above "
        "the summary, which always comes last.",
    )
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("--batch-size", type=int, metavar="N", help="size of the symbolic batch axis")
    p.add_argument(
        "--dims",
        type=parse_dims,
        metavar="NAME=N,...",
        help="other symbolic dimensions: NAME=N,...",
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="plan for N worker processes of one thread each, as dfdl.LocalCluster(N) "
        "starts them (default: the embedded cluster dfdl train starts, one worker "
        "process with a thread per core)",
    )
    p.add_argument("--tiles", type=parse_tiles, metavar="SPEC", help=TILES_HELP)
    p.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help="each worker's memory limit, e.g. 2GiB: every task must fit a quarter of it "
        "(default: no limit)",
    )
    p.add_argument(
        "--tensors",
        action="store_true",
        help="also list each tensor's shape, dtype and tiles (a training step has "
        "hundreds), above the summary",
    )
    p.add_argument("--training", action="store_true", help="plan the training step")
    p.add_argument(
        "--loss", default="cross_entropy", help="loss of the training step (with --training)"
    )
    p.add_argument(
        "--recompute",
        action="store_true",
        help="with --training: recompute activations in the backward pass (as dfdl train "
        "--memory recompute) and estimate memory for that",
    )
    p.add_argument(
        "--optimizer", choices=OPTIMIZERS, default="sgd", help="optimizer (with --training)"
    )
    p.set_defaults(func=cmd_plan, lr=None, momentum=None, weight_decay=None)
    return p


def cmd_plan(args: argparse.Namespace) -> int:
    """``dfdl plan``: print the tiling plan (inference, or with ``--training`` the
    training step) without running anything.

    Example:
        >>> main(["plan", "mlp.onnx", "--batch-size", "64"])  # doctest: +SKIP
        0
    """
    import dfdl
    from dfdl.errors import ConfigError
    from dfdl.ir.bind import bind
    from dfdl.plan.scoped_config import scoped_config
    from dfdl.plan.tiling import make_plan
    from dfdl.runtime.cluster import parse_memory

    graph = dfdl.load(args.model)
    types = input_types(graph, args.batch_size, args.dims)
    workers = plan_workers(args.workers, parse_memory(args.memory_limit, "--memory-limit"))
    lines = []
    with scoped_config(workers.thresholds):  # the thresholds of dfdl's clusters
        if args.training:
            lines, plan = _training_plan(args, graph, types, workers)
        elif args.recompute:
            raise ConfigError("--recompute needs --training")
        else:  # as dfdl.plan does
            plan = make_plan(
                bind(graph, types),
                args.tiles,
                cores=workers.cores,
                memory_limit=workers.memory_limit,
            )
        lines.append(plan.summary(workers.processes, workers.threads, tensors=False))
    lines.append(describe_workers(workers, args.workers is not None))
    if args.tensors:
        print(plan.tensor_table(), end="\n\n")
    else:
        lines.append(f"{len(plan.chunks)} tensors: --tensors lists each one's shape and tiles")
    print("\n".join(lines))
    return 0


def _training_plan(args, graph, types, workers):
    """``(lines, plan)``: the training step planned as :func:`dfdl.train` plans it, and
    the lines that say what the step is."""
    from dfdl.plan.compile import choose_variant, training_plan
    from dfdl.training.graph import build_training_graph

    tg = build_training_graph(
        graph,
        types,
        loss=args.loss,
        optimizer=make_optimizer(args),
        labels=labels_type(graph, types, args.loss),
    )
    lines = [f"training step: forward, loss {args.loss!r}, backward, {args.optimizer} update"]
    spilling = training_plan(tg, args.tiles, workers)
    sp = choose_variant(spilling, "recompute" if args.recompute else "spill", workers)
    if args.recompute:
        segments = len(spilling.tg.segments())
        lines.append(
            f"recompute: {segments} segment(s), {len(sp.tg.recomputed)} forward node(s) run again"
        )
    return lines, sp.plan


def plan_workers(processes: int | None, memory_limit: int | None):
    """The :class:`~dfdl.plan.compile.Workers` ``dfdl plan`` plans for: ``processes``
    one-thread worker processes (``--workers N``, as ``dfdl.LocalCluster(N)``), else the
    embedded cluster of ``dfdl train`` (one process with a thread per core), each with
    ``memory_limit`` and the memory thresholds of dfdl's clusters.

    Example:
        >>> plan_workers(4, None).cores, plan_workers(4, None).threads
        (4, 1)
    """
    from dfdl.errors import ConfigError
    from dfdl.plan.compile import Workers
    from dfdl.runtime.cluster import default_workers, worker_memory_config

    if processes is not None and processes < 1:
        raise ConfigError(f"--workers must be at least 1, not {processes}")
    config = worker_memory_config()
    if processes is not None:
        return Workers(processes, processes, 1, memory_limit=memory_limit, thresholds=config)
    cores = default_workers()
    return Workers(cores, 1, cores, memory_limit=memory_limit, thresholds=config)


def describe_workers(workers, given: bool) -> str:
    """The line that says which workers a plan is for.

    Example:
        >>> from dfdl.plan.compile import Workers
        >>> describe_workers(Workers(4, 4, 1), given=True)
        'workers: 4 process(es) with 1 thread each (--workers)'
    """
    if given:
        return f"workers: {workers.processes} process(es) with 1 thread each (--workers)"
    return (
        f"workers: 1 process with {workers.threads} thread(s), one per core, as dfdl "
        "train's embedded cluster"
    )


def input_types(graph, batch_size: int | None, dims: dict[str, int] | None) -> dict:
    """Input types as :func:`dfdl.plan` binds them, asking for the flag that is missing.

    Raises:
        ConfigError: an input axis is symbolic and neither flag sizes it.

    Example:
        >>> input_types(graph, 64, {"seq": 128})  # doctest: +SKIP
        {'x': TensorType(shape=(64, 128, 512), dtype=dtype('float32'))}
    """
    from dfdl import api
    from dfdl.errors import ConfigError

    dims = dims or {}
    for name in graph.inputs:
        declared = graph.declared[name][0] or ()
        for axis, d in enumerate(declared):
            if isinstance(d, int) or d in dims or (axis == 0 and batch_size is not None):
                continue
            flag = "--batch-size N" if axis == 0 else f"--dims {d}=N"
            raise ConfigError(f"input {name!r}: axis {axis} ({d!r}) is symbolic; give {flag}")
    return api._input_types(graph, batch_size, dims)
