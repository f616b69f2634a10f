"""Write bench/reference/README.md: an index of the reference benchmark results there.

    python bench/reference_index.py [--check]

One table per kind of result (the benchmark that wrote it), one row per JSON file: its
date and tag (from the file name), the machine's figures the JSON records and its headline
numbers (dfdl against PyTorch, GFLOP/s, retention under a memory cap). The JSONs come from
several versions of the benchmarks, so every field is optional: a missing one shows as
"-", and a file of an unknown layout is listed with its top-level keys. ``--check`` exits
with status 1 when the README is not what this script would write.

Example:
    >>> text = render(Path("bench/reference"))  # doctest: +SKIP
    >>> text.startswith("# Reference benchmark results")  # doctest: +SKIP
    True
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATE = re.compile(r"(\d{4}-\d{2}-\d{2})(.*)$")


def get(data: Any, *keys: Any, default: Any = None) -> Any:
    """``data[k0][k1]...``, or ``default`` where a key or index is missing."""
    for key in keys:
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError):
            return default
    return data


def num(value: Any, fmt: str = "{:.0f}") -> str:
    """A number formatted with ``fmt``; "-" for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return "-"
    return fmt.format(value)


def date_and_tag(stem: str) -> tuple[str, str]:
    """``run-full-2cores-amd-2026-11-26i`` -> ``("2026-11-26", "i")``."""
    m = DATE.search(stem)
    if not m:
        return "-", ""
    return m.group(1), m.group(2).strip("-")


def kind_of(name: str, data: Any) -> str:
    """The benchmark that wrote a result, from its file name, else from its layout."""
    for prefix, kind in (
        ("scale-sim-measured", "scale-sim-measured"),
        ("scale-sim", "scale-sim"),
        ("run-full", "run-full"),
        ("conv-kernels", "conv-kernels"),
        ("blas", "blas"),
        ("beyond_memory", "beyond-memory"),
        ("beyond-memory", "beyond-memory"),
        ("tune-digits", "tune-digits"),
    ):
        if name.startswith(prefix):
            return kind
    if isinstance(data, dict):
        if "machine" in data and "results" in data:
            return "run-full"
        if "working_set_over_cap" in data:
            return "beyond-memory"
    return "other"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _run_full(name: str, data: dict) -> list[str]:
    machine = get(data, "machine", default={}) or {}
    ratios, steps = [], []
    for r in get(data, "results", default=[]) or []:
        w = get(r, "workload", default="?")
        ratios.append(f"{w} {num(get(r, 'dfdl_over_torch_samples_per_s'), '{:.2f}x')}")
        dfdl = get(r, "backends", "dfdl", "median_step_s")
        torch = get(r, "backends", "torch", "median_step_s")
        steps.append(f"{w} {num(dfdl, '{:.3f}')} / {num(torch, '{:.3f}')}")
    return [
        num(get(machine, "cores")),
        num(get(machine, "matmul_gflops")),
        str(get(machine, "dfdl_blas") or "-"),
        f"{num(get(data, 'args', 'steps'))} x {num(get(data, 'args', 'rounds'))}",
        ", ".join(ratios) or "-",
        ", ".join(steps) or "-",
    ]


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if isinstance(v, int | float) and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _conv_kernels(name: str, data: dict) -> list[str]:
    results = get(data, "results", default=[]) or []
    shapes = sorted({str(get(r, "shape", default="?")) for r in results})
    backends = sorted({str(get(r, "backend", default="?")) for r in results})
    by = {(get(r, "shape"), get(r, "backend")): get(r, "gflop_per_s", default={}) for r in results}
    ratios = []
    for direction in ("fwd", "dW", "dX"):
        pairs = []
        for shape in shapes:
            dfdl, torch = (get(by.get((shape, b)), direction) for b in ("auto", "torch"))
            if dfdl and torch:
                pairs.append(dfdl / torch)
        ratios.append(f"{direction} {num(_geomean(pairs), '{:.2f}x')}")
    return [
        num(get(data, "repeat")),
        str(get(data, "blas") or "-"),
        str(len(shapes)),
        ", ".join(backends) or "-",
        ", ".join(ratios),
    ]


def _blas(name: str, data: dict) -> list[str]:
    def rates(key: str) -> str:
        values = get(data, key, "gflops", default=[]) or []
        return ", ".join(num(v) for v in values) or "-"

    vendor = get(data, "numpy", "vendor") or get(data, "mkl", "vendor") or "-"
    shapes = ", ".join("x".join(map(str, s)) for s in get(data, "shapes", default=[]) or [])
    return [str(vendor), shapes or "-", rates("numpy"), rates("mkl"), str(get(data, "auto") or "-")]


def _beyond_memory(name: str, data: dict) -> list[str]:
    model = get(data, "model", default={}) or {}
    described = " ".join(
        f"{k}={v}" for k, v in model.items() if k in ("name", "base", "levels", "volume", "batch")
    )
    limit = get(data, "memory_limit")
    limit_text = num(limit / 2**20 if isinstance(limit, int | float) else None, "{:.0f} MiB")
    modes = []
    identical, restarts = [], 0
    for key in ("capped_spill", "capped_recompute", "capped_auto"):
        run = get(data, key)
        if not isinstance(run, dict):
            continue
        modes.append(f"{key.removeprefix('capped_')} {num(get(run, 'retention'), '{:.1%}')}")
        identical.append(get(run, "losses_bit_identical"))
        restarts += len(get(run, "restarted", default=[]) or [])
    bit = "-" if not identical else ("yes" if all(identical) else "no")
    return [
        described or "-",
        f"{num(get(data, 'workers'))} x {limit_text}",
        num(get(data, "working_set_over_cap"), "{:.1f}x"),
        str(get(data, "dask_process_thresholds", default="-")),
        ", ".join(modes) or "-",
        bit,
        str(restarts),
    ]


def _tune_digits(name: str, data: dict) -> list[str]:
    counts = get(data, "counts", default={}) or {}
    states = ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "-"
    return [
        num(get(data, "cores")),
        f"{num(get(data, 'trials'))} x {num(get(data, 'epochs'))}",
        states,
        f"{num(get(data, 'tune_s'), '{:.0f}')} / {num(get(data, 'sequential_s'), '{:.0f}')}",
        num(get(data, "ratio"), "{:.2f}"),
        num(get(data, "test_accuracy"), "{:.4f}"),
        f"{num(get(data, 'losses_equal_prefix'))}/{num(len(get(data, 'rows', default=[]) or []))}",
    ]


def _scale_sim(name: str, data: dict) -> list[str]:
    calib = get(data, "calibration", default=[]) or []
    direct = get(data, "design") == "direct"
    # the stage design: the error with the runs' own task times; the direct design
    # (no member times recorded in its runs): with the fitted durations
    errors = ", ".join(
        f"{get(r, 'workload')}/{get(r, 'workers')}"
        f" {num(100 * (get(r, 'error' if direct else 'error_real_durations') or 0), '{:+.0f}%')}"
        for r in calib
    )

    def eff(label: str) -> str:
        rows = get(data, "scaling", "resnet50", "strong", default=[]) or []
        hit = [r for r in rows if get(r, "n") == 64]
        return num(100 * get(hit, 0, label, "efficiency", default=math.nan), "{:.0f}%")

    what_if = eff("no_send_software") if direct else eff("what_if")
    return [
        get(data, "design", default="stages"),
        errors or "-",
        eff("ib100"),
        eff("eth25"),
        what_if,
    ]


def _scale_sim_measured(name: str, data: dict) -> list[str]:
    over = get(data, "overheads", default={}) or {}
    return [
        num(1e3 * (get(over, "task_s") or math.nan), "{:.2f}"),
        num(1e3 * (get(over, "rtt_s") or math.nan), "{:.2f}"),
        num(1e3 * (get(over, "fetch_s") or math.nan), "{:.2f}"),
        num((get(data, "bandwidth_bytes_s") or math.nan) / 1e6, "{:.0f}"),
        num(len(get(data, "task_records", default=[]) or [])),
    ]


def _other(name: str, data: Any) -> list[str]:
    keys = ", ".join(map(str, data)) if isinstance(data, dict) else type(data).__name__
    return [keys]


#: kind -> (title, the command that writes it, column names, row function)
KINDS: dict[str, tuple[str, str, list[str], Callable[[str, Any], list[str]]]] = {
    "run-full": (
        "Training against PyTorch",
        "python bench/run.py --full --steps 6 --warmup 1 --rounds 3 --json out.json",
        [
            "cores",
            "numpy matmul GFLOP/s",
            "dfdl BLAS",
            "steps x rounds",
            "dfdl/torch samples/s",
            "s/step dfdl / torch",
        ],
        _run_full,
    ),
    "conv-kernels": (
        "Convolution kernels, one thread",
        "python bench/conv_kernels.py --json out.json",
        ["best of", "BLAS", "shapes", "backends", "dfdl's choice (auto) / torch GFLOP/s, geomean"],
        _conv_kernels,
    ),
    "blas": (
        "Matrix products: MKL against numpy's BLAS",
        "python bench/blas.py --json out.json",
        ["CPU vendor", "shapes (M x K x N)", "numpy GFLOP/s", "MKL GFLOP/s", "auto picks"],
        _blas,
    ),
    "beyond-memory": (
        "Training beyond the workers' memory",
        "python bench/beyond_memory.py --json out.json ...",
        [
            "model",
            "workers x limit",
            "working set / limits",
            "process thresholds",
            "retention (capped / uncapped samples/s)",
            "losses bit-identical",
            "restarts",
        ],
        _beyond_memory,
    ),
    "tune-digits": (
        "Hyperparameter search (dfdl.tune) against the same trainings one after another",
        "python bench/tune_digits.py --json out.json",
        [
            "cores",
            "trials x epochs",
            "trials",
            "tune / sequential s",
            "wall ratio",
            "best's test accuracy",
            "trials with the sequential run's losses",
        ],
        _tune_digits,
    ),
    "scale-sim": (
        "Scaling past this machine, simulated",
        "python bench/scale_sim.py --from measured.json --json out.json",
        [
            "design",
            "calibration error (stages: the runs' own task times; direct: fitted durations),"
            " workload/processes",
            "ResNet-50 strong efficiency at 64, 100 Gb/s",
            "25 Gb/s",
            "what-if (stages: no scheduler in a step; direct: no message software)",
        ],
        _scale_sim,
    ),
    "scale-sim-measured": (
        "Measured here for the scaling simulation",
        "python bench/scale_sim.py --measure measured.json",
        ["scheduler ms/task", "round trip ms", "fetch ms", "loopback MB/s", "timed tile tasks"],
        _scale_sim_measured,
    ),
    "other": ("Other results", "", ["top-level keys"], _other),
}


def render(folder: Path) -> str:
    """The index of every ``*.json`` in ``folder``, as Markdown."""
    rows: dict[str, list[list[str]]] = {kind: [] for kind in KINDS}
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            rows["other"].append([f"[{path.name}]({path.name})", "-", "", f"unreadable: {e}"])
            continue
        name = path.name
        kind = kind_of(name, data)
        try:
            cells = KINDS[kind][3](path.name, data)
        except Exception as e:  # a layout this script does not know: list it, do not fail
            kind, cells = (
                "other",
                [f"unexpected layout ({type(e).__name__}): {_other(name, data)[0]}"],
            )
        date, tag = date_and_tag(path.stem)
        rows[kind].append([f"[{path.name}]({path.name})", date, tag or "-", *cells])
    out = [
        "# Reference benchmark results",
        "",
        "<!-- generated by bench/reference_index.py; do not edit -->",
        "",
        "The JSON files in this folder, as the benchmarks in `bench/` wrote them on the",
        "project's development machines (2-core VMs; see `docs/design/performance.md` for",
        "what each run measured and why). Regenerate this index with",
        "`python bench/reference_index.py` after adding a file. The tag is what follows the",
        "date in the file name (runs of one day in order: a, b, c...).",
        "",
    ]
    for kind, (title, command, columns, _) in KINDS.items():
        if not rows[kind]:
            continue
        n = len(rows[kind])
        out += [f"## {title} ({n} file{'s' if n != 1 else ''})", ""]
        if command:
            out += [f"Written by `{command}`.", ""]
        header = ["file", "date", "tag", *columns]
        out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows[kind]]
        out += [""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check``, compare) the index; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", type=Path, default=HERE / "reference")
    ap.add_argument("--check", action="store_true", help="fail if the README is out of date")
    args = ap.parse_args(argv)
    text = render(args.folder)
    readme = args.folder / "README.md"
    if args.check:
        current = readme.read_text() if readme.exists() else ""
        if current != text:
            print(f"{readme} is out of date: run python bench/reference_index.py")
            return 1
        return 0
    readme.write_text(text)
    print(f"wrote {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
