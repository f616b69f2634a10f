"""BLAS benchmark: one thread of numpy's BLAS against one thread of MKL (``dfdl[mkl]``)
on the matrix-product shapes of dfdl's workloads, as dfdl's workers run them.

Tells which library ``DFDL_BLAS`` should pick on this machine: ``auto`` takes MKL only
on Intel CPUs (:func:`dfdl.ops.cpu.blas.cpu_vendor`), since on AMD CPUs MKL runs a slow
generic path. Each library is timed in a fresh process of its own (MKL and PyTorch or
another MKL must not share one), best of ``--repeat`` calls per shape.

Usage:
    python bench/blas.py [--repeat 5] [--json out.json]

To compare against numpy's own kernels where the environment pins older ones (some
machines set ``OPENBLAS_CORETYPE``), unset the pin for that command alone:
``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/blas.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

#: (M, K, N): the MLP's dense layers, a ResNet im2col product, a transformer projection
SHAPES = [(1024, 4096, 4096), (1024, 576, 1024), (64, 576, 1024), (4096, 512, 2048)]

_CHILD = """
import json, sys, time
import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits
from dfdl.ops.cpu import blas
shapes, repeat = json.loads(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
out = {"backend": blas.backend(), "vendor": blas.cpu_vendor(),
       "numpy_blas": [(i.get("internal_api"), i.get("architecture")) for i in threadpool_info()],
       "gflops": []}
with threadpool_limits(1):
    for m, k, n in shapes:
        a = rng.random((m, k), dtype=np.float32)
        b = rng.random((k, n), dtype=np.float32)
        c = np.empty((m, n), np.float32)
        blas.matmul(a, b, c)
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            blas.matmul(a, b, c)
            best = min(best, time.perf_counter() - t0)
        out["gflops"].append(round(2 * m * k * n / best / 1e9, 1))
print(json.dumps(out))
"""


def measure(library: str, repeat: int) -> dict:
    """GFLOP/s of ``library`` (``"numpy"`` or ``"mkl"``) on :data:`SHAPES`, one thread,
    in a fresh process; ``{"error": ...}`` where it cannot run.

    Example:
        >>> measure("numpy", 1)["gflops"]  # doctest: +SKIP
        [248.1, 241.0, 158.2, 226.9]
    """
    env = {**os.environ, "DFDL_BLAS": library}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(SHAPES), str(repeat)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json")
    args = p.parse_args(argv)
    results = {lib: measure(lib, args.repeat) for lib in ("numpy", "mkl")}
    print(
        f"CPU vendor: {results['numpy'].get('vendor')}; numpy's BLAS: "
        f"{results['numpy'].get('numpy_blas')}; OPENBLAS_CORETYPE="
        f"{os.environ.get('OPENBLAS_CORETYPE', '(unset)')}"
    )
    print(f"{'M x K x N':>20} {'numpy GFLOP/s':>14} {'mkl GFLOP/s':>12}")
    for i, (m, k, n) in enumerate(SHAPES):
        row = [results[lib].get("gflops", [None] * len(SHAPES))[i] for lib in ("numpy", "mkl")]
        print(f"{f'{m} x {k} x {n}':>20} {row[0]!s:>14} {row[1]!s:>12}")
    for lib in ("numpy", "mkl"):
        if "error" in results[lib]:
            print(f"{lib}: {results[lib]['error']}")
    auto = subprocess.run(
        [sys.executable, "-c", "from dfdl.ops.cpu import blas; print(blas.backend())"],
        env={**os.environ, "DFDL_BLAS": "auto"},
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.strip()
    print(f"DFDL_BLAS=auto picks: {auto}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"shapes": SHAPES, "repeat": args.repeat, "auto": auto, **results}, f, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
