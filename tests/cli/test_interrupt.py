"""Ctrl-C in ``dfdl train``: one line, exit status 130, nothing left behind.

A terminal's Ctrl-C sends SIGINT to every process of the foreground group: the command
and the embedded cluster's worker processes. The tests start ``python -m dfdl train`` in
a group of its own and signal the group as a terminal does: once training runs (its
first checkpoint), and early, while the command imports dfdl or its worker processes
are still starting.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from dfdl.runtime import checkpoint

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# A process started in the background (``cmd &`` in a script, as CI runners may) inherits
# SIGINT ignored, and so would the command; a terminal's foreground command has it at its
# default. The command is exec'd from a Python that sets that default first.
_WITH_DEFAULT_SIGINT = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])",
]


def _started(pid: int) -> bool:
    """Whether ``pid`` has exec'd ``python -m dfdl`` (not the wrapper that execs it)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"\0-m\0dfdl\0" in f.read()
    except OSError:
        return False


def _assert_quiet_end(proc: subprocess.Popen, err: str, out) -> None:
    assert proc.returncode == 130, err
    assert err.splitlines() == ["dfdl: interrupted"], err
    assert not out.exists()
    # the worker processes went with the command
    deadline = time.monotonic() + 30
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _group_alive(proc.pid), "a process of the run outlived it"


def test_ctrl_c_prints_one_line_and_leaves_nothing(work):
    # the work files' 8-16-3 MLP on 24 samples: 60000 steps, far more than the test waits
    out = work / "interrupted.onnx"
    proc = subprocess.Popen(
        _WITH_DEFAULT_SIGINT
        + ["-m", "dfdl", "train", "mlp.onnx", "--data", "data.npz"]
        + ["--epochs", "20000", "--batch-size", "8", "-o", str(out)]
        + ["--checkpoint-dir", "ckpt", "--checkpoint-every", "3"],
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # the first checkpoint: the cluster is up and steps run (stdout is the summary,
        # printed at the end)
        deadline = time.monotonic() + 120
        while not checkpoint.find(work / "ckpt") and proc.poll() is None:
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.1)
        assert proc.poll() is None, "training ended before the interrupt"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert err.splitlines()[-1:] == ["dfdl: interrupted"], err
    assert "Traceback" not in err and "ERROR" not in err and "WARNING" not in err, err
    assert not out.exists()
    # the worker processes went with the command
    deadline = time.monotonic() + 15
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _group_alive(proc.pid), "a process of the run outlived it"


@pytest.mark.skipif(not os.path.exists("/proc/self/cmdline"), reason="needs /proc")
@pytest.mark.parametrize("delay", [0.3, 0.8, 1.5, 2.5, 4.0])
def test_an_early_ctrl_c_prints_one_line_too(work, delay):
    """A Ctrl-C while dfdl imports (the first ~1.5 s) or while the embedded cluster's
    worker processes start (importing dfdl themselves, before the worker setup ignores
    SIGINT): the same one line, no traceback from the command or a worker. The delay
    counts from the exec of ``python -m dfdl``; on a slow machine a delay may fall in
    another phase, each of which must end the same way."""
    out = work / f"early-{delay}.onnx"
    proc = subprocess.Popen(
        _WITH_DEFAULT_SIGINT
        + ["-m", "dfdl", "train", "mlp.onnx", "--data", "data.npz"]
        + ["--epochs", "20000", "--batch-size", "8", "-o", str(out)],
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not _started(proc.pid) and proc.poll() is None:
            assert time.monotonic() < deadline, "python -m dfdl never started"
            time.sleep(0.01)
        time.sleep(delay)
        assert proc.poll() is None, "the command ended before the interrupt"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    _assert_quiet_end(proc, err, out)
