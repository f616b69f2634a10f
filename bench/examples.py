"""Benchmark: wall time of the runnable examples, as a user starts them.

    python bench/examples.py [--json out.json]

Runs ``examples/digits.py`` (default arguments) in a fresh interpreter and reports its
wall time, training time and test accuracy, with the machine's core count and load.
The acceptance target for issue 3 is under 180 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "digits.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    acc = float(re.search(r"test accuracy \([^)]*\): ([0-9.]+)", proc.stdout).group(1))
    train_s = float(re.search(r"in ([0-9.]+) s", proc.stdout).group(1))
    figures = {
        "example": "digits.py",
        "wall_s": round(wall, 1),
        "train_s": train_s,
        "test_accuracy": acc,
        "cores": os.cpu_count(),
        "load_before": load0,
        "load_after": os.getloadavg()[0],
    }
    print(f"{'example':12s} {'wall s':>8s} {'train s':>8s} {'accuracy':>9s}  target")
    print(f"{'digits.py':12s} {wall:8.1f} {train_s:8.1f} {acc:9.4f}  < 180 s, >= 0.97")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
