"""Ctrl-C in ``python -m dfdl`` before :func:`dfdl.cli.main` catches it.

``python -m dfdl`` imports the package (dfdl, numpy, Dask: about 1.5 s) before the
command's code runs; a Ctrl-C then would print the traceback of the import it cut. The
package imports this module first (standard library only), which makes such a Ctrl-C
print the command's one line and exit with status 130; :func:`dfdl.cli.main` hands
Ctrl-C back to Python (a ``KeyboardInterrupt``, which it catches) once it runs.

Example:
    >>> interrupt_quietly_while_loading()  # in pytest, not ``python -m dfdl``
    False
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import NoReturn

#: what the command prints to stderr on Ctrl-C, before it exits with status 130
INTERRUPTED = "dfdl: interrupted"


def _interrupted_while_loading(signum, frame) -> NoReturn:
    print(INTERRUPTED, file=sys.stderr)
    raise SystemExit(130)


def interrupt_quietly_while_loading() -> bool:
    """When this process is ``python -m dfdl`` without ``--debug``, still importing its
    package, make a Ctrl-C that comes while dfdl, numpy and Dask import (about 1.5 s,
    before :func:`dfdl.cli.main` catches interrupts) print the one line
    :data:`INTERRUPTED` and exit with status 130, not a traceback of the import it cut;
    returns whether it did. A SIGINT ignored or handled by someone else stays so.
    :func:`end_quiet_loading` hands Ctrl-C back.

    Example:
        >>> interrupt_quietly_while_loading()  # in pytest, not ``python -m dfdl``
        False
    """
    argv = sys.orig_argv
    # while ``python -m`` imports the package of the module it runs, sys.argv[0] is "-m"
    command = sys.argv[:1] == ["-m"] and "-m" in argv[:-1] and argv[argv.index("-m") + 1] == "dfdl"
    if (
        not command
        or "--debug" in argv
        or threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        return False
    signal.signal(signal.SIGINT, _interrupted_while_loading)
    return True


def end_quiet_loading() -> None:
    """Give Ctrl-C back to Python (a ``KeyboardInterrupt``) where
    :func:`interrupt_quietly_while_loading` took it.

    Example:
        >>> end_quiet_loading()
    """
    if signal.getsignal(signal.SIGINT) is _interrupted_while_loading:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# the package imports this module first (dfdl/__init__.py)
interrupt_quietly_while_loading()
