"""``dfdl plan``, run as a real subprocess (``python -m dfdl``): the summary, the table
of tensors on request, and training steps planned as ``dfdl.train`` plans them."""

from __future__ import annotations

import os
import subprocess
import sys

import dask
import numpy as np
import onnx
import pytest

import dfdl
import dfdl.models
from dfdl.cli.common import parse_tiles
from dfdl.ir.onnx_io import to_ir
from dfdl.ops.registry import TensorType
from dfdl.plan.compile import Workers, compile_step
from dfdl.runtime.cluster import default_workers, worker_memory_config
from tests.cli.helpers import SIZES, dfdl_cli
from tests.ir.helpers import fill_model


def _table(out: str) -> dict[str, list[str]]:
    """The words of each non-empty line of ``out``, by its first word."""
    return {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}


@pytest.mark.parametrize("training", [False, True])
def test_plan_prints_the_tensors(work, training):
    args = ("plan", "mlp.onnx", "--batch-size", "16", "--workers", "2")
    step = ("--training", "--optimizer", "adamw") if training else ()
    r = dfdl_cli(*args, *step, cwd=work)
    assert r.returncode == 0, r.stderr
    assert "tasks" in r.stdout.splitlines()[1 if training else 0]
    r = dfdl_cli(*args, *step, "--tensors", cwd=work)
    assert r.returncode == 0, r.stderr
    table = _table(r.stdout)
    assert table["x"][1:3] == ["[16,", "8]"]
    for name in ("layers.0.weight", "layers.1.bias", "logits"):
        assert name in table
    assert ("labels" in table) == training
    assert ("layers.0.weight.exp_avg" in table) == training


@pytest.mark.parametrize("training", [False, True])
def test_the_summary_comes_last_and_the_tensors_on_request(work, training):
    """A training step's hundreds of tensors no longer push the summary off the screen:
    without --tensors there is no table; with it, the table comes first."""
    args = ("plan", "mlp.onnx", "--batch-size", "16", *(["--training"] if training else []))
    short = dfdl_cli(*args, cwd=work)
    full = dfdl_cli(*args, "--tensors", cwd=work)
    assert short.returncode == 0 and full.returncode == 0, (short.stderr, full.stderr)
    short_lines, full_lines = short.stdout.splitlines(), full.stdout.splitlines()
    assert not any(line.split()[:1] == ["tensor"] for line in short_lines)
    assert "layers.0.weight" not in short.stdout
    n = int(short_lines[-1].split()[0])
    assert short_lines[-1] == f"{n} tensors: --tensors lists each one's shape and tiles"
    # the table: a header, one row per tensor, a blank line; then the summary, in full
    assert full_lines[0].split() == ["tensor", "shape", "dtype", "tiles", "chunks"]
    assert full_lines[n + 1] == ""
    assert full_lines[n + 2 :] == short_lines[:-1]
    assert full_lines[-1].startswith("workers: ")


@pytest.mark.parametrize(
    ("flags", "memory"),
    [((), "spill"), (("--workers", "2", "--memory-limit", "1GiB"), "spill"), ((), "recompute")],
    ids=["embedded", "two-workers-1GiB", "recompute"],
)
def test_plan_training_is_the_plan_dfdl_train_makes(work, flags, memory):
    """The training step, its tiles, estimate and tensors are those of
    dfdl.plan.compile for the workers ``dfdl train`` would have; no name is cut."""
    model = dfdl.models.mlp((SIZES[0], *[64] * 8, SIZES[-1]))  # deep enough to recompute
    onnx.save(model, str(work / "deep8.onnx"))
    extra = ("--recompute",) if memory == "recompute" else ()
    r = dfdl_cli(
        "plan", "deep8.onnx", "--batch-size", "16", "--training", "--optimizer", "adam",
        "--tensors", *flags, *extra,
        cwd=work,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    # the subprocess has dfdl's default footprint, not tests/conftest.py's 0
    with dask.config.set({"dfdl.memory.worker-footprint": None}):
        if flags:
            workers = Workers(2, 2, 1, memory_limit=2**30, thresholds=worker_memory_config())
        else:
            cores = default_workers()
            workers = Workers(cores, 1, cores, thresholds=worker_memory_config())
        sp = compile_step(
            to_ir(model),
            {"x": TensorType((16, SIZES[0]), np.float32)},
            loss="cross_entropy",
            optimizer=dfdl.optim.Adam(lr=1e-3),
            labels=TensorType((16,), np.int64),
            memory=memory,
            workers=workers,
        )
        with dask.config.set(dict(workers.thresholds)):
            summary = sp.plan.summary(workers.processes, workers.threads, tensors=False)
    table = sp.plan.tensor_table()
    assert r.stdout.startswith(table + "\n\n")
    assert "\n" + summary + "\n" in r.stdout
    rows = table.splitlines()[1:]
    assert [row.split()[0] for row in rows] == list(sp.plan.chunks)
    long = [name for name in sp.plan.chunks if len(name) > 40]
    assert long, "the test needs a tensor name longer than the old 40-character column"
    for name in long:
        assert any(row.split()[0] == name for row in rows), name
    assert bool(sp.tg.recomputed) == (memory == "recompute")
    assert ("recompute: " in r.stdout) == (memory == "recompute")


def test_tiles_print_as_the_cli_takes_them(work):
    args = ("plan", "mlp.onnx", "--batch-size", "16")
    r = dfdl_cli(*args, "--tiles", "batch=2,model=1", cwd=work)
    assert r.returncode == 0, r.stderr
    head = r.stdout.splitlines()[0]
    assert head.endswith(", tiles batch=2,model=1"), head
    assert "{" not in r.stdout
    # what an automatic plan prints plans the same when given back
    auto = dfdl_cli(*args, "--training", cwd=work)
    tiles = auto.stdout.splitlines()[1].rpartition(" tiles ")[2]
    assert isinstance(parse_tiles(tiles), dict)
    again = dfdl_cli(*args, "--training", "--tiles", tiles, cwd=work)
    assert again.returncode == 0, again.stderr
    assert again.stdout == auto.stdout


def test_workers_default_to_the_embedded_cluster(work):
    """No --workers: one process with a thread per core, as dfdl train's embedded
    cluster, and the automatic tiles use every core; --workers N: N one-thread
    processes."""
    onnx.save(dfdl.models.mlp((8, 4096, 3)), str(work / "wide.onnx"))
    cores = len(os.sched_getaffinity(0))
    args = ("plan", "wide.onnx", "--batch-size", "64")
    default = dfdl_cli(*args, cwd=work)
    one = dfdl_cli(*args, "--workers", "1", cwd=work)
    two = dfdl_cli(*args, "--workers", "2", cwd=work)
    for r in (default, one, two):
        assert r.returncode == 0, r.stderr
    # 1 MiB activations: up to 4 batch tiles of at least 256 KiB, one per core
    assert f"tiles batch={min(cores, 4)},model=1" in default.stdout.splitlines()[0]
    assert "tiles batch=1,model=1" in one.stdout.splitlines()[0]
    assert "tiles batch=2,model=1" in two.stdout.splitlines()[0]
    assert f"workers: 1 process with {cores} thread(s), one per core" in default.stdout
    assert "(1 worker(s), no memory limit)" in default.stdout
    assert "workers: 2 process(es) with 1 thread each (--workers)" in two.stdout
    assert "(2 worker(s), no memory limit)" in two.stdout
    helptext = dfdl_cli("plan", "--help", cwd=work).stdout
    assert "N worker processes of one thread each" in " ".join(helptext.split())
    assert "one worker process with a thread per core" in " ".join(helptext.split())


def test_plan_under_a_memory_limit_names_it(work):
    r = dfdl_cli(
        "plan", "mlp.onnx", "--batch-size", "16", "--training", "--memory-limit", "1GiB",
        "--workers", "2",
        cwd=work,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "worker memory limit 1.0 GiB" in r.stdout
    # Dask's process thresholds are on by default: the worker's own footprint counts
    assert "with the worker process's own 224.0 MiB" in r.stdout


def test_a_limit_below_the_worker_footprint_names_the_smallest(work):
    r = dfdl_cli(
        "plan", "mlp.onnx", "--batch-size", "16", "--training", "--memory-limit", "256MiB",
        cwd=work,
    )  # fmt: skip
    assert r.returncode == 2
    assert "a worker process takes about 224.0 MiB of its own" in r.stderr
    assert "Give each worker at least 449.0 MiB" in r.stderr
    # with the footprint set to an idle worker's measured memory, 256 MiB plans
    env = {**os.environ, "DASK_DFDL__MEMORY__WORKER_FOOTPRINT": "64MiB"}
    r = dfdl_cli(
        "plan", "mlp.onnx", "--batch-size", "16", "--training", "--memory-limit", "256MiB",
        cwd=work, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


def test_plan_with_recompute_estimates_less_memory(work):
    onnx.save(dfdl.models.mlp((8, *[64] * 8, 3)), str(work / "deep.onnx"))
    common = ("plan", "deep.onnx", "--batch-size", "64", "--training", "--workers", "2")
    plain = dfdl_cli(*common, "--tensors", cwd=work)
    rc = dfdl_cli(*common, "--tensors", "--recompute", cwd=work)
    assert plain.returncode == 0 and rc.returncode == 0, (plain.stderr, rc.stderr)
    assert "recompute: 3 segment(s), 11 forward node(s) run again" in rc.stdout

    def working_set_kib(out: str) -> float:
        (line,) = [x for x in out.splitlines() if x.startswith("working set: ")]
        number, unit = line.split()[2:4]
        assert unit == "KiB", line
        return float(number)

    # activations are 64 x 64 float32 (16 KiB): some are no longer kept through the step
    saved = working_set_kib(plain.stdout) - working_set_kib(rc.stdout)
    assert saved > 0 and saved % 16 == 0
    assert "layers.0.recompute" in rc.stdout and "layers.0.recompute" not in plain.stdout


#: runs ``dfdl ARGS`` in this process and prints the growth of its peak resident memory
_PEAK_GROWTH = """
import resource, sys
from dfdl.cli import main
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
rc = main(sys.argv[1:])
print("peak growth KiB:", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
sys.exit(rc)
"""


def test_plan_of_a_huge_constant_of_shape_stays_small(tmp_path):
    """A tiny model with a 20000 x 20000 float32 ConstantOfShape (1.5 GiB): ``dfdl plan``
    used to fold it on the client, peaking at 1.7 GB. Past the folding cap it is a task of
    the plan now, so planning (inference and training) allocates nothing of its size, and
    a worker limit it cannot fit is refused naming the node."""
    onnx.save(fill_model(20000, classes=3), str(tmp_path / "fill.onnx"))
    base = ("plan", "fill.onnx", "--batch-size", "4")
    for extra in ((), ("--training",)):
        r = subprocess.run(
            [sys.executable, "-c", _PEAK_GROWTH, *base, *extra],
            cwd=tmp_path, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert "largest task: fill" in r.stdout
        growth_kib = int(r.stdout.split("peak growth KiB:")[1])
        assert growth_kib < 300 * 1024, r.stdout
    r = dfdl_cli(*base, "--training", "--memory-limit", "1GiB", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("dfdl: error: node 'fill' needs about")
    assert len(r.stderr.strip().splitlines()) == 1
