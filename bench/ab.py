"""A/B benchmark of one engine choice inside one cluster: alternating rounds of
``dfdl.train`` with arm A, then B, then B, then A, ...

Across separate benchmark runs the same code's step time varies by about ±5% on a small
machine, which hides most single changes. Here both arms share the embedded cluster,
the data and the warm caches, and alternate round by round, so slow drift hits both.

An arm is either

* a field of :class:`dfdl.EngineOptions` (``--option graph.gangs --b False``: the
  task-graph optimizer's choices, ``graph.rules.carry`` and the other fusion rules,
  ``freeze_heaps``), passed to ``dfdl.train(engine=...)``: the way the engine is
  configured; or
* ``--attribute``: a module attribute such as a kernel's numeric threshold
  (``dfdl.ops.cpu.conv_direct.MIN_CHANNELS``), set in the benchmark's process and on
  every worker before each round.

With ``--fresh`` every round starts a new embedded cluster instead (after two warm-up
steps), so the arms share no worker state; an attribute is then set before the cluster
starts, so settings read at start take effect too.

An A/A run (an arm B that changes nothing) measured ResNet's median step 0.533 against
0.571 s (4 fresh rounds each, 2026-11-26): differences smaller than that are noise here.

Step time is measured as in ``bench/run.py`` (the task stream's span over the steps
after the first, divided by their number); ``busy`` is the workers' task thread-seconds
per step. Prints each arm's median step, busy time, per-round steps and last loss (the
two arms' losses must agree: no engine choice changes a number).

Examples:
    python bench/ab.py resnet --option graph.rules.siblings --b False --steps 6 --fresh
    python bench/ab.py resnet --option graph.gangs --b False --base graph.step_tasks=False
    python bench/ab.py resnet --option graph.worker_tasks --b False --workers 2
    python bench/ab.py unet3d --attribute dfdl.ops.cpu.conv_direct.MIN_CHANNELS --b "10**9"
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from run import FULL, _step_span, make_data, train_streamed  # noqa: E402

import dfdl  # noqa: E402


def resolve(path: str):
    """``(owner, name)`` of a dotted attribute path: the longest importable module
    prefix, then attributes."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:-1]:
            owner = getattr(owner, p)
        return owner, parts[-1]
    raise SystemExit(f"cannot import a module from {path!r}")


def setter(path: str, expr: str | None):
    """A function that sets ``path`` to ``eval(expr)``, or (None) back to the value it
    had before the first such call in the process that runs it."""

    def run():
        owner, name = resolve(path)
        keep = f"_ab_original_{name}"
        if not hasattr(owner, keep):
            setattr(owner, keep, getattr(owner, name))
        value = getattr(owner, keep) if expr is None else eval(expr)  # noqa: S307
        setattr(owner, name, value)

    return run


def with_option(options, path: str, value):
    """``options`` (a frozen dataclass) with the field at dotted ``path`` set to ``value``.

    Example:
        >>> with_option(dfdl.EngineOptions(), "graph.gangs", False).graph.gangs
        False
    """
    head, _, rest = path.partition(".")
    if head not in {f.name for f in dataclasses.fields(options)}:
        raise SystemExit(f"{type(options).__name__} has no field {head!r}")
    if not rest:
        return dataclasses.replace(options, **{head: value})
    return dataclasses.replace(options, **{head: with_option(getattr(options, head), rest, value)})


def main() -> None:
    from distributed import Client

    from dfdl.models import ZOO
    from dfdl.runtime.cluster import local_cluster

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=sorted(FULL))
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--option", help="a field of dfdl.EngineOptions, e.g. graph.gangs")
    what.add_argument("--attribute", help="a module attribute, e.g. a kernel's threshold")
    parser.add_argument("--a", default=None, help="expression for arm A (default: unchanged)")
    parser.add_argument("--b", required=True, help="expression for arm B")
    parser.add_argument(
        "--base",
        action="append",
        default=[],
        metavar="FIELD=EXPR",
        help="engine option both arms share, e.g. graph.step_tasks=False (repeatable)",
    )
    parser.add_argument("--steps", type=int, default=4, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per arm")
    parser.add_argument(
        "--fresh", action="store_true", help="a new embedded cluster for every round"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes of the embedded cluster, one thread each (default: one"
        " process with a thread per core)",
    )
    args = parser.parse_args()

    kw, batch, kind, okw, _ = FULL[args.workload]
    model = ZOO[args.workload](**kw)
    x, y = make_data(args.workload, kw, batch * (args.steps + 2))

    base = dfdl.EngineOptions()
    for item in args.base:
        path, _, expr = item.partition("=")
        base = with_option(base, path, eval(expr))  # noqa: S307

    def engine(arm: str):
        expr = args.a if arm == "A" else args.b
        if args.option is None or expr is None:
            return base
        return with_option(base, args.option, eval(expr))  # noqa: S307

    def one_round(client, steps: int, arm: str) -> tuple[float, float, float]:
        result, records = train_streamed(
            client, model, x, y, batch, kind, okw, steps, engine=engine(arm)
        )
        span, busy = _step_span(records, 1, steps - 1)
        return span / (steps - 1), busy / (steps - 1), result.history["loss"][-1]

    def set_attribute(client, arm: str) -> None:
        if args.attribute is not None:
            set_arm = setter(args.attribute, args.a if arm == "A" else args.b)
            if client is not None:
                client.run(set_arm)
            set_arm()

    def timed(client, arm: str) -> tuple[float, float, float]:
        set_attribute(client, arm)
        if args.fresh:
            one_round(client, 2, arm)  # this cluster's warm-up, in the arm's setting
        return one_round(client, 1 + args.steps, arm)

    arms = [("A", "B") if r % 2 == 0 else ("B", "A") for r in range(args.rounds)]
    results: dict[str, list] = {"A": [], "B": []}
    if args.fresh:
        for arm in (a for pair in arms for a in pair):
            set_attribute(None, arm)  # before the cluster starts: settings read at start
            with local_cluster(args.workers) as cluster, Client(cluster) as client:
                results[arm].append(timed(client, arm))
    else:
        with local_cluster(args.workers) as cluster, Client(cluster) as client:
            one_round(client, 2, "A")  # warm the caches of both processes
            for arm in (a for pair in arms for a in pair):
                results[arm].append(timed(client, arm))
    for arm, rows in results.items():
        step = statistics.median(r[0] for r in rows)
        busy = statistics.median(r[1] for r in rows)
        rounds = ", ".join(f"{r[0]:.3f}" for r in rows)
        print(f"{args.workload} {arm}: median step {step:.3f} s, busy {busy:.3f} thread-s, "
              f"rounds [{rounds}], last loss {rows[-1][2]!r}")  # fmt: skip


if __name__ == "__main__":
    main()
