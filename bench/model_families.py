"""The model-family table: torchvision and transformers families, each torch exporter, in dfdl.

    python bench/model_families.py [--json out.json] [--docs] [KEY ...]

Runs every case of ``tests/models/test_families_*.py`` (the families of
``tests/models/families.py`` and the language-model loss forms, each exported by each
exporter: forward against onnxruntime, 3 SGD-momentum steps against PyTorch float32 and
float64) in one process on a local cluster of 2 single-thread worker processes, as the
tests do, and records per case: the figures, or the error and the ops the exported file
has that dfdl lacks; the wall time (export, onnxruntime, dfdl and PyTorch together).
``--json`` writes them (with the machine and the package versions); ``--docs`` rewrites
the tables of ``docs/user/models.md`` from them. ``--from-json FILE --docs`` rewrites the
tables from a saved run without running anything.

Example:
    python bench/model_families.py --json bench/reference/model-families-2cores-DATE.json --docs
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS_PAGE = ROOT / "docs" / "user" / "models.md"
BEGIN = "<!-- model-family tables: written by bench/model_families.py --docs; do not edit -->"
END = "<!-- end of the model-family tables -->"
CHECKS = ("forward", "train")


def run_case(fam, library, exporter: str, check: str, client) -> dict[str, Any]:
    """One case's record: ``status`` "pass", "fail" (figures outside the tolerance) or
    "error" (with ``error`` and ``missing_ops``), its figures and ``time_s``."""
    from tests.models import families as F

    t0 = time.perf_counter()
    rec: dict[str, Any] = {"xfail": F.xfail_reason(fam.key, exporter, check)}
    try:
        if check == "forward":
            fig = F.check_forward(fam.module(library), fam, exporter, client)
            ok = fig["error"] <= F.FORWARD_RTOL
        else:
            fig = F.check_training(fam.module(library), fam, exporter, client)
            ok = fig.pop("ok")
        rec.update(fig, status="pass" if ok else "fail")
    except Exception as e:  # a case's failure is a table entry
        rec["status"] = "error"
        rec["error"] = f"{type(e).__name__}: {e}"[:600]
        rec["traceback"] = traceback.format_exc(limit=-3)[-1500:]
        try:
            model = F.export(fam.module(library), fam.inputs(F.BATCH)[0], exporter)
            rec["missing_ops"] = F.missing_ops(model)
        except Exception as export_error:
            rec["missing_ops"] = None
            rec["export_error"] = f"{type(export_error).__name__}: {export_error}"[:300]
    rec["time_s"] = time.perf_counter() - t0
    return rec


def measure(keys: list[str]) -> dict[str, Any]:
    """Every case of the families and LM forms in ``keys`` (all if empty)."""
    import torch
    from distributed import Client, LocalCluster

    from tests.models import families as F
    from tests.models.conftest import import_torchvision

    libraries = {"torchvision": import_torchvision()}
    import transformers

    libraries["transformers"] = transformers
    groups = {"families": F.FAMILIES, "lm_forms": F.LM_FORMS}
    out: dict[str, Any] = {
        "machine": machine(),
        "versions": {
            "torch": torch.__version__,
            "torchvision": libraries["torchvision"].__version__,
            "transformers": transformers.__version__,
            "onnxruntime": _version("onnxruntime"),
            "onnxscript": _version("onnxscript"),
        },
        "settings": {
            "batch": F.BATCH,
            "steps": F.STEPS,
            "lr": F.LR,
            "lr_by_family": {k: f.lr for k, f in F.FAMILIES.items() if f.lr != F.LR},
            "momentum": F.MOMENTUM,
            "forward_rtol": F.FORWARD_RTOL,
            "loss_rtol": F.LOSS_RTOL,
            "torch_exact": F.TORCH_EXACT,
        },
    }
    t_all = time.perf_counter()
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        for group, fams in groups.items():
            checks = ("train",) if group == "lm_forms" else CHECKS
            out[group] = {}
            for key, fam in fams.items():
                if keys and key not in keys:
                    continue
                out[group][key] = {"title": fam.title, "library": fam.library}
                for exporter in F.EXPORTERS:
                    for check in checks:
                        rec = run_case(fam, libraries[fam.library], exporter, check, client)
                        out[group][key][f"{exporter}/{check}"] = rec
                        print(f"{key:14s} {exporter:15s} {check:8s} {summary(rec)}", flush=True)
    out["machine"]["load_after"] = os.getloadavg()[0]
    out["total_s"] = time.perf_counter() - t_all
    return out


def machine() -> dict[str, Any]:
    """Cores, CPU model, load, date and the repository's commit."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "load_before": os.getloadavg()[0],
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "python": platform.python_version(),
    }


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _e(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def summary(rec: dict[str, Any]) -> str:
    """One line of a case's outcome."""
    t = f"{rec['time_s']:.0f} s"
    if rec["status"] == "error":
        ops = rec.get("missing_ops")
        return f"error ({t}): {rec['error'][:200]}" + (f" missing ops {ops}" if ops else "")
    if "scale" in rec:
        return f"{rec['status']} ({t}): error {_e(rec['error'])} of scale {rec['scale']:.2g}"
    return (
        f"{rec['status']} ({t}): vs torch32 {_e(rec['error_vs_torch32'])}, vs float64 "
        f"{_e(rec['error_vs_torch64'])}, torch32 vs float64 {_e(rec['torch32_vs_torch64'])}"
    )


# ------------------------------------------------------------------------ the tables


def _reason(rec: dict[str, Any]) -> str:
    """Why a case fails, in a table cell: its XFAIL reason, the ops dfdl lacks, or the
    error."""
    if rec.get("xfail"):  # its first clause; the whole reason is in tests/models/families.py
        return f"expected: {rec['xfail'].split(':')[0]}"
    if rec["status"] == "fail":
        return "outside the tolerance"
    ops = rec.get("missing_ops")
    if ops:
        return "missing " + ", ".join(f"`{op}`" for op in ops)
    msg = rec["error"].split("\n")[0]
    return msg if len(msg) <= 140 else msg[:137] + "..."


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(data: dict[str, Any]) -> str:
    """The Markdown tables of a run (between :data:`BEGIN` and :data:`END`)."""
    m = data["machine"]
    v = data["versions"]
    lines = [
        BEGIN,
        "",
        f"Measured {m['date']} at commit {m['commit']} on {m['cores']} cores ({m['cpu']}; "
        f"load {m['load_before']:.1f} before, {m['load_after']:.1f} after), torch "
        f"{v['torch']}, torchvision {v['torchvision']}, transformers {v['transformers']}, "
        f"onnxruntime {v['onnxruntime']}: {data['total_s'] / 60:.1f} min for all cases in one "
        "process. Errors are relative: forward to the output's scale, losses per step (the "
        "largest of the 3 steps). A dash: the case did not run that far.",
        "",
        "| family | exporter | forward error | dfdl vs torch fp32 | dfdl vs fp64 "
        "| torch fp32 vs fp64 | result | time (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, fam in data["families"].items():
        for exporter in ("default", "optimize_false"):
            fwd, tr = fam.get(f"{exporter}/forward"), fam.get(f"{exporter}/train")
            if fwd is None or tr is None:
                continue
            problems = [
                f"{c}: {_reason(r)}"
                for c, r in (("forward", fwd), ("training", tr))
                if r["status"] != "pass"
            ]
            lines.append(
                f"| {fam['title']} (`{key}`) | {exporter} | {_e(fwd.get('error'))} "
                f"| {_e(tr.get('error_vs_torch32'))} | {_e(tr.get('error_vs_torch64'))} "
                f"| {_e(tr.get('torch32_vs_torch64'))} "
                f"| {_cell('; '.join(problems) or 'pass')} "
                f"| {fwd['time_s'] + tr['time_s']:.0f} |"
            )
    lines += [
        "",
        "The language model's loss over (batch x sequence) tokens, GPT-2 trained 3 steps:",
        "",
        "| form | exporter | dfdl vs torch fp32 | dfdl vs fp64 | torch fp32 vs fp64 "
        "| result | time (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, form in data.get("lm_forms", {}).items():
        for exporter in ("default", "optimize_false"):
            tr = form.get(f"{exporter}/train")
            if tr is None:
                continue
            result = "pass" if tr["status"] == "pass" else _reason(tr)
            lines.append(
                f"| {form['title']} (`{key}`) | {exporter} | {_e(tr.get('error_vs_torch32'))} "
                f"| {_e(tr.get('error_vs_torch64'))} | {_e(tr.get('torch32_vs_torch64'))} "
                f"| {_cell(result)} | {tr['time_s']:.0f} |"
            )
    lines += ["", END]
    return "\n".join(lines)


def write_docs(data: dict[str, Any], page: Path = DOCS_PAGE) -> None:
    """Replace the tables between :data:`BEGIN` and :data:`END` in ``page``."""
    text = page.read_text()
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    page.write_text(text[:start] + render(data) + text[stop:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("keys", nargs="*", help="families or LM forms to run (default: all)")
    ap.add_argument("--json", help="write the records here")
    ap.add_argument("--from-json", help="read the records of an earlier run instead")
    ap.add_argument("--docs", action="store_true", help=f"rewrite the tables of {DOCS_PAGE}")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
    else:
        data = measure(args.keys)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    if args.docs:
        write_docs(data)
    unexpected = [
        f"{key} {case}: {rec['status']}"
        + (f" (marked xfail: {rec['xfail']})" if rec["xfail"] else "")
        for group in ("families", "lm_forms")
        for key, fam in data.get(group, {}).items()
        for case, rec in fam.items()
        if isinstance(rec, dict) and (rec["status"] == "pass") == bool(rec["xfail"])
    ]
    if unexpected:
        print("cases whose outcome differs from their XFAIL mark:\n  " + "\n  ".join(unexpected))


if __name__ == "__main__":
    main()
