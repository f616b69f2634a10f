"""Pinned training results: the zoo's losses and weights after a few steps, bit for bit.

A refactoring of the pipeline (folders, kernel dispatch, the task-graph optimizer, the
training session) must not change a single bit of what training computes. The pins in
``pinned_losses.json`` were written by this file's ``--write`` mode on the commit named
in that file, before such a change; the test trains the same cases with the current code
and compares every step's loss (as ``float.hex``) and a digest of every trained tensor.

Bit-for-bit results depend on the machine (its CPU's vector width decides numba's and
BLAS's summation orders), so the pins carry the fingerprint of the machine that wrote
them. On a machine with the same fingerprint the test asserts exact equality; on any
other it asserts the losses within 1e-5 relative (float32 rounding of another summation
order) and says so in its output. Independently of the pins, it asserts that one worker
process (each step one task, ``dfdl.taskgraph.step_tasks``) and two worker processes
(one task per tile) train to the same bits, as dfdl's determinism invariant requires.

Regenerate (only on purpose, on a commit whose numbers are the reference)::

    python tests/models/test_pinned_losses.py --write
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np
import pytest

PINS = Path(__file__).with_name("pinned_losses.json")
STEPS = 3

#: case -> (zoo builder, builder kwargs, batch, optimizer (kind, kwargs), train kwargs)
CASES = {
    "mlp": ("mlp", dict(sizes=(64, 128, 128, 10)), 16, ("sgd", dict(lr=0.05, momentum=0.9)), {}),
    "mlp_uneven": (
        "mlp",
        dict(sizes=(64, 128, 128, 10)),
        16,
        ("adam", dict(lr=1e-3)),
        dict(tiles="uneven"),
    ),
    "resnet": (
        "resnet",
        dict(image_size=16, stem=16, stages=(16, 32), blocks_per_stage=1, num_classes=5),
        8,
        ("sgd", dict(lr=0.05, momentum=0.9)),
        {},
    ),
    "resnet_tiled_recompute": (
        "resnet",
        dict(image_size=16, stem=16, stages=(16, 32), blocks_per_stage=1, num_classes=5),
        8,
        ("sgd", dict(lr=0.05, momentum=0.9, weight_decay=1e-4)),
        dict(tiles={"batch": 2, "model": 2}, memory="recompute"),
    ),
    "unet3d": (
        "unet3d",
        dict(base=4, levels=3, volume=8),
        2,
        ("adam", dict(lr=1e-3)),
        {},
    ),
    "transformer": (
        "transformer",
        dict(vocab=50, d_model=32, heads=4, ff=64, layers=2, seq=8, num_classes=5),
        4,
        ("adamw", dict(lr=1e-3, weight_decay=1e-2)),
        {},
    ),
}
#: cluster shape -> (worker processes, threads per worker)
CLUSTERS = {"1x2": (1, 2), "2x1": (2, 1)}


def fingerprint() -> dict:
    """What decides float rounding on this machine: CPU, vector extensions, libraries."""
    import numba

    model = ""
    flags: set[str] = set()
    if os.path.exists("/proc/cpuinfo"):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    vector = [f for f in ("avx2", "fma", "avx512f", "avx512vl", "avx512_bf16") if f in flags]
    return {
        "machine": platform.machine(),
        "cpu": model,
        "vector": vector,
        "numpy": np.__version__,
        "numba": numba.__version__,
        "blas": os.environ.get("DFDL_BLAS", "auto"),
    }


def _data(name: str, kw: dict, batch: int) -> tuple[np.ndarray, np.ndarray]:
    from dfdl.models import example_inputs

    n = batch * STEPS
    (x,) = example_inputs(name, batch=n, seed=7, **kw).values()
    rng = np.random.default_rng(11)
    if name == "unet3d":
        y = rng.integers(0, 2, size=(n, *x.shape[2:]), dtype=np.int64)
    else:
        classes = kw["sizes"][-1] if name == "mlp" else kw["num_classes"]
        y = rng.integers(0, classes, size=n, dtype=np.int64)
    return x, y


def train_case(case: str, client) -> dict:
    """Per-step losses (hex) and a sha256 per trained tensor of one case."""
    import dfdl
    from dfdl.models import ZOO

    name, kw, batch, (kind, okw), extra = CASES[case]
    optimizer = {"sgd": dfdl.optim.SGD, "adam": dfdl.optim.Adam, "adamw": dfdl.optim.AdamW}[kind]
    x, y = _data(name, kw, batch)
    result = dfdl.train(
        ZOO[name](**kw),
        data=(x, y),
        loss="cross_entropy",
        optimizer=optimizer(**okw),
        batch_size=batch,
        epochs=1,
        shuffle=True,
        seed=3,
        client=client,
        progress=False,
        **extra,
    )
    digests = {
        k: hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()[:16]
        for k, v in sorted(result.params.items())
    }
    return {"loss": [float(v).hex() for v in result.history["loss"]], "params": digests}


def _cluster(shape: str):
    from distributed import Client

    import dfdl

    procs, threads = CLUSTERS[shape]
    cluster = dfdl.LocalCluster(procs, threads_per_worker=threads)
    return cluster, Client(cluster)


@pytest.fixture(scope="module", params=list(CLUSTERS))
def shaped_client(request):
    cluster, client = _cluster(request.param)
    try:
        yield request.param, client
    finally:
        client.close()
        cluster.close()


_RESULTS: dict[tuple[str, str], dict] = {}


@pytest.mark.parametrize("case", CASES)
def test_pinned(shaped_client, case):
    shape, client = shaped_client
    pins = json.loads(PINS.read_text())
    got = train_case(case, client)
    _RESULTS[(shape, case)] = got
    want = pins["cases"][case]
    if pins["fingerprint"] == fingerprint():
        assert got["loss"] == want["loss"], f"{case} on {shape}: losses changed"
        assert got["params"] == want["params"], f"{case} on {shape}: trained weights changed"
    else:
        print(f"pins were written on another machine ({pins['fingerprint']}): comparing "
              "losses within 1e-5 relative, not bits")  # fmt: skip
        np.testing.assert_allclose(
            [float.fromhex(v) for v in got["loss"]],
            [float.fromhex(v) for v in want["loss"]],
            rtol=1e-5,
        )
    other = [r for (s, c), r in _RESULTS.items() if c == case and s != shape]
    for r in other:  # one worker process and two give the same bits
        assert r == got, f"{case}: results differ between cluster shapes"


def write() -> None:
    import subprocess

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    cases: dict = {}
    for shape in CLUSTERS:
        cluster, client = _cluster(shape)
        with cluster, client:
            for case in CASES:
                got = train_case(case, client)
                if case in cases and cases[case] != got:
                    raise SystemExit(f"{case}: cluster shapes disagree; not writing pins")
                cases[case] = got
                print(shape, case, got["loss"])
    PINS.write_text(
        json.dumps(
            {"commit": commit, "fingerprint": fingerprint(), "steps": STEPS, "cases": cases},
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit(__doc__)
    write()
