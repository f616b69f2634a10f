"""Ctrl-C in the ``dfdl`` command is never lost: one landing in a finalizer or a garbage
collector callback (where Python ignores exceptions) is delivered again, and the command
catches it as a ``KeyboardInterrupt`` without a word on stderr."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to the process")

# the command's handler (installed as dfdl.cli.main does once loaded), then a Ctrl-C sent
# from inside a finalizer of the given kind; the main loop must catch it
_PROGRAM = """
import gc, os, signal, sys, time, weakref
from dfdl import interrupts

signal.signal(signal.SIGINT, interrupts._interrupt)
sent = []

def send():
    if not sent:
        sent.append(1)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # bytecodes: the handler runs here, inside the finalizer
            pass

class Dies:
    def __del__(self):
        send()

def on_gc(phase, info):
    send()

kind = sys.argv[1]
if kind == "gc":
    gc.callbacks.append(on_gc)
try:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if kind == "del":
            Dies()
        elif kind == "finalize":
            weakref.finalize(type("T", (), {})(), send)
        gc.collect()
        time.sleep(0.01)
    print("not interrupted")
except KeyboardInterrupt:
    interrupts.handled()
    print("caught", "in a finalizer" if interrupts._in_finalizer(sys._getframe()) else "")
    sys.exit(130)
"""


@pytest.mark.parametrize("kind", ["del", "finalize", "gc"])
def test_a_ctrl_c_in_a_finalizer_is_delivered_again(kind):
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_PROGRAM), kind],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert proc.stdout.split() == ["caught"]
    # not raised where Python would have ignored it (and printed "Exception ignored")
    assert proc.stderr == ""
