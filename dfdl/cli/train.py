"""``dfdl train``: train a model on a data file and write the trained ONNX file.

Example:
    .. code-block:: console

        $ dfdl train model.onnx --data train.npz --optimizer adamw --lr 1e-3 -o trained.onnx
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from dfdl.cli.common import (
    TILES_HELP,
    add_training_args,
    load_data,
    make_optimizer,
    parse_tiles,
    positive_int,
    written_beside,
)


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``train`` to the ``dfdl`` subcommands (``sub``: ``add_subparsers()``'s result).

    Example:
        >>> add_parser(Parser(prog="dfdl").add_subparsers())  # doctest: +SKIP
    """
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
    add_training_args(p, batch_default=64)
    p.add_argument(
        "--epochs", type=int, default=1, metavar="N", help="passes over the data (default 1)"
    )
    p.add_argument("--steps", type=int, metavar="N", help="stop after this many steps")
    p.add_argument(
        "--seed", type=int, default=0, metavar="N", help="seed of the data order and Dropout"
    )
    p.add_argument("--scheduler", metavar="ADDRESS", help="a running Dask scheduler to use")
    p.add_argument(
        "--gpus",
        type=int,
        metavar="N",
        help="train on N of this machine's NVIDIA GPUs: a local cluster of one worker per "
        "GPU (needs cupy; with --slurm, ask for GPUs in its spec: gpus=N)",
    )
    p.add_argument(
        "--device-memory-limit",
        metavar="BYTES",
        help="with --gpus: the device memory each GPU worker's tiles may hold (e.g. 2GiB); "
        "past it tiles spill to the host and to disk, and the plan is made for it",
    )
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
    p.add_argument(
        "--checkpoint-every",
        type=positive_int,
        metavar="N",
        help="steps between checkpoints (needs --checkpoint-dir)",
    )
    resume = p.add_mutually_exclusive_group()
    resume.add_argument(
        "--resume",
        action="store_const",
        const=True,
        default=False,
        help="continue from the latest checkpoint in --checkpoint-dir (an error if none)",
    )
    resume.add_argument(
        "--resume-if-any",
        dest="resume",
        action="store_const",
        const="auto",
        help="continue from the latest checkpoint if there is one, else start from step 0",
    )
    p.add_argument("--tiles", type=parse_tiles, metavar="SPEC", help=TILES_HELP)
    p.add_argument(
        "--memory",
        choices=("spill", "recompute", "auto"),
        default="auto",
        help="keep the activations the backward pass reads (spilling them to disk beyond "
        "the workers' memory), recompute them from checkpoints, or choose per segment "
        "(default auto: recompute only what the plan would spill and is faster to "
        "recompute)",
    )
    p.add_argument(
        "--weights-dir",
        metavar="DIR",
        help="a folder this process and every worker share: the workers read the model's "
        "external data and write the trained weights there, never through this process "
        "(for models larger than its memory); checkpoints are then folders the workers "
        "write",
    )
    p.add_argument("-o", "--output", required=True, metavar="OUT.onnx", help="trained model")
    p.set_defaults(func=cmd_train)
    return p


def cmd_train(args: argparse.Namespace) -> int:
    """``dfdl train``: train a model on ``--data`` and write the trained ONNX file.

    Example:
        >>> main(["train", "mlp.onnx", "--data", "d.npz", "-o", "out.onnx"])  # doctest: +SKIP
        0
    """
    from dfdl.data import as_source
    from dfdl.data.order import steps_per_epoch
    from dfdl.errors import ConfigError, DataError
    from dfdl.runtime.output import check_output_path
    from dfdl.runtime.session import TrainingSession, train_config
    from dfdl.training.losses import LOSSES

    check_gpus(args)
    check_output_path(args.output, "-o", size=_file_size(args.model))
    X, y = load_data(args.data, args.labels)
    if y is None and args.loss in LOSSES:
        raise DataError(
            f"--loss {args.loss} needs labels: an array 'y' in the .npz file, or --labels"
        )
    optimizer = make_optimizer(args)
    if args.scheduler and args.slurm:
        raise ConfigError("give --scheduler or --slurm, not both")
    start = time.perf_counter()
    session = TrainingSession(
        args.model,
        X if y is None else (X, y),
        train_config(
            loss=args.loss,
            optimizer=optimizer,
            batch_size=args.batch_size,
            epochs=args.epochs,
            steps=args.steps,
            seed=args.seed,
            tiles=args.tiles,
            checkpoint_dir=args.checkpoint_dir,
            checkpoint_every=args.checkpoint_every,
            resume=args.resume,
            memory=args.memory,
            weights_dir=args.weights_dir,
        ),
    )
    session.resume_point()  # the checkpoint folder and checkpoint, before a cluster starts
    session.check_model_and_data()  # the model, loss and labels, before --scheduler/--slurm
    prepared_s = time.perf_counter() - start
    with contextlib.ExitStack() as stack:
        client = None
        if args.scheduler:
            from dfdl.runtime.cluster import open_client

            client = stack.enter_context(open_client(args.scheduler, tls_security(args)))
        elif args.slurm:
            client = stack.enter_context(slurm_client(args.slurm))
        elif args.gpus:
            from distributed import Client

            from dfdl.runtime.cluster import local_cluster

            limit = args.device_memory_limit
            cluster = stack.enter_context(local_cluster(gpus=args.gpus, device_memory_limit=limit))
            client = stack.enter_context(Client(cluster))
        start = time.perf_counter() - prepared_s  # not counting the wait for a cluster
        result = session.run(client)
        elapsed = time.perf_counter() - start
    files = save_trained(result, args.output)
    per_epoch = steps_per_epoch(len(as_source(X, "X")), args.batch_size, False)
    total = args.steps if args.steps is not None else per_epoch * args.epochs
    losses = result.history["loss"]
    print(summarize_losses(losses, first_step=total - len(losses), per_epoch=per_epoch))
    print(
        f"trained {len(losses)} steps in {elapsed:.1f} s; wrote {args.output}"
        + written_beside(files)
    )
    return 0


def check_gpus(args) -> None:
    """``--gpus``: at least 1, not with another cluster, and no more than this machine
    has; ``--device-memory-limit``: with ``--gpus``, a byte count; checked before
    anything is loaded.

    Example:
        >>> check_gpus(argparse.Namespace(gpus=None, scheduler=None, slurm=None))
    """
    from dfdl.errors import ConfigError
    from dfdl.runtime.cluster import parse_memory, visible_gpus

    limit = getattr(args, "device_memory_limit", None)
    if limit is not None:
        if args.gpus is None:
            raise ConfigError("--device-memory-limit is for GPU workers: give --gpus N too")
        parse_memory(limit, "--device-memory-limit")
    if args.gpus is None:
        return
    if args.gpus < 1:
        raise ConfigError(f"--gpus {args.gpus}: give at least 1 (leave it out to train on CPUs)")
    if args.scheduler or args.slurm:
        raise ConfigError(
            "--gpus starts a cluster on this machine: leave it out with --scheduler, and "
            "with --slurm ask for GPUs in the spec (gpus=N)"
        )
    have = visible_gpus()
    if args.gpus > len(have):
        raise ConfigError(
            f"--gpus {args.gpus}: this machine has {len(have)} NVIDIA GPU(s) visible "
            "(nvidia-smi -L, CUDA_VISIBLE_DEVICES)"
        )


def _file_size(path: str) -> int:
    """Bytes of the model file (what the trained model needs at least), 0 if unknown."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def save_trained(result, path: str, fallback_dir: str | None = None) -> list[Path]:
    """Write the trained model to ``path``; if that fails after all (the disk filled up
    during training), write it to a new folder in ``fallback_dir`` (the system's
    temporary folder by default) so that it is not lost, and raise the error naming
    both.

    Returns:
        The files written (the model, then its external data file if any).

    Raises:
        OutputError: ``path`` could not be written; the message says where the model
            went instead, or that writing it there failed too.

    Example:
        >>> save_trained(result, "trained.onnx")  # doctest: +SKIP
    """
    from dfdl.errors import OutputError

    try:
        return result.save(path)
    except OutputError as e:
        error = e
    try:
        folder = tempfile.mkdtemp(prefix="dfdl-trained-", dir=fallback_dir)
        kept = result.save(os.path.join(folder, os.path.basename(path) or "trained.onnx"))
    except OSError as e:
        raise OutputError(f"{error}; writing it to a temporary folder failed too ({e})") from error
    raise OutputError(
        f"{error}. The trained model was written to {kept[0]} instead; move it where you want it"
    ) from error


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


@contextlib.contextmanager
def slurm_client(spec: str):
    """A client of SLURM jobs started from ``--slurm`` (cancelled on exit), once every
    job's workers have connected.

    Example:
        >>> with slurm_client("jobs=2,cores=8,memory=32GiB") as client:  # doctest: +SKIP
        ...     pass
    """
    from distributed import Client

    import dfdl.cluster

    options = dfdl.cluster.parse_slurm(spec)
    with dfdl.cluster.slurm(**options) as cluster, Client(cluster) as client:
        n = options.get("jobs", 1) * options.get("processes", 1)
        print(f"waiting for {n} Dask workers from SLURM jobs (squeue shows them)", flush=True)
        client.wait_for_workers(n)
        yield client


def tls_security(args: argparse.Namespace):
    """A ``Security`` from --tls-ca-file/--tls-cert/--tls-key, or None (dask's config).

    Example:
        >>> tls_security(argparse.Namespace(tls_ca_file=None, tls_cert=None, tls_key=None))
    """
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
