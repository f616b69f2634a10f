"""SIGKILL a training at random moments, some inside a checkpoint write: every resume
starts from a checkpoint that loads, and the run ends bit-identical to one never killed.

Each launch is a real ``dfdl.train`` in a subprocess of its own process group (its
embedded cluster's worker processes included), with ``checkpoint_every=1`` and
``resume="auto"``. The test kills the whole group with SIGKILL, either at a moment drawn
from a seeded RNG over the uninterrupted run's duration, or the instant a checkpoint's
temporary file shows up in the folder (a kill inside the write: the file left behind
proves it), and launches again until the run finishes. Each kill is one trial.

Between launches the test reads the folder as a resume does: the checkpoint the pointer
names loads and holds the very bits the uninterrupted run wrote at that step, and every
finished ``step-*.npz`` loads (a killed write never leaves a corrupt file under a
checkpoint's name).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dfdl.runtime import checkpoint

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX")

#: kills in all; each is one trial
TRIALS = 12
STEPS = 24
SEED = 39

#: the training each launch runs: a 6-16-3 MLP on 24 samples, AdamW (its step count is
#: carried state), shuffled batches; writes params and losses to OUT when it finishes
SCRIPT = """
import sys

import numpy as np

import dfdl
import dfdl.models

if __name__ == "__main__":
    ckpt, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = np.random.default_rng(0)
    X = rng.standard_normal((24, 6)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0.5)
    r = dfdl.train(
        dfdl.models.mlp((6, 16, 3), seed=3), (X, y), optimizer=dfdl.optim.AdamW(lr=0.01),
        batch_size=8, steps=steps, shuffle=True, seed=11, tiles={"batch": 2},
        checkpoint_dir=ckpt, checkpoint_every=1, resume="auto", progress=False,
    )
    np.savez(out, loss=np.array(r.history["loss"]), **{"p/" + k: v for k, v in r.params.items()})
"""


def _launch(script: Path, ckpt: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(script), str(ckpt), str(out), str(STEPS)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _living(pgid: int) -> list[int] | None:
    """The processes of group ``pgid`` that are not zombies (dead, waiting for their
    parent, or init for orphans, to collect them), or None where there is no /proc."""
    if not os.path.isdir("/proc/self"):
        return None
    living = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            living.append(int(pid))
    return living


def _group_gone(pgid: int, within: float = 10.0) -> bool:
    """Whether no process of group ``pgid`` is left alive (waiting up to ``within``
    seconds for the kernel to finish off the killed ones)."""
    deadline = time.monotonic() + within
    while True:
        living = _living(pgid)
        if living is None:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return True
        elif not living:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def _temp_files(ckpt: Path) -> list[str]:
    """Temporary files of unfinished checkpoint or pointer writes in ``ckpt``."""
    try:
        names = os.listdir(ckpt)
    except FileNotFoundError:
        return []
    return [n for n in names if n.startswith((".step-", ".latest."))]


def _kill_at(
    proc: subprocess.Popen,
    ckpt: Path,
    delay: float,
    in_write: bool,
    stale: set[str],
    sizes: list[int],
) -> bool:
    """SIGKILL ``proc``'s group ``delay`` seconds after now or, with ``in_write``, at the
    first temporary checkpoint file (not in ``stale``: left by an earlier kill) seen
    after ``delay``; False when it finished first. Appends to ``sizes`` how many
    processes the group had when killed at a random moment."""
    start = time.monotonic()
    deadline = start + 120
    while proc.poll() is None:
        now = time.monotonic()
        assert now < deadline, "a launch neither finished nor was killed in 120 s"
        if now - start >= delay and (not in_write or set(_temp_files(ckpt)) - stale):
            if not in_write:  # (a write kill must not wait for the count)
                sizes.append(len(_living(proc.pid) or ()))
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                break
            proc.wait(timeout=60)
            return proc.returncode == -signal.SIGKILL
        # past the delay, a write kill polls fast: a checkpoint write takes milliseconds
        time.sleep(0.005 if not in_write or now - start < delay else 0.0005)
    return False


def _checked_resume_point(ckpt: Path, reference: Path) -> int:
    """The step a resume of ``ckpt`` starts at, after checking that its checkpoint, and
    every finished checkpoint file of the folder, loads and equals the reference's."""
    if not ckpt.exists():
        return 0
    for f in sorted(ckpt.glob("step-*.npz")):
        step, arrays, _ = checkpoint.load(f)  # CheckpointError fails the test
        _, expected, _ = checkpoint.load(reference / f.name)
        assert set(arrays) == set(expected), f.name
        for k in arrays:
            assert np.array_equal(arrays[k], expected[k]), f"{f.name}: {k} differs"
    path = checkpoint.find(ckpt)
    return 0 if path is None else checkpoint.load(path)[0]


def test_sigkilled_runs_resume_bit_identically(tmp_path):
    rng = np.random.default_rng(SEED)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)

    began = time.monotonic()
    reference = tmp_path / "reference"
    proc = _launch(script, reference, tmp_path / "reference.npz")
    while not checkpoint.find(reference) and proc.poll() is None:
        assert time.monotonic() - began < 180, "the uninterrupted run never checkpointed"
        time.sleep(0.005)
    startup = time.monotonic() - began  # to the first checkpoint
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err.decode()
    per_step = (time.monotonic() - began - startup) / (STEPS - 1)
    with np.load(tmp_path / "reference.npz") as f:
        want = {k: f[k] for k in f.files}
    assert len(want["loss"]) == STEPS

    kills = in_writes = finished = launches = 0
    chain, chain_open = 0, False
    sizes: list[int] = []  # processes in the group at each random-moment kill
    while kills < TRIALS or chain_open:
        ckpt, out = tmp_path / f"ckpt{chain}", tmp_path / f"out{chain}.npz"
        start = _checked_resume_point(ckpt, reference)
        chain_open = True
        trial = kills < TRIALS
        in_write = trial and kills % 2 == 1
        # a moment over the launch's expected duration (start-up included: the steps
        # left after its checkpoint); a write kill waits for the next write after it
        left = startup + (STEPS - start) * per_step
        delay = rng.uniform(0.0, left if not in_write else startup + (left - startup) / 2)
        assert launches < 3 * TRIALS, (
            f"{launches} launches for {kills} kills: no checkpoint writes?"
        )
        stale = set(_temp_files(ckpt))
        proc = _launch(script, ckpt, out)
        launches += 1
        killed = _kill_at(proc, ckpt, delay, in_write, stale, sizes) if trial else False
        if killed:
            assert _group_gone(proc.pid), f"a process of killed group {proc.pid} survived"
            kills += 1
            in_writes += bool(set(_temp_files(ckpt)) - stale)
            continue
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err.decode()
        assert _group_gone(proc.pid), f"a process of finished group {proc.pid} survived"
        with np.load(out) as f:
            got = {k: f[k] for k in f.files}
        assert set(got) == set(want)
        for k in want:
            if k != "loss":
                assert np.array_equal(got[k], want[k]), f"chain {chain}: {k} differs"
        assert len(got["loss"]) == STEPS - start, "the run did not start at its checkpoint"
        assert np.array_equal(got["loss"], want["loss"][start:])
        assert not _temp_files(ckpt), "a finished run left temporary files"
        finished += 1
        chain += 1
        chain_open = False
    took = time.monotonic() - began
    print(
        f"{kills} kills ({in_writes} inside a write), {launches} launches, {finished} runs "
        f"finished bit-identical, group sizes {sorted(sizes)}, {took:.1f} s "
        f"(start-up {startup:.2f} s, {per_step:.3f} s a step)"
    )
    assert kills == TRIALS
    assert in_writes >= 1, "no kill landed inside a checkpoint write"
    if os.path.isdir("/proc/self"):
        assert max(sizes) > 1, "no kill caught the worker processes in the group"
