"""The ``dfdl`` command line: ``train``, ``tune``, ``plan``, ``export-training-graph`` and
``info``.

One module per command (:mod:`~dfdl.cli.train`, :mod:`~dfdl.cli.tune`, :mod:`~dfdl.cli.plan`,
:mod:`~dfdl.cli.export`, :mod:`~dfdl.cli.info`), each with ``add_parser`` (its flags)
and one function taking the parsed arguments and returning the exit status; what they
share is in :mod:`~dfdl.cli.common`. The commands import dfdl's pipeline (and numpy,
onnx, dask) inside those functions, not at module level, so ``dfdl --help`` and a bad
flag answer without loading it.

An error dfdl raises on purpose (:class:`dfdl.errors.DfdlError`), a missing or
unreadable file, and a bad flag are reported as one line, ``dfdl: error: <message>``,
with exit status 2 and no traceback; ``dfdl --debug ...`` shows the traceback instead.

Example:
    .. code-block:: console

        $ dfdl info model.onnx
        $ dfdl train model.onnx --data train.npz --optimizer adamw --lr 1e-3 -o trained.onnx
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dfdl.cli import export, info, plan, train, tune
from dfdl.cli.common import DEBUG_HELP, EXIT_ERROR, Parser, add_debug

__all__ = ["build_parser", "main"]


def build_parser() -> Parser:
    """The ``dfdl`` argument parser with its five subcommands.

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
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in (train, tune, plan, export, info):
        add_debug(command.add_parser(sub))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``dfdl`` command line; returns the exit status.

    Example:
        >>> main(["info", "model.onnx"])  # doctest: +SKIP
        0
    """
    args = build_parser().parse_args(argv)
    from dfdl.errors import DfdlError
    from dfdl.interrupts import INTERRUPTED, end_quiet_loading, handled

    try:
        end_quiet_loading()
        return args.func(args)
    except (DfdlError, OSError) as e:
        if args.debug:
            raise
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"dfdl: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        handled()
        if args.debug:
            raise
        from dfdl.runtime.cluster import close_embedded

        # now, not at the interpreter's exit, after the client's thread pool has closed
        close_embedded(quiet=True)
        print(INTERRUPTED, file=sys.stderr)
        return 130
