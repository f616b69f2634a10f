"""Bad input, as one table per entry point: every case fails with one line naming the
problem before any task runs, and leaves nothing behind.

``CLI``: ``python -m dfdl ARGS`` exits with status 2 and prints one line, ``dfdl: error:
...``, holding the row's words; nothing on stdout. It runs in a process group of its own
and, for ``train``, with ``--scheduler`` pointing at a port nothing listens on: a check
made only after connecting would fail with "cannot connect to the scheduler" instead of
its own line. Afterwards the folder holds what it held before (no partial model,
checkpoint or temporary file) and no process of the group is left.

``PYTHON``: the call (``dfdl.train`` with bad data, loss, optimizer, validation or
checkpoint arguments) raises the row's :mod:`dfdl.errors` exception, one line holding the
row's words, on a real LocalCluster whose scheduler counts what reaches it
(``tests/scheduler_probe.py``): nothing does. The test's folder (with a copy of a real
checkpoint) is unchanged byte for byte and no process was started.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
import psutil
import pytest
from onnx import helper

import dfdl
import dfdl.models
from dfdl.errors import CheckpointError, ConfigError, DataError, DfdlError, ShapeError
from dfdl.runtime.session import TrainConfig
from dfdl.training.losses import LOSSES
from tests import scheduler_probe
from tests.cli.helpers import SIZES, N, write_work_files
from tests.ir.helpers import make_model, set_location, token_model, vi
from tests.scheduler_probe import scheduler_state

# ---- the command line ----------------------------------------------------------------------


class Cli(NamedTuple):
    """``python -m dfdl ARGV`` in the ``work`` folder: exit 2, one line with ``words``."""

    id: str
    argv: tuple[str, ...]
    words: tuple[str, ...]


def train(*args: str, words: str | tuple[str, ...], id: str) -> Cli:
    """A ``dfdl train`` row; ``-o o.onnx`` unless the row gives ``-o``."""
    argv = ("train", *args) if "-o" in args else ("train", *args, "-o", "o.onnx")
    return Cli(id, argv, (words,) if isinstance(words, str) else words)


def cmd(*args: str, words: str | tuple[str, ...], id: str) -> Cli:
    return Cli(id, args, (words,) if isinstance(words, str) else words)


GOOD = ("mlp.onnx", "--data", "data.npz")
CLI = [
    # models
    train("missing.onnx", "--data", "data.npz", words="missing.onnx", id="missing model"),
    cmd("info", "missing.onnx", words="missing.onnx does not exist", id="missing model (info)"),
    train("bad.onnx", "--data", "data.npz", words="bad.onnx", id="garbage model"),
    cmd("info", "bad.onnx", words=("bad.onnx", "truncated"), id="garbage model (info)"),
    train("unique.onnx", "--data", "data.npz", words="Unique", id="unsupported op"),
    cmd("plan", "unique.onnx", "--batch-size", "2", words="Unique", id="unsupported op (plan)"),
    train("escape.onnx", "--data", "data.npz", words="escape", id="external data outside"),
    cmd("plan", "mlp.onnx", words="give --batch-size N", id="symbolic batch, no --batch-size"),
    # data
    train("mlp.onnx", "--data", "missing.npz", words="missing.npz", id="missing data"),
    train("mlp.onnx", "--data", "bad.npz", words="bad.npz", id="garbage data"),
    train("mlp.onnx", "--data", "wide.npz", words="shape", id="too many features"),
    train("mlp.onnx", "--data", "classes.npz", words="out of range", id="labels out of range"),
    train("mlp.onnx", "--data", "short.npz", words="y has 21", id="fewer labels than samples"),
    train("mlp.onnx", "--data", "X.npy", words="labels", id="npy data without labels"),
    # flags and hyperparameters
    cmd("fit", "mlp.onnx", words="invalid choice: 'fit'", id="unknown command"),
    train(*GOOD, "--bogus", words="--bogus", id="unknown flag"),
    train("mlp.onnx", words="--data", id="missing flag"),
    train(*GOOD, "--batch-size", "0", words="batch_size", id="batch size 0"),
    train(*GOOD, "--epochs", "0", words="epochs", id="epochs 0"),
    train(*GOOD, "--lr", "fast", words="'fast'", id="lr not a number"),
    train(*GOOD, "--lr=-1", words="lr", id="negative lr"),
    train(*GOOD, "--lr", "nan", words="lr", id="nan lr"),
    train(*GOOD, "--loss", "hinge", words="hinge", id="unknown loss"),
    cmd(
        *("export-training-graph", "mlp.onnx", "-o", "t.onnx", "--loss", "hinge"),
        words=("hinge", "cross_entropy"),
        id="unknown loss (export)",
    ),
    train(*GOOD, "--tiles", "rows=3", words="rows", id="bad tiles"),
    cmd("plan", "mlp.onnx", "--tiles", "rows=3", words="rows=3", id="bad tiles (plan)"),
    train(*GOOD, "--memory", "x", words="--memory", id="bad memory mode"),
    cmd(
        *("plan", "mlp.onnx", "--batch-size", "4", "--memory-limit", "lots"),
        words=("--memory-limit", "'lots'"),
        id="bad memory limit",
    ),
    cmd(
        *("plan", "mlp.onnx", "--batch-size", "4", "--training", "--memory-limit", "16B"),
        words="leaves no room for tiles",
        id="memory limit too small",
    ),
    cmd(
        *("plan", "mlp.onnx", "--batch-size", "4", "--recompute"),
        words="--recompute needs --training",
        id="recompute without training",
    ),
    cmd(
        *("plan", "mlp.onnx", "--batch-size", "4", "--workers", "0"),
        words="--workers must be at least 1, not 0",
        id="no workers",
    ),
    # checkpoints
    train(
        *(*GOOD, "--checkpoint-dir", "c", "--checkpoint-every", "0"),
        words="--checkpoint-every",
        id="checkpoint every 0",
    ),
    train(
        *(*GOOD, "--checkpoint-dir", "empty", "--resume"),
        words="no checkpoint",
        id="resume without a checkpoint",
    ),
    train(
        *(*GOOD, "--checkpoint-dir", "mlp.onnx", "--resume"),
        words="mlp.onnx",
        id="checkpoint folder is a file",
    ),
    train(
        *(*GOOD, "--checkpoint-dir", "escape_ckpt", "--resume"),
        words="escape_ckpt/latest",
        id="latest pointer out of the folder",
    ),
    train(
        *(*GOOD, "--checkpoint-dir", "used_ckpt", "--checkpoint-every=1"),
        words="holds another run's checkpoints",
        id="a new run over another run's checkpoints",
    ),
    # outputs
    train(*GOOD, "-o", "no/o.onnx", words="no", id="output folder missing"),
    train(*GOOD, "-o", ".", words="folder", id="output is a folder"),
    train(*GOOD, "-o", "/proc/o.onnx", words="/proc", id="output under /proc"),
    train(*GOOD, "-o", "", words="-o", id="output empty"),
    cmd(
        "export-training-graph",
        "mlp.onnx",
        "-o",
        "",
        words="-o is empty",
        id="output empty (export)",
    ),
]

UNREACHABLE = ("--scheduler", "tcp://127.0.0.1:9")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The command-line tests' files (``tests/cli/helpers.py``) plus the bad ones here."""
    work = write_work_files(tmp_path_factory.mktemp("bad-input"))
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], N)
    np.savez(work / "wide.npz", X=np.concatenate([X, X[:, :1]], axis=1), y=y)
    np.savez(work / "classes.npz", X=X, y=np.full(N, SIZES[-1] + 4))
    np.savez(work / "short.npz", X=X, y=y[:-3])
    model = dfdl.models.mlp(SIZES, seed=1)
    onnx.save(
        model,
        str(work / "escape.onnx"),
        save_as_external_data=True,
        location="escape.data",
        size_threshold=0,
    )
    shell = onnx.load(str(work / "escape.onnx"), load_external_data=False)
    onnx.save(set_location(shell, "../escape.data"), str(work / "escape.onnx"))
    (work / "empty").mkdir()
    (work / "escape_ckpt").mkdir()
    (work / "escape_ckpt" / "latest").write_text("../data.npz")
    (work / "used_ckpt").mkdir()
    (work / "used_ckpt" / "step-000000004.npz").write_bytes(b"another run's")
    (work / "used_ckpt" / "latest").write_text("step-000000004.npz")
    return work


def _contents(d: Path) -> dict[str, bytes | None]:
    """Every path under ``d`` with its bytes (None for a folder)."""
    return {str(p.relative_to(d)): None if p.is_dir() else p.read_bytes() for p in d.rglob("*")}


@pytest.mark.parametrize("row", CLI, ids=[r.id for r in CLI])
def test_the_command_line_says_one_line_before_the_cluster_and_leaves_nothing(work, row):
    argv = [*row.argv, *UNREACHABLE] if row.argv[0] == "train" else list(row.argv)
    before = _contents(work)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dfdl", *argv],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, (out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dfdl: error: "), err
    assert "scheduler" not in lines[0], "checked only after reaching for the cluster"
    for word in row.words:
        assert word in lines[0], lines[0]
    assert out == ""
    assert _contents(work) == before
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)


# ---- Python --------------------------------------------------------------------------------


class Ctx(NamedTuple):
    """What a row's call gets: the probe cluster's client, a folder of its own and a copy
    of a real checkpoint folder in it (``ckpt``)."""

    client: object
    tmp: Path
    ckpt: Path


class Py(NamedTuple):
    """``call(ctx)`` raises ``exc`` whose one-line message holds ``words``; ``then(err,
    ctx)``, where given, checks more of the error; ``prepare(ctx)``, where given, makes
    the row's files first."""

    id: str
    call: Callable[[Ctx], object]
    exc: type[DfdlError]
    words: tuple[str, ...] = ()
    then: Callable[[Exception, Ctx], None] | None = None
    prepare: Callable[[Ctx], object] | None = None


#: the MLP most rows train: 4 features, 8 hidden, 3 classes, batch 4
MLP = (4, 8, 3)
#: the checkpoint rows' run: a 6-16-3 MLP, 24 samples, batch 8, seed 11, AdamW
CKPT_SIZES, CKPT_N, CKPT_BATCH = (6, 16, 3), 24, 8


def data(n: int = 16, features: int = MLP[0], classes: int = MLP[-1]):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, features)).astype(np.float32)
    y = rng.integers(0, classes, size=n, dtype=np.int64)
    return X, y


def labelled(at: int, label: int, n: int = 16):
    """``data(n)`` with label ``label`` at sample ``at``."""
    X, y = data(n)
    y[at] = label
    return X, y


def fit(ctx: Ctx, model=None, train_data=None, **kwargs):
    """``dfdl.train`` of the 4-8-3 MLP on ``data()``, batch 4, SGD."""
    kwargs.setdefault("optimizer", dfdl.optim.SGD(lr=0.1))
    model = dfdl.models.mlp(MLP) if model is None else model
    train_data = data() if train_data is None else train_data
    return dfdl.train(model, train_data, client=ctx.client, progress=False, batch_size=4, **kwargs)


def validate(validation, **kwargs) -> Callable[[Ctx], object]:
    """A row's call: :func:`fit` for 2 epochs with ``validation``."""
    return lambda ctx: fit(ctx, validation=validation, epochs=2, **kwargs)


def ckpt_data(n: int = CKPT_N):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, CKPT_SIZES[0])).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0.5)
    return X, y


def ckpt_fit(client, checkpoint_dir, model=None, train_data=None, **kwargs):
    """The checkpoint rows' run (6 steps) on ``checkpoint_dir``."""
    kwargs.setdefault("optimizer", dfdl.optim.AdamW(lr=0.01))
    kwargs.setdefault("batch_size", CKPT_BATCH)
    kwargs.setdefault("seed", 11)
    kwargs.setdefault("epochs", 2)
    model = dfdl.models.mlp(CKPT_SIZES, seed=3) if model is None else model
    train_data = ckpt_data() if train_data is None else train_data
    return dfdl.train(
        model, train_data, client=client, progress=False, checkpoint_dir=checkpoint_dir, **kwargs
    )


def resume(**kwargs) -> Callable[[Ctx], object]:
    """A row's call: the checkpoint rows' run resumed from ``ctx.ckpt``, a checkpoint
    every step (``kwargs`` change the run)."""
    kwargs.setdefault("resume", True)
    kwargs.setdefault("checkpoint_every", 1)
    folder = kwargs.pop("checkpoint_dir", None)
    return lambda ctx: ckpt_fit(
        ctx.client, ctx.ckpt if folder is None else folder(ctx), steps=6, **kwargs
    )


def latest(d: Path) -> Path:
    return d / (d / "latest").read_text()


def truncate_latest(ctx: Ctx) -> None:
    path = latest(ctx.ckpt)
    path.write_bytes(path.read_bytes()[:100])


def an_empty_folder(ctx: Ctx) -> None:
    (ctx.tmp / "empty").mkdir()


def a_file(ctx: Ctx) -> None:
    (ctx.tmp / "file").write_text("not a folder")


def relu_only() -> onnx.ModelProto:
    relu = helper.make_node("Relu", ["x"], ["logits"], name="relu")
    return make_model([relu], [vi("x", ["batch", 3])], [vi("logits", ["batch", 3])])


def one_voxel_labelled_2():
    y = np.zeros((4, 2, 2, 2), np.int64)
    y[3, 1, 0, 1] = 2
    return np.zeros((4, 1, 2, 2, 2), np.float32), y


def language_model_val():
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 7, (8, 5))
    y_val = rng.integers(0, 7, (6, 5))
    y_val[4, 2] = 7
    return (tokens, rng.integers(0, 7, (8, 5))), (tokens[:6], y_val)


def attributes(**expected) -> Callable[[Exception, Ctx], None]:
    def check(err, ctx):
        for name, value in expected.items():
            assert getattr(err, name) == value, (name, getattr(err, name))

    return check


def starts(prefix: str) -> Callable[[Exception, Ctx], None]:
    def check(err, ctx):
        assert str(err).startswith(prefix), str(err)

    return check


def written_with(err, ctx) -> None:
    assert str(err).startswith(f"checkpoint {latest(ctx.ckpt)} was written with "), str(err)
    assert str(err).endswith("or use another checkpoint_dir"), str(err)


def names_the_truncated_file(err, ctx) -> None:
    assert str(latest(ctx.ckpt)) in str(err)


ALL_FROZEN = [f"layers.{i}.{k}" for i in range(len(MLP) - 1) for k in ("weight", "bias")]
EVERY_LOSS = tuple(LOSSES)

PYTHON = [
    # training data
    Py(
        "label above the classes",
        lambda c: fit(c, train_data=labelled(11, 7)),
        DataError,
        ("label 7", "3 classes"),
    ),
    Py(
        "negative label",
        lambda c: fit(c, train_data=labelled(11, -1)),
        DataError,
        ("label -1", "3 classes"),
    ),
    Py(
        "label out of range in one voxel",
        lambda c: fit(
            c,
            model=dfdl.models.unet3d(base=2, levels=1, volume=2, num_classes=2),
            train_data=one_voxel_labelled_2(),
        ),
        DataError,
        ("label 2", "2 classes"),
    ),
    Py(
        "too many features",
        lambda c: fit(c, train_data=data(features=5)),
        ShapeError,
        ("'x'", "4"),
        attributes(name="x"),
    ),
    Py(
        "features of the wrong rank",
        lambda c: fit(c, train_data=(np.zeros((16, 2, 4), np.float32), data()[1])),
        ShapeError,
        ("'x'", "rank"),
        attributes(name="x"),
    ),
    Py(
        "fewer labels than samples",
        lambda c: fit(c, train_data=(data()[0], data()[1][:-3])),
        DataError,
        ("16", "13"),
    ),
    Py(
        "fewer samples than labels",
        lambda c: fit(c, train_data=(data()[0][:5], data()[1])),
        DataError,
        ("5", "16"),
    ),
    # loss, optimizer, parameters
    Py(
        "unknown loss",
        lambda c: fit(c, loss="crossentropy"),
        ConfigError,
        ("crossentropy", *EVERY_LOSS),
    ),
    Py("negative lr (SGD)", lambda c: dfdl.optim.SGD(lr=-0.1), ConfigError, ("lr", "-0.1")),
    Py("negative lr (Adam)", lambda c: dfdl.optim.Adam(lr=-0.1), ConfigError, ("lr", "-0.1")),
    Py("negative lr (AdamW)", lambda c: dfdl.optim.AdamW(lr=-0.1), ConfigError, ("lr", "-0.1")),
    Py(
        "a schedule reaching a negative lr",
        lambda c: fit(c, optimizer=dfdl.optim.SGD(lr=0.1, schedule=lambda s, b: b - 0.05 * s)),
        ConfigError,
        ("learning rate",),
    ),
    Py(
        "no trainable parameters",
        lambda c: fit(c, model=relu_only(), train_data=data(features=3)),
        ConfigError,
        ("no trainable parameters",),
    ),
    Py(
        "every parameter frozen",
        lambda c: fit(c, frozen=ALL_FROZEN),
        ConfigError,
        ("no trainable",),
    ),
    # validation data
    Py(
        "validation samples of another shape",
        validate(data(10, features=5)),
        ShapeError,
        ("validation X has shape (10, 5)", "(batch, 4)"),
        attributes(name="x", given=(10, 5)),
    ),
    Py(
        "validation samples of another rank",
        validate((np.zeros((10, 2, 4), np.float32), data(10)[1])),
        ShapeError,
        ("validation", "(10, 2, 4)", "'x' takes"),
    ),
    Py(
        "validation samples of another dtype",
        validate((data(10)[0].astype(np.float64), data(10)[1])),
        ShapeError,
        ("validation X has dtype float64", "takes float32", "astype('float32')"),
        attributes(expected=np.float32),
    ),
    Py(
        "fewer validation labels than samples",
        validate((data(10)[0], data(10)[1][:7])),
        DataError,
        ("validation", "10", "7"),
    ),
    Py(
        "no validation samples",
        validate((data(10)[0][:0], data(10)[1][:0])),
        DataError,
        ("validation", "no samples"),
    ),
    Py(
        "validation without labels",
        validate(data(10)[0]),
        DataError,
        ("validation", "needs labels", "(X_val, y_val)"),
    ),
    Py(
        "validation label above the classes",
        validate(labelled(8, 3, n=10)),
        DataError,
        ("validation y: label 3", "3 classes"),
    ),
    Py(
        "negative validation label",
        validate(labelled(8, -2, n=10)),
        DataError,
        ("validation", "label -2"),
    ),
    Py(
        "float validation labels",
        validate((data(10)[0], data(10)[1].astype(np.float32))),
        ShapeError,
        ("validation", "integer"),
    ),
    Py(
        "validation labels of another shape",
        validate((data(10)[0], np.zeros((10, 2), np.int64))),
        ShapeError,
        ("validation", "labels of shape [4, 2]"),
    ),
    Py(
        "validation label beyond a language model's vocabulary",
        lambda c: fit(
            c,
            model=token_model(),
            train_data=language_model_val()[0],
            validation=language_model_val()[1],
            epochs=2,
        ),
        DataError,
        ("validation y: label 7", "7 classes (valid labels 0..6)"),
    ),
    Py(
        "bad training and validation data: the training data first",
        validate(data(4), train_data=labelled(3, 9)),
        DataError,
        then=starts("label 9 is out of range"),
    ),
    # checkpoint arguments
    *(
        Py(
            f"checkpoint_every {every!r}",
            lambda c, every=every: ckpt_fit(c.client, c.tmp / "new", checkpoint_every=every),
            ConfigError,
            ("checkpoint_every must be a positive integer", repr(every)),
        )
        for every in (0, -2, 1.5, True, "2")
    ),
    *(
        Py(
            f"resume={value!r}",
            lambda c, value=value: ckpt_fit(c.client, c.tmp / "new", resume=value),
            ConfigError,
            ("resume must be True, False or 'auto'",),
        )
        for value in ("yes", 1.0)
    ),
    # dfdl.train takes None for "not given", as for every argument
    Py(
        "TrainConfig(resume=None)",
        lambda c: TrainConfig(checkpoint_dir=c.tmp / "new", resume=None),
        ConfigError,
        ("resume must be True, False or 'auto'",),
    ),
    Py(
        "resume='auto' without a folder",
        lambda c: ckpt_fit(c.client, None, resume="auto"),
        ConfigError,
        ("resume='auto' needs checkpoint_dir",),
    ),
    # checkpoint folders
    Py(
        "checkpoint folder is a file",
        lambda c: ckpt_fit(c.client, c.tmp / "file", steps=6, checkpoint_every=2),
        CheckpointError,
        ("file is a file, not a folder",),
        prepare=a_file,
    ),
    Py(
        "checkpoint folder under /proc",
        lambda c: ckpt_fit(c.client, Path("/proc/dfdl-ckpt"), steps=6, checkpoint_every=2),
        CheckpointError,
        ("/proc/dfdl-ckpt",),
    ),
    Py(
        "resume from an empty folder",
        resume(checkpoint_dir=lambda c: c.tmp / "empty"),
        CheckpointError,
        ("empty holds no checkpoint", "resume='auto'"),
        prepare=an_empty_folder,
    ),
    Py(
        "resume from a missing folder",
        resume(checkpoint_dir=lambda c: c.tmp / "missing"),
        CheckpointError,
        ("missing holds no checkpoint",),
    ),
    Py(
        "a new run over another run's checkpoints",
        lambda c: ckpt_fit(c.client, c.ckpt, steps=6, checkpoint_every=2),
        CheckpointError,
        ("holds another run's checkpoints", "latest step-000000004.npz", "resume"),
    ),
    Py(
        "resume from a truncated checkpoint",
        resume(),
        CheckpointError,
        ("truncated",),
        names_the_truncated_file,
        truncate_latest,
    ),
    Py(
        "resume='auto' from a truncated checkpoint",
        resume(resume="auto"),
        CheckpointError,
        ("truncated",),
        names_the_truncated_file,
        truncate_latest,
    ),
    # another run's checkpoint
    Py(
        "resume another model (deeper)",
        resume(model=dfdl.models.mlp((6, 16, 16, 3), seed=3)),
        CheckpointError,
        ("for another model", "it lacks 'layers.2.bias', 'layers.2.weight', which this run trains"),
    ),
    Py(
        "resume another model (wider)",
        resume(model=dfdl.models.mlp((6, 32, 3), seed=3)),
        CheckpointError,
        ("'layers.0.bias' of shape (16,) float32", "is (32,)"),
    ),
    Py(
        "resume with other frozen parameters",
        resume(frozen=["layers.0.weight"]),
        CheckpointError,
        ("for another model", "it holds 'layers.0.weight', which this run does not train"),
    ),
    Py(
        "resume with another optimizer",
        resume(optimizer=dfdl.optim.SGD(lr=0.1, momentum=0.9)),
        CheckpointError,
        (
            "with optimizer AdamW (state exp_avg, exp_avg_sq); this run has SGD (state "
            "momentum_buffer)",
            "(--optimizer adamw)",
        ),
    ),
    Py(
        "resume with another batch size",
        resume(batch_size=4),
        CheckpointError,
        ("batch_size 8; this run has 4: resume with batch_size=8 (--batch-size 8)",),
        written_with,
    ),
    Py(
        "resume with another seed",
        resume(seed=12),
        CheckpointError,
        ("seed 11; this run has 12: resume with seed=11 (--seed 11)",),
        written_with,
    ),
    Py(
        "resume with other data",
        resume(train_data=ckpt_data(32)),
        CheckpointError,
        ("samples 24; this run has 32",),
        written_with,
    ),
    Py(
        "resume without shuffling",
        resume(shuffle=False),
        CheckpointError,
        ("shuffle True; this run has False",),
        written_with,
    ),
    Py(
        "resume with another loss",
        resume(loss="mse", train_data=(ckpt_data()[0], np.zeros((CKPT_N, 3), "f4"))),
        CheckpointError,
        ("loss 'cross_entropy'",),
        written_with,
    ),
]

#: the probe cluster (counts submissions), overriding the session's client fixture
client = scheduler_probe.client
nothing_submitted = scheduler_probe.nothing_submitted


@pytest.fixture(scope="module")
def written(client, tmp_path_factory) -> Path:
    """A folder left by the checkpoint rows' run stopped after 4 steps, a checkpoint
    every 2."""
    ckpt = tmp_path_factory.mktemp("ckpt")
    ckpt_fit(client, ckpt, steps=4, checkpoint_every=2)
    return ckpt


@pytest.fixture
def ctx(client, written, tmp_path) -> Ctx:
    return Ctx(client, tmp_path, Path(shutil.copytree(written, tmp_path / "ckpt")))


def test_the_probe_sees_a_good_run(client):
    """Positive control: a good run does change every counter the Python rows compare."""
    before = scheduler_state(client)
    result = dfdl.train(dfdl.models.mlp(MLP), data(8), client=client, progress=False, batch_size=4)
    assert len(result.history["loss"]) == 2
    after = scheduler_state(client)
    assert after["update_graph"] > before["update_graph"]
    assert after["plugin_transitions"] > before["plugin_transitions"]
    assert after["transition_counter"] > before["transition_counter"]


@pytest.mark.usefixtures("nothing_submitted")
@pytest.mark.parametrize("row", PYTHON, ids=[r.id for r in PYTHON])
def test_python_raises_one_line_before_any_task_and_leaves_nothing(ctx, row):
    if row.prepare is not None:
        row.prepare(ctx)
    before = _contents(ctx.tmp)
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(row.exc) as info:
        row.call(ctx)
    err = info.value
    assert isinstance(err, DfdlError)
    message = str(err)
    assert message and "\n" not in message, message
    for word in row.words:
        assert word in message, f"{word!r} not in {message!r}"
    if row.then is not None:
        row.then(err, ctx)
    assert _contents(ctx.tmp) == before
    assert {p.pid for p in psutil.Process().children(recursive=True)} == children
