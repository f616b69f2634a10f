"""What the ``dfdl`` commands share: the one-line error parser, flag values, the
optimizer and data loading (output paths are checked and written by
:mod:`dfdl.runtime.output`).

Example:
    >>> parse_tiles("batch=2,model=1")
    {'batch': 2, 'model': 1}
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NoReturn

#: exit status of every reported error (argparse's own usage errors use it too)
EXIT_ERROR = 2

#: default learning rate per ``--optimizer`` (SGD: ``dfdl.train``'s default)
DEFAULT_LR = {"sgd": 0.01, "adam": 1e-3, "adamw": 1e-3}
OPTIMIZERS = tuple(DEFAULT_LR)

DEBUG_HELP = "show the full traceback of an error"
TILES_HELP = (
    "tiling: auto (default), uneven, or batch=B,model=M,space=S[,min_weight_tile=BYTES]"
    "[,split_norms=1]"
)
OPTIMIZER_HELP = "torch-equivalent optimizer (default sgd)"


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


def positive_int(text: str) -> int:
    """A flag value that must be a positive integer (``--checkpoint-every``).

    Example:
        >>> positive_int("500")
        500
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {value}")
    return value


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


def add_debug(p: argparse.ArgumentParser) -> None:
    """Add ``--debug`` to a subcommand (unset there, so ``dfdl --debug CMD`` still counts).

    Example:
        >>> add_debug(Parser(prog="dfdl info"))
    """
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)


def add_training_args(p: argparse.ArgumentParser, batch_default: int | None) -> None:
    """Add the loss, optimizer and batch-size flags of ``train`` and
    ``export-training-graph``.

    Example:
        >>> add_training_args(Parser(prog="dfdl train"), batch_default=64)
    """
    p.add_argument(
        "--loss",
        default="cross_entropy",
        help="cross_entropy (default), mse, bce_with_logits, dice, or the name of a model "
        "output that already is the loss",
    )
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd", help=OPTIMIZER_HELP)
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


# ------------------------------------------------------------------------------ data


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


def labels_type(graph, input_types: dict, loss: str):
    """Type of one batch of labels for ``loss`` (None when the loss is a model output).

    Example:
        >>> labels_type(graph, {"x": TensorType((4, 8), np.float32)}, "mse")  # doctest: +SKIP
        TensorType(shape=(4, 3), dtype=dtype('float32'))
    """
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


def written_beside(files: list[Path]) -> str:
    """`` (weights in NAME.data)`` where a model was saved with external data, else "".

    Example:
        >>> written_beside([Path("m.onnx"), Path("m.onnx.data")])
        ' (weights in m.onnx.data)'
    """
    return f" (weights in {files[1].name})" if len(files) > 1 else ""
