"""Ctrl-C in ``python -m dfdl`` before :func:`dfdl.cli.main` catches it.

``python -m dfdl`` imports the package (dfdl, numpy, Dask: about 1.5 s) before the
command's code runs; a Ctrl-C then would print the traceback of the import it cut. The
package imports this module first (standard library only), which makes such a Ctrl-C
print the command's one line and exit with status 130; :func:`dfdl.cli.main` turns
Ctrl-C into a ``KeyboardInterrupt`` (which it catches) once it runs.

Python ignores an exception raised while a finalizer or a garbage collector callback
runs ("Exception ignored in ..."), and a signal handler runs wherever the main thread
is: a Ctrl-C landing there would be lost and the command would go on. So the loading
handler exits at once, and the command's handler does not raise inside such code and
delivers the Ctrl-C again every :data:`REDELIVER_S` seconds until :func:`handled` says
the command caught it.

Example:
    >>> interrupt_quietly_while_loading()  # in pytest, not ``python -m dfdl``
    False
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import NoReturn

#: what the command prints to stderr on Ctrl-C, before it exits with status 130
INTERRUPTED = "dfdl: interrupted"

#: seconds between deliveries of a Ctrl-C the command has not caught yet
REDELIVER_S = 0.5

_handled = threading.Event()
_redelivering: list[threading.Thread] = []


def _interrupted_while_loading(signum, frame) -> NoReturn:
    # nothing to clean up yet (no cluster, no files); an exception could be swallowed
    sys.stderr.write(INTERRUPTED + "\n")
    sys.stderr.flush()
    os._exit(130)


def silence_dask_logs() -> None:
    """Silence the loggers of Dask and its event loops in this process: once a command
    is interrupted, what they log about calls cut short is noise (asyncio's "Task
    exception was never retrieved" of a nanny cut short while starting, among others).

    Example:
        >>> silence_dask_logs()  # doctest: +SKIP
    """
    for name in ("distributed", "tornado", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


def _interrupt(signum, frame) -> NoReturn:
    silence_dask_logs()
    if not _redelivering:
        thread = threading.Thread(target=_redeliver, name="dfdl-interrupt", daemon=True)
        _redelivering.append(thread)
        thread.start()
    if _in_finalizer(frame):
        return  # Python would ignore it there (and print so): the thread sends it again
    raise KeyboardInterrupt


def _in_finalizer(frame) -> bool:
    """Whether ``frame`` runs inside a ``__del__``, a ``weakref.finalize`` or a garbage
    collector callback, where Python ignores an exception."""
    import gc
    import weakref

    codes = {weakref.finalize.__call__.__code__}
    for callback in gc.callbacks:
        code = getattr(getattr(callback, "__func__", callback), "__code__", None)
        if code is not None:
            codes.add(code)
    while frame is not None:
        if frame.f_code in codes or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _redeliver() -> None:
    while not _handled.wait(REDELIVER_S):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0)  # let the main thread run its handler


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
    """Make Ctrl-C raise a ``KeyboardInterrupt`` where
    :func:`interrupt_quietly_while_loading` took it, delivered again every
    :data:`REDELIVER_S` seconds until :func:`handled` (one landing in a finalizer would
    be ignored by Python).

    Example:
        >>> end_quiet_loading()
    """
    if signal.getsignal(signal.SIGINT) is _interrupted_while_loading:
        signal.signal(signal.SIGINT, _interrupt)


def handled() -> None:
    """The command caught its ``KeyboardInterrupt`` and is closing: ignore further
    Ctrl-C (where :func:`end_quiet_loading` installed its handler) and stop delivering.

    Example:
        >>> handled()
    """
    if signal.getsignal(signal.SIGINT) is _interrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _handled.set()


# the package imports this module first (dfdl/__init__.py)
interrupt_quietly_while_loading()
