"""The ``dfdl`` command line: ``train``, ``plan``, ``export-training-graph`` and ``info``.

Every subcommand is one function taking the parsed arguments and returning the exit
status. An error dfdl raises on purpose (:class:`dfdl.errors.DfdlError`), a missing or
unreadable file, and a bad flag are reported as one line, ``dfdl: error: <message>``,
with exit status 2 and no traceback; ``dfdl --debug ...`` shows the traceback instead.

Example:
    .. code-block:: console

        $ dfdl info model.onnx
        $ dfdl train model.onnx --data train.npz --optimizer adamw --lr 1e-3 -o trained.onnx
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

#: exit status of every reported error (argparse's own usage errors use it too)
EXIT_ERROR = 2

#: default learning rate per ``--optimizer`` (SGD: ``dfdl.train``'s default)
DEFAULT_LR = {"sgd": 0.01, "adam": 1e-3, "adamw": 1e-3}
OPTIMIZERS = tuple(DEFAULT_LR)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line: ``dfdl: error: ...``."""

    def error(self, message: str) -> NoReturn:
        """Print ``dfdl: error: <message> (see '<prog> --help')`` and exit with status 2.

        Example:
            >>> Parser(prog="dfdl").error("bad flag")  # doctest: +SKIP
        """
        self.exit(EXIT_ERROR, f"dfdl: error: {message} (see '{self.prog} --help')\n")


# ------------------------------------------------------------------------ flag values


def parse_tiles(text: str) -> dict[str, int] | str | None:
    """``--tiles`` value: ``auto`` (None), ``uneven``, or ``batch=B,model=M,space=S``.

    Example:
        >>> parse_tiles("batch=2,model=1")
        {'batch': 2, 'model': 1}
    """
    if text in ("auto", ""):
        return None
    if text == "uneven":
        return "uneven"
    from dfdl.plan.compile import SPLIT_NORMS
    from dfdl.plan.tiling import TILES_KEYS

    return _key_values(text, "--tiles", (*TILES_KEYS, SPLIT_NORMS))


def parse_dims(text: str) -> dict[str, int]:
    """``--dims`` value: sizes of symbolic dimensions, ``seq=256,height=64``.

    Example:
        >>> parse_dims("seq=256")
        {'seq': 256}
    """
    return _key_values(text, "--dims", None)


def _key_values(text: str, flag: str, keys: tuple[str, ...] | None) -> dict[str, int]:
    out = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name or (keys is not None and name not in keys):
            want = "|".join(keys) if keys else "NAME"
            raise argparse.ArgumentTypeError(
                f"expected {want}=N[,...], got {text!r}"
                + (" (or 'auto' / 'uneven')" if flag == "--tiles" else "")
            )
        try:
            out[name] = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}={value!r} is not an integer") from None
        if out[name] < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1, not {value}")
    return out


def make_optimizer(args: argparse.Namespace):
    """The :mod:`dfdl.optim` optimizer named by ``--optimizer``, ``--lr``, ``--momentum``
    and ``--weight-decay`` (unset values keep the optimizer's defaults).

    Example:
        >>> ns = argparse.Namespace(optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=None)
        >>> type(make_optimizer(ns)).__name__
        'SGD'
    """
    from dfdl import optim
    from dfdl.errors import ConfigError

    name = args.optimizer
    kwargs: dict[str, Any] = {"lr": DEFAULT_LR[name] if args.lr is None else args.lr}
    if args.weight_decay is not None:
        kwargs["weight_decay"] = args.weight_decay
    if args.momentum is not None:
        if name != "sgd":
            raise ConfigError(f"--momentum applies to --optimizer sgd, not {name}")
        kwargs["momentum"] = args.momentum
    return {"sgd": optim.SGD, "adam": optim.Adam, "adamw": optim.AdamW}[name](**kwargs)


# ------------------------------------------------------------------------------ data


@contextlib.contextmanager
def slurm_client(spec: str):
    """A client of SLURM jobs started from ``--slurm`` (cancelled on exit), once every
    job's workers have connected."""
    from distributed import Client

    import dfdl.cluster

    options = dfdl.cluster.parse_slurm(spec)
    with dfdl.cluster.slurm(**options) as cluster, Client(cluster) as client:
        n = options.get("jobs", 1) * options.get("processes", 1)
        print(f"waiting for {n} Dask workers from SLURM jobs (squeue shows them)", flush=True)
        client.wait_for_workers(n)
        yield client


def tls_security(args: argparse.Namespace):
    """A ``Security`` from --tls-ca-file/--tls-cert/--tls-key, or None (dask's config)."""
    given = [args.tls_ca_file, args.tls_cert, args.tls_key]
    if not any(given):
        return None
    from dfdl.errors import ConfigError

    if not (args.tls_ca_file and args.tls_cert):
        raise ConfigError(
            "TLS needs both --tls-ca-file and --tls-cert (and --tls-key unless "
            "the certificate file holds the key)"
        )
    for flag, path in zip(("--tls-ca-file", "--tls-cert", "--tls-key"), given):
        if path and not Path(path).is_file():
            raise ConfigError(f"{flag} {path} does not exist")
    from distributed.security import Security

    return Security(
        tls_ca_file=args.tls_ca_file,
        tls_client_cert=args.tls_cert,
        tls_client_key=args.tls_key,
        require_encryption=True,
    )


def load_data(path: str, labels: str | None) -> tuple[Any, Any]:
    """``(X, y)`` for :func:`dfdl.train` from ``--data`` and ``--labels``.

    A ``.npz`` file holds the samples as ``X`` (or ``x``) and the labels as ``y`` (or
    ``Y``), both with the sample axis first; ``y`` may be absent when the loss is a model
    output. Any other path (a ``.npy`` file or a zarr store) is given to
    :func:`dfdl.train` as is, so the workers read their batches from it, with the
    labels from ``--labels``.

    Raises:
        DataError: the file is missing or unreadable, or lacks the arrays.

    Example:
        >>> X, y = load_data("train.npz", None)  # doctest: +SKIP
    """
    import numpy as np

    from dfdl.errors import DataError

    for p, flag in ((path, "--data"), (labels, "--labels")):
        if p is not None and not Path(p).exists():
            raise DataError(f"{flag}: {p} does not exist")
    if not path.endswith(".npz"):
        return path, labels
    if labels is not None:
        raise DataError(f"--labels is for .npy data; the labels of {path} are its array 'y'")
    try:
        with np.load(path, allow_pickle=False) as z:
            names = set(z.files)
            xkey = next((k for k in ("X", "x") if k in names), None)
            ykey = next((k for k in ("y", "Y") if k in names), None)
            if xkey is None:
                raise DataError(f"{path} has no array 'X' (or 'x'); it holds {sorted(names)}")
            return z[xkey], None if ykey is None else z[ykey]
    except DataError:
        raise
    except Exception as e:  # zipfile, pickle and format errors come as many types
        raise DataError(f"cannot read {path} as a .npz file: {e}") from e


def _check_output(path: str) -> None:
    """Fail before any work when ``-o`` cannot be written (its folder does not exist)."""
    from dfdl.errors import ConfigError

    folder = Path(path).absolute().parent
    if not folder.is_dir():
        raise ConfigError(f"-o {path}: the folder {folder} does not exist")


def _labels_type(graph, input_types: dict, loss: str):
    """Type of one batch of labels for ``loss`` (None when the loss is a model output)."""
    import numpy as np

    from dfdl.ir.bind import bind
    from dfdl.ops.registry import TensorType
    from dfdl.training.losses import validate_loss

    if loss in graph.outputs:
        return None
    validate_loss(loss)
    bound = bind(graph, input_types)
    out = bound.types[bound.outputs[0]]
    if loss in ("cross_entropy", "dice"):  # class indices: the output without axis 1
        return TensorType((out.shape[0], *out.shape[2:]), np.int64)
    return out


# -------------------------------------------------------------------------- commands


def cmd_train(args: argparse.Namespace) -> int:
    """``dfdl train``: train a model on ``--data`` and write the trained ONNX file.

    Example:
        >>> main(["train", "mlp.onnx", "--data", "d.npz", "-o", "out.onnx"])  # doctest: +SKIP
        0
    """

    import dfdl
    from dfdl.data import as_source
    from dfdl.data.order import steps_per_epoch
    from dfdl.errors import ConfigError, DataError
    from dfdl.training.losses import LOSSES

    _check_output(args.output)
    X, y = load_data(args.data, args.labels)
    if y is None and args.loss in LOSSES:
        raise DataError(
            f"--loss {args.loss} needs labels: an array 'y' in the .npz file, or --labels"
        )
    optimizer = make_optimizer(args)
    with contextlib.ExitStack() as stack:
        client = None
        if args.scheduler and args.slurm:
            raise ConfigError("give --scheduler or --slurm, not both")
        if args.scheduler:
            from dfdl.runtime.cluster import open_client

            client = stack.enter_context(open_client(args.scheduler, tls_security(args)))
        elif args.slurm:
            client = stack.enter_context(slurm_client(args.slurm))
        start = time.perf_counter()
        result = dfdl.train(
            args.model,
            X if y is None else (X, y),
            loss=args.loss,
            optimizer=optimizer,
            batch_size=args.batch_size,
            epochs=args.epochs,
            steps=args.steps,
            seed=args.seed,
            client=client,
            tiles=args.tiles,
            checkpoint_dir=args.checkpoint_dir,
            checkpoint_every=args.checkpoint_every,
            resume=args.resume,
            memory=args.memory,
        )
        elapsed = time.perf_counter() - start
    result.save(args.output)
    per_epoch = steps_per_epoch(len(as_source(X, "X")), args.batch_size, False)
    total = args.steps if args.steps is not None else per_epoch * args.epochs
    losses = result.history["loss"]
    print(summarize_losses(losses, first_step=total - len(losses), per_epoch=per_epoch))
    print(f"trained {len(losses)} steps in {elapsed:.1f} s; wrote {args.output}")
    return 0


def summarize_losses(losses: Sequence[float], first_step: int, per_epoch: int) -> str:
    """One line per epoch (mean and last loss of its steps) and a final line.

    Args:
        losses: the loss of each step trained, in order.
        first_step: the global index of ``losses[0]`` (non-zero after ``--resume``).
        per_epoch: steps in one epoch.

    Example:
        >>> print(summarize_losses([1.0, 0.5, 0.25], first_step=0, per_epoch=2))
        epoch 1: steps 1-2, mean loss 0.75, last 0.5
        epoch 2: steps 3-3, mean loss 0.25, last 0.25
        final loss 0.25 (first 1)
    """
    if not losses:
        return "no steps trained (the checkpoint is already at the last step)"
    lines = []
    by_epoch: dict[int, list[tuple[int, float]]] = {}
    for i, v in enumerate(losses):
        step = first_step + i
        by_epoch.setdefault(step // per_epoch, []).append((step, v))
    for epoch, items in by_epoch.items():
        vals = [v for _, v in items]
        lines.append(
            f"epoch {epoch + 1}: steps {items[0][0] + 1}-{items[-1][0] + 1}, "
            f"mean loss {math.fsum(vals) / len(vals):.6g}, last {vals[-1]:.6g}"
        )
    lines.append(f"final loss {losses[-1]:.6g} (first {losses[0]:.6g})")
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace) -> int:
    """``dfdl plan``: print the tiling plan (inference, or with ``--training`` the
    training step) without running anything.

    Example:
        >>> main(["plan", "mlp.onnx", "--batch-size", "64"])  # doctest: +SKIP
        0
    """
    import dask

    import dfdl
    from dfdl.runtime.cluster import default_workers, worker_memory_config

    graph = dfdl.load(args.model)
    types = _input_types(graph, args.batch_size, args.dims)
    cores = args.workers or default_workers()
    with dask.config.set(worker_memory_config()):  # the thresholds of dfdl's clusters
        return _plan_and_show(args, graph, types, cores)


def _plan_and_show(args, graph, types, cores: int) -> int:
    from dfdl.errors import ConfigError
    from dfdl.ir.bind import bind
    from dfdl.plan.compile import plan_training
    from dfdl.plan.tiling import make_plan
    from dfdl.runtime.cluster import parse_memory
    from dfdl.training.graph import build_training_graph

    memory = parse_memory(args.memory_limit, "--memory-limit")
    if args.training:
        tg = build_training_graph(
            graph,
            types,
            loss=args.loss,
            optimizer=make_optimizer(args),
            labels=_labels_type(graph, types, args.loss),
        )
        print(f"training step: forward, loss {args.loss!r}, backward, {args.optimizer} update")
        tg, plan = plan_training(tg, args.tiles, cores=cores, memory_limit=memory)
        if args.recompute:
            segs = tg.segments()
            tg, plan = plan_training(tg.recompute(segs), plan.tiles, memory_limit=memory)
            rebuilt = len(tg.recomputed)
            print(f"recompute: {len(segs)} segment(s), {rebuilt} forward node(s) run again")
    elif args.recompute:
        raise ConfigError("--recompute needs --training")
    else:  # as dfdl.plan does
        plan = make_plan(bind(graph, types), args.tiles, cores=cores, memory_limit=memory)
    # --workers N: N one-thread processes; else the embedded cluster's one process
    layout = (args.workers, 1) if args.workers else (1, cores)
    print(plan.summary(workers=layout[0], threads_per_worker=layout[1]))
    return 0


def _input_types(graph, batch_size: int | None, dims: dict[str, int] | None) -> dict:
    """Input types as :func:`dfdl.plan` binds them, asking for the flag that is missing."""
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


def cmd_export(args: argparse.Namespace) -> int:
    """``dfdl export-training-graph``: write the training step as an ONNX file.

    Example:
        >>> main(["export-training-graph", "mlp.onnx", "-o", "t.onnx"])  # doctest: +SKIP
        0
    """
    import onnx

    import dfdl
    from dfdl.ir.onnx_io import load_model, to_ir
    from dfdl.ops.registry import TensorType

    _check_output(args.output)
    proto = load_model(args.model)
    graph = to_ir(proto)
    name = graph.inputs[0] if graph.inputs else ""
    declared, dtype = graph.declared.get(name, (None, None))
    labels = None
    if declared is not None:  # dfdl.training_graph sets every symbolic axis to the batch size
        shape = tuple(d if isinstance(d, int) else args.batch_size for d in declared)
        labels = _labels_type(graph, {name: TensorType(shape, dtype)}, args.loss)
    kwargs = {} if labels is None else {"labels_shape": labels.shape, "labels_dtype": labels.dtype}
    m = dfdl.training_graph(
        proto, args.loss, make_optimizer(args), batch_size=args.batch_size, **kwargs
    )
    onnx.save(m, args.output)
    print(
        f"wrote {args.output}: {len(m.graph.node)} nodes, {len(m.graph.input)} inputs, "
        f"{len(m.graph.output)} outputs"
    )
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """``dfdl info``: print a model's inputs, outputs, ops (supported or not) and size.

    Example:
        >>> main(["info", "mlp.onnx"])  # doctest: +SKIP
        0
    """
    from dfdl.ir.onnx_io import load_model

    print(describe_model(load_model(args.model), title=args.model))
    return 0


def describe_model(model, title: str = "model") -> str:
    """The text ``dfdl info`` prints for a checked ``onnx.ModelProto``.

    Example:
        >>> import dfdl.models
        >>> print(describe_model(dfdl.models.mlp((4, 3))).splitlines()[-1])
        every op is supported
    """
    from collections import Counter

    from dfdl.ir.onnx_io import MAX_OPSET, MIN_OPSET
    from dfdl.ops import lookup
    from dfdl.ops.registry import ONNX_DOMAINS
    from dfdl.plan.estimate import format_bytes

    g = model.graph
    inits = {t.name for t in g.initializer}
    lines = [f"{title}: producer {model.producer_name or '?'}, ir_version {model.ir_version}"]
    for o in model.opset_import:
        domain = o.domain or "ai.onnx"
        note = ""
        if o.domain in ONNX_DOMAINS and not MIN_OPSET <= o.version <= MAX_OPSET:
            note = f"  (unsupported: dfdl reads opsets {MIN_OPSET} to {MAX_OPSET})"
        lines.append(f"opset: {domain} {o.version}{note}")
    lines.append("inputs:")
    lines += [f"  {_value_line(vi)}" for vi in g.input if vi.name not in inits]
    lines.append("outputs:")
    lines += [f"  {_value_line(vi)}" for vi in g.output]
    ops = Counter((n.domain if n.domain not in ONNX_DOMAINS else "", n.op_type) for n in g.node)
    lines.append(f"nodes: {len(g.node)}")
    unsupported = []
    width = max((len(_op_name(d, t)) for d, t in ops), default=0)
    for (domain, op_type), count in sorted(ops.items()):
        op = lookup(op_type, domain)
        mark = "supported" if op is not None else "NOT SUPPORTED"
        if op is not None and op.fold_only:
            mark = "supported (constant path, folded at plan time)"
        if op is None:
            unsupported.append(_op_name(domain, op_type))
        lines.append(f"  {_op_name(domain, op_type):{width}s} {count:6d}  {mark}")
    count, nbytes = _parameter_size(g.initializer)
    lines.append(
        f"parameters: {count:,} values in {len(g.initializer)} initializers, {format_bytes(nbytes)}"
    )
    if unsupported:
        lines.append(f"unsupported ops: {', '.join(unsupported)}")
    else:
        lines.append("every op is supported")
    return "\n".join(lines)


def _op_name(domain: str, op_type: str) -> str:
    return f"{domain}.{op_type}" if domain else op_type


def _value_line(vi) -> str:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        return f"{vi.name}  (not a tensor)"
    dtype = _dtype_name(tt.elem_type)
    if not tt.HasField("shape"):
        return f"{vi.name}  {dtype}  (shape unknown)"
    dims = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in tt.shape.dim]
    return f"{vi.name}  {dtype}  [{', '.join(map(str, dims))}]"


def _dtype_name(elem_type: int) -> str:
    """numpy's name of an ONNX element type (``float32``), else ONNX's (``bfloat16``)."""
    import onnx
    from onnx import helper

    if not elem_type:
        return "?"
    try:
        return str(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def _parameter_size(initializers) -> tuple[int, int]:
    """Total element count and bytes of the initializers."""
    from onnx import helper

    count = nbytes = 0
    for t in initializers:
        n = math.prod(t.dims)
        count += n
        try:
            nbytes += n * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        except Exception:  # types numpy lacks (4-bit, strings): the stored size
            nbytes += len(t.raw_data)
    return count, nbytes


# ---------------------------------------------------------------------------- parser


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)


def _add_training_args(p: argparse.ArgumentParser, batch_default: int | None) -> None:
    p.add_argument(
        "--loss",
        default="cross_entropy",
        help="cross_entropy (default), mse, bce_with_logits, dice, or the name of a model "
        "output that already is the loss",
    )
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd", help=_OPTIMIZER_HELP)
    p.add_argument(
        "--lr", type=float, metavar="F", help="learning rate (default: 0.01 SGD, 1e-3 Adam/AdamW)"
    )
    p.add_argument("--momentum", type=float, metavar="F", help="SGD momentum (default 0)")
    p.add_argument(
        "--weight-decay",
        type=float,
        metavar="F",
        help="weight decay (default: 0; AdamW: 0.01, decoupled)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=batch_default,
        required=batch_default is None,
        metavar="N",
        help="samples per step" + (f" (default {batch_default})" if batch_default else ""),
    )


_DEBUG_HELP = "show the full traceback of an error"
_TILES_HELP = (
    "tiling: auto (default), uneven, or batch=B,model=M,space=S[,min_weight_tile=BYTES]"
    "[,split_norms=1]"
)
_OPTIMIZER_HELP = "torch-equivalent optimizer (default sgd)"


def build_parser() -> Parser:
    """The ``dfdl`` argument parser with its four subcommands.

    Example:
        >>> build_parser().parse_args(["info", "m.onnx"]).command
        'info'
    """
    from dfdl import __version__

    parser = Parser(
        prog="dfdl",
        description="Train and inspect ONNX models as tiled Dask task graphs.",
        epilog="Run 'dfdl COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"dfdl {__version__}")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "train",
        help="train a model and write the trained ONNX file",
        description="Train MODEL on DATA on a Dask cluster (an embedded local one unless "
        "--scheduler is given) and write the trained model as ONNX. DATA is a .npz file "
        "with arrays X (samples, sample axis first) and y (labels), also accepted as x/Y; "
        "or a .npy file (or zarr store) with --labels, read by the workers batch by batch.",
    )
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("--data", required=True, metavar="DATA", help=".npz (X, y) or .npy file")
    p.add_argument("--labels", metavar="LABELS", help="labels .npy file for .npy DATA")
    _add_training_args(p, batch_default=64)
    p.add_argument(
        "--epochs", type=int, default=1, metavar="N", help="passes over the data (default 1)"
    )
    p.add_argument("--steps", type=int, metavar="N", help="stop after this many steps")
    p.add_argument(
        "--seed", type=int, default=0, metavar="N", help="seed of the data order and Dropout"
    )
    p.add_argument("--scheduler", metavar="ADDRESS", help="a running Dask scheduler to use")
    p.add_argument(
        "--slurm",
        metavar="SPEC",
        help="train on SLURM jobs started for this run (dask-jobqueue), e.g. "
        "jobs=4,cores=16,memory=64GiB,walltime=02:00:00; also processes, partition, "
        "account, gpus, local_directory, interface",
    )
    p.add_argument("--tls-ca-file", metavar="PEM", help="CA of a tls:// scheduler's cluster")
    p.add_argument("--tls-cert", metavar="PEM", help="client certificate for a tls:// scheduler")
    p.add_argument("--tls-key", metavar="PEM", help="client private key (if not in --tls-cert)")
    p.add_argument("--checkpoint-dir", metavar="DIR", help="where checkpoints go")
    p.add_argument("--checkpoint-every", type=int, metavar="N", help="steps between checkpoints")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--tiles", type=parse_tiles, metavar="SPEC", help=_TILES_HELP)
    p.add_argument(
        "--memory",
        choices=("spill", "recompute", "auto"),
        default="auto",
        help="keep the activations the backward pass reads (spilling them to disk beyond "
        "the workers' memory), recompute them from checkpoints, or choose per segment "
        "(default auto: recompute only what the plan would spill and is faster to "
        "recompute)",
    )
    p.add_argument("-o", "--output", required=True, metavar="OUT.onnx", help="trained model")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "plan",
        help="print how a model would be tiled (nothing runs)",
        description="Print the tiling plan of MODEL: each tensor's tiles, the task count "
        "and the largest task. With --training, plan the training step (forward, loss, "
        "backward, optimizer update) instead of inference.",
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
        "--workers", type=int, metavar="N", help="worker threads to plan for (default: cores)"
    )
    p.add_argument("--tiles", type=parse_tiles, metavar="SPEC", help=_TILES_HELP)
    p.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help="each worker's memory limit, e.g. 2GiB: every task must fit a quarter of it",
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

    p = sub.add_parser(
        "export-training-graph",
        help="write the training step as an ONNX file",
        description="Write the training step of MODEL (forward, loss, backward, optimizer "
        "update; backward ops in the 'dfdl' domain) as an ONNX model, e.g. for Netron.",
    )
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("-o", "--output", required=True, metavar="OUT.onnx")
    _add_training_args(p, batch_default=1)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "info",
        help="print a model's inputs, outputs, ops (supported or not) and parameters",
        description="Print MODEL's inputs and outputs with shapes, its opsets, node count, "
        "a histogram of its ops marked supported or not by dfdl, and its parameter size.",
    )
    p.add_argument("model", metavar="MODEL.onnx")
    p.set_defaults(func=cmd_info)

    for p in sub.choices.values():
        _add_common(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``dfdl`` command line; returns the exit status.

    Example:
        >>> main(["info", "model.onnx"])  # doctest: +SKIP
        0
    """
    args = build_parser().parse_args(argv)
    from dfdl.errors import DfdlError

    try:
        return args.func(args)
    except (DfdlError, OSError) as e:
        if args.debug:
            raise
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"dfdl: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("dfdl: interrupted", file=sys.stderr)
        return 130
