"""Checkpoints (:mod:`dfdl.runtime.checkpoint`) and resuming from them.

The file-level cases read real ``.npz`` files written by :func:`checkpoint.save` and then
truncated or edited on disk; the run-level cases train a small MLP on a real
LocalCluster (``tests/scheduler_probe.py``). Runs refused for their checkpoint folder or
arguments (another run's checkpoint, a truncated one, none to resume from) are rows of
the bad-input table, ``tests/test_bad_input.py``: refused before any task is submitted,
with the folder unchanged.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import dfdl
import dfdl.models
from dfdl.errors import CheckpointError
from dfdl.runtime import checkpoint, stored
from tests import scheduler_probe

#: the probe cluster (counts submissions), overriding the session's client fixture
client = scheduler_probe.client

SIZES = (6, 16, 3)
BATCH = 8
N = 24  # 3 steps per epoch
STEPS, AT, EVERY = 6, 4, 2


def data(n: int = N) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, SIZES[0])).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0.5)
    return X, y


def fit(client, model=None, train_data=None, **kwargs) -> dfdl.TrainResult:
    kwargs.setdefault("optimizer", dfdl.optim.AdamW(lr=0.01))
    kwargs.setdefault("batch_size", BATCH)
    kwargs.setdefault("seed", 11)
    kwargs.setdefault("epochs", 2)
    model = dfdl.models.mlp(SIZES, seed=3) if model is None else model
    train_data = data() if train_data is None else train_data
    return dfdl.train(model, train_data, client=client, progress=False, **kwargs)


def assert_same(a: dfdl.TrainResult, b: dfdl.TrainResult) -> None:
    assert set(a.params) == set(b.params)
    for k in a.params:
        assert a.params[k].dtype == b.params[k].dtype, k
        assert np.array_equal(a.params[k], b.params[k]), f"{k} differs"


@pytest.fixture(scope="module")
def uninterrupted(client):
    return fit(client, steps=STEPS)


@pytest.fixture(scope="module")
def written(client, tmp_path_factory) -> Path:
    """A folder left by a run stopped after ``AT`` steps, checkpoints every ``EVERY``."""
    ckpt = tmp_path_factory.mktemp("ckpt")
    fit(client, steps=AT, checkpoint_dir=ckpt, checkpoint_every=EVERY)
    return ckpt


@pytest.fixture
def ckpt(written, tmp_path) -> Path:
    """A copy of ``written`` this test may edit."""
    return Path(shutil.copytree(written, tmp_path / "ckpt"))


def latest_file(d: Path) -> Path:
    return d / (d / "latest").read_text()


def rewrite(path: Path, *, drop: tuple[str, ...] = (), meta: bytes | None = None) -> None:
    """Rewrite the checkpoint at ``path`` without the entries ``drop`` and, if given,
    with ``meta`` as its raw meta bytes."""
    with np.load(path) as z:
        entries = {k: z[k] for k in z.files if k not in drop}
    if meta is not None:
        entries["meta"] = np.frombuffer(meta, np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **entries)


# ---- writing -------------------------------------------------------------------------------


def test_save_records_the_arrays_and_syncs_the_file_and_the_folder(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):  # records what was synced, then syncs it
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    w = np.arange(6, dtype=np.float64).reshape(2, 3)
    path = checkpoint.save(tmp_path, 7, {"w": w, "b": np.ones(3, np.float32)}, {"seed": 4})
    # the checkpoint, the folder, the pointer, the folder
    assert synced == [False, True, False, True]
    step, arrays, meta = checkpoint.load(path)
    assert step == 7 and meta["seed"] == 4 and meta["format"] == checkpoint.FORMAT
    assert meta["arrays"] == {"w": [[2, 3], "<f8"], "b": [[3], "<f4"]}
    assert arrays["w"].dtype == np.float64 and np.array_equal(arrays["w"], w)
    assert sorted(os.listdir(tmp_path)) == ["latest", path.name]


def test_a_write_killed_midway_leaves_the_previous_checkpoint(tmp_path):
    """A process SIGKILLed while it writes a checkpoint: the previous one stays the
    latest and loads; the next run's :func:`checkpoint.prepare` removes the partial file."""
    script = textwrap.dedent(
        f"""
        import os, signal
        import numpy as np
        from dfdl.runtime import checkpoint
        checkpoint.save({str(tmp_path)!r}, 2, {{"w": np.zeros(1000, np.float32)}}, {{}})
        def killed(f, **arrays):
            f.write(b"PK" + bytes(5000))
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        np.savez = killed
        checkpoint.save({str(tmp_path)!r}, 4, {{"w": np.ones(1000, np.float32)}}, {{}})
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ}, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    partial = [p for p in os.listdir(tmp_path) if p.startswith(".step-000000004.npz.")]
    assert len(partial) == 1, os.listdir(tmp_path)
    step, arrays, _ = checkpoint.load_latest(tmp_path)
    assert step == 2 and not arrays["w"].any()
    checkpoint.prepare(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["latest", "step-000000002.npz"]


# ---- folder checkpoints (weights_dir) ------------------------------------------------------


def _write_npy(values):
    """``save_stored``'s ``write``: each array written as the workers write their tiles."""

    def write(folder):
        out = {}
        for i, (name, v) in enumerate(values.items()):
            target = stored.create(folder / f"{i:04d}-{name}.npy", v.shape, v.dtype)
            stored.write_tile(v, target, tuple(slice(0, n) for n in v.shape))
            out[name] = target
        return out

    return write


def test_a_folder_checkpoint_loads_as_memory_maps_of_what_was_written(tmp_path):
    values = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b.m": np.ones(5)}
    placed = checkpoint.save_stored(tmp_path, 7, _write_npy(values), {"seed": 3})
    assert (tmp_path / "latest").read_text() == "step-000000007"
    assert sorted(os.listdir(tmp_path / "step-000000007")) == [
        "0000-w.npy", "0001-b.m.npy", "meta.json"
    ]  # fmt: skip
    assert all(Path(v.path).parent == tmp_path / "step-000000007" for v in placed.values())
    step, arrays, meta = checkpoint.load_latest(tmp_path)
    assert step == 7 and meta["seed"] == 3
    for k, v in values.items():
        assert isinstance(arrays[k], np.memmap) and not arrays[k].flags.writeable
        np.testing.assert_array_equal(arrays[k], v)
        np.testing.assert_array_equal(placed[k].mapped(), v)


def test_a_folder_checkpoint_that_fails_midway_leaves_the_previous_one(tmp_path):
    checkpoint.save_stored(tmp_path, 2, _write_npy({"w": np.zeros(4)}), {})

    def dies(folder):
        _write_npy({"w": np.ones(4)})(folder)
        raise OSError("the disk went away")

    with pytest.raises(OSError, match="went away"):
        checkpoint.save_stored(tmp_path, 4, dies, {})
    assert sorted(os.listdir(tmp_path)) == ["latest", "step-000000002"]
    step, arrays, _ = checkpoint.load_latest(tmp_path)
    assert step == 2 and not arrays["w"].any()
    # a kill leaves the temporary folder: the next run's prepare removes it
    (tmp_path / ".step-000000004.abcd1234").mkdir()
    checkpoint.prepare(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["latest", "step-000000002"]


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda d: (d / "0000-w.npy").unlink(), r"lacks 0000-w.npy, the file of array 'w'"),
        (lambda d: (d / "meta.json").unlink(), r"has no meta.json"),
        (lambda d: (d / "meta.json").write_text("{"), r"has an unreadable meta.json"),
        (lambda d: os.truncate(d / "0000-w.npy", 100), r"is unreadable: truncated"),
    ],
    ids=["a file gone", "no meta", "bad meta", "truncated"],
)
def test_a_damaged_folder_checkpoint_is_named(tmp_path, damage, match):
    checkpoint.save_stored(tmp_path, 3, _write_npy({"w": np.zeros((64, 64))}), {})
    damage(tmp_path / "step-000000003")
    with pytest.raises(CheckpointError, match=match):
        checkpoint.load_latest(tmp_path)


# ---- the folder ----------------------------------------------------------------------------


def test_prepare_creates_the_folder_and_leaves_an_empty_pointer(tmp_path):
    d = tmp_path / "a" / "b"
    assert checkpoint.prepare(d) == d
    assert d.is_dir() and os.listdir(d) == ["latest"]
    assert (d / "latest").read_bytes() == b""
    assert checkpoint.find(d) is None


def test_prepare_leaves_foreign_checkpoint_files_without_a_pointer(ckpt):
    (ckpt / "latest").unlink()
    checkpoint.prepare(ckpt)
    assert not (ckpt / "latest").exists()  # which one to resume from stays the user's choice


def test_a_kill_between_the_first_file_and_its_pointer_resumes_from_step_0(
    client, uninterrupted, tmp_path
):
    """SIGKILL after the first checkpoint file is in place, before its pointer: the file
    is not committed, so resume='auto' starts from step 0 (not a refusal of the folder)."""
    script = textwrap.dedent(
        f"""
        import os, signal
        import numpy as np
        from dfdl.runtime import checkpoint
        d = checkpoint.prepare({str(tmp_path / "ckpt")!r})
        write = checkpoint._atomic_write
        def killed(path, body):
            if path.name == checkpoint.POINTER:
                os.kill(os.getpid(), signal.SIGKILL)
            write(path, body)
        checkpoint._atomic_write = killed
        checkpoint.save(d, 2, {{"w": np.zeros(10, np.float32)}}, {{}})
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ}, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    d = tmp_path / "ckpt"
    assert sorted(os.listdir(d)) == ["latest", "step-000000002.npz"]
    assert checkpoint.find(d) is None
    result = fit(client, steps=STEPS, checkpoint_dir=d, checkpoint_every=EVERY, resume="auto")
    assert_same(result, uninterrupted)
    assert len(result.history["loss"]) == STEPS
    assert checkpoint.load_latest(d)[0] == STEPS


def test_prepare_refuses_a_file_and_an_unwritable_folder(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(CheckpointError, match=re.escape(f"{f} is a file, not a folder")):
        checkpoint.prepare(f)
    with pytest.raises(CheckpointError, match="cannot be written") as info:
        checkpoint.prepare(f / "sub")  # below a file: no folder can be made there
    assert str(f / "sub") in str(info.value)
    with pytest.raises(CheckpointError, match="/proc/dfdl-ckpt cannot be written"):
        checkpoint.prepare("/proc/dfdl-ckpt")  # read-only even for root


# ---- the pointer ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["../step-000000004.npz", "/etc/hostname", "sub/step-000000004.npz", ".."]
)
def test_a_pointer_out_of_the_folder_is_refused(ckpt, name):
    (ckpt / "latest").write_text(name)
    with pytest.raises(CheckpointError, match="not a file in") as info:
        checkpoint.find(ckpt)
    assert str(ckpt / "latest") in str(info.value)


def test_a_pointer_to_a_missing_file_is_refused(ckpt):
    (ckpt / "latest").write_text("step-000000006.npz")
    with pytest.raises(CheckpointError, match="names step-000000006.npz, which does not exist"):
        checkpoint.load_latest(ckpt)


def test_a_link_out_of_the_folder_is_refused(ckpt, tmp_path):
    outside = tmp_path / "outside.npz"
    shutil.copy(latest_file(ckpt), outside)
    (ckpt / "link.npz").symlink_to(outside)
    (ckpt / "latest").write_text("link.npz")
    with pytest.raises(CheckpointError, match="a link out of"):
        checkpoint.find(ckpt)


def test_checkpoints_without_a_pointer_are_not_ignored(ckpt):
    (ckpt / "latest").unlink()
    with pytest.raises(CheckpointError, match="no 'latest' pointer.*step-000000004.npz"):
        checkpoint.find(ckpt)


def test_no_folder_and_an_empty_folder_have_no_checkpoint(tmp_path):
    assert checkpoint.find(tmp_path / "missing") is None
    assert checkpoint.load_latest(tmp_path) is None


# ---- unreadable checkpoints ----------------------------------------------------------------


def test_a_truncated_checkpoint_is_named(ckpt):
    path = latest_file(ckpt)
    path.write_bytes(path.read_bytes()[:-300])
    with pytest.raises(CheckpointError, match="truncated or not a checkpoint") as info:
        checkpoint.load_latest(ckpt)
    assert str(path) in str(info.value) and "BadZipFile" in str(info.value)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"drop": ("meta",)}, "has no meta"),
        ({"meta": b"{not json"}, "has unreadable meta"),
        ({"meta": b"[1, 2]"}, "meta that is not a JSON object"),
        ({"meta": b'{"step": "four"}'}, "no valid step in its meta"),
        ({"drop": ("a/layers.0.weight.exp_avg",)}, "lacks array 'layers.0.weight.exp_avg'"),
    ],
)
def test_an_edited_checkpoint_is_named(ckpt, edit, match):
    path = latest_file(ckpt)
    rewrite(path, **edit)
    with pytest.raises(CheckpointError, match=match) as info:
        checkpoint.load(path)
    assert str(path) in str(info.value)


def test_an_array_unlike_its_meta_is_named(ckpt):
    path = latest_file(ckpt)
    with np.load(path) as z:
        meta = json.loads(bytes(z["meta"]))
    meta["arrays"]["layers.0.bias"][0] = [17]
    rewrite(path, meta=json.dumps(meta).encode())
    with pytest.raises(CheckpointError, match=r"'layers.0.bias' of shape \(16,\)"):
        checkpoint.load(path)


# ---- another run's checkpoint --------------------------------------------------------------


def test_mismatch_compares_what_an_older_checkpoint_has():
    """A checkpoint written before the run was recorded (only seed and batch size):
    the arrays and those two are compared, nothing else."""
    arrays = {"w": np.zeros((2, 3), np.float32)}
    old = {"seed": 0, "batch_size": 8, "step": 4}
    run = {"params": ["w"], "optimizer": {"kind": "SGD", "states": []}, "loss": "mse"}
    run |= {"seed": 0, "batch_size": 8, "samples": 10, "shuffle": True, "drop_last": False}
    spec = {"w": ((2, 3), np.dtype(np.float32))}
    assert checkpoint.mismatch("c.npz", old, arrays, run, spec) is None
    assert "batch_size 8; this run has 9" in checkpoint.mismatch(
        "c.npz", old, arrays, {**run, "batch_size": 9}, spec
    )
    doubled = {"w": ((2, 3), np.dtype(np.float64))}
    assert "'w' of shape (2, 3) float32; this run's is (2, 3) float64" in checkpoint.mismatch(
        "c.npz", old, arrays, run, doubled
    )
    more = {**spec, "w.momentum_buffer": ((2, 3), np.dtype(np.float32))}
    line = checkpoint.mismatch("c.npz", old, arrays, run, more)
    assert "it lacks 'w.momentum_buffer', which this run needs" in line


# ---- resume=True and resume="auto" ---------------------------------------------------------


def test_resume_auto_starts_from_step_0_without_a_checkpoint(client, uninterrupted, tmp_path):
    result = fit(client, steps=STEPS, checkpoint_dir=tmp_path / "new", resume="auto")
    assert_same(result, uninterrupted)
    assert len(result.history["loss"]) == STEPS


@pytest.mark.parametrize("resume", [True, "auto"])
def test_resume_continues_bit_identically(client, uninterrupted, ckpt, resume):
    result = fit(client, steps=STEPS, checkpoint_dir=ckpt, checkpoint_every=EVERY, resume=resume)
    assert_same(result, uninterrupted)
    assert result.history["loss"] == uninterrupted.history["loss"][AT:]
    # the resumed run writes its checkpoints with the full meta too
    step, _, meta = checkpoint.load_latest(ckpt)
    assert step == STEPS
    assert meta["optimizer"] == {"kind": "AdamW", "states": ["exp_avg", "exp_avg_sq"]}
    assert meta["samples"] == N and meta["batch_size"] == BATCH and meta["seed"] == 11


# ---- the arguments -------------------------------------------------------------------------
