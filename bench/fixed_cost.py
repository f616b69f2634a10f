"""Fixed cost of a ``dfdl.train`` call on the embedded cluster: what a call costs beyond
its steps, for the first call of a process and for the calls after it.

In a fresh process: ``import dfdl``, then ``dfdl.train`` calls of the same MLP with no
client (the embedded cluster), alternating ``--short`` and ``--long`` steps. The first
call starts the embedded cluster (and compiles numba kernels with an empty cache); the
later ones reuse it. Per-step time is ``(long call - short call) / (long - short)``
averaged over the later pairs, and a call's fixed cost is its wall time minus its
steps at that rate. ``TrainResult.timings`` splits each call's client time into setup
(loading, planning, sending weights), graph building, submission and waiting.

Usage:
    python bench/fixed_cost.py [--rounds 3] [--short 2] [--long 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

t0 = time.perf_counter()
import dfdl  # noqa: E402
import dfdl.models  # noqa: E402

IMPORT_S = time.perf_counter() - t0


def one_call(model, x, y, steps: int) -> dict:
    t = time.perf_counter()
    result = dfdl.train(
        model,
        data=(x, y),
        optimizer=dfdl.optim.SGD(lr=0.01, momentum=0.9),
        batch_size=64,
        steps=steps,
        progress=False,
    )
    wall = time.perf_counter() - t
    return {"steps": steps, "wall_s": wall, **{k: v for k, v in result.timings.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="short/long pairs after the first")
    parser.add_argument("--short", type=int, default=2)
    parser.add_argument("--long", type=int, default=6)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    model = dfdl.models.mlp((784, 512, 512, 10))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64 * args.long, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=64 * args.long)
    first = one_call(model, x, y, args.short)
    pairs = [
        (one_call(model, x, y, args.short), one_call(model, x, y, args.long))
        for _ in range(args.rounds)
    ]
    per_step = statistics.median(
        (long["wall_s"] - short["wall_s"]) / (args.long - args.short) for short, long in pairs
    )
    later = [short["wall_s"] - args.short * per_step for short, _ in pairs]
    out = {
        "import_s": IMPORT_S,
        "per_step_s": per_step,
        "first_call": {**first, "fixed_s": first["wall_s"] - args.short * per_step},
        "later_fixed_s": later,
        "later_fixed_median_s": statistics.median(later),
        "later_calls": [short for short, _ in pairs],
    }
    print(f"import dfdl: {IMPORT_S:.2f} s; per step {per_step:.3f} s")
    print(
        f"first call ({args.short} steps): {first['wall_s']:.2f} s, fixed "
        f"{out['first_call']['fixed_s']:.2f} s (setup {first['setup_s']:.2f} s)"
    )
    for short in out["later_calls"]:
        parts = ", ".join(
            f"{k} {short[k]:.3f}" for k in ("setup_s", "graph_s", "submit_s", "wait_s")
        )
        print(f"later call ({args.short} steps): {short['wall_s']:.2f} s ({parts})")
    print(f"fixed cost per later call: median {out['later_fixed_median_s']:.2f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
