"""The package's shape: the pipeline folders import downstream only, no module imports
itself back through others, no module-level on/off switches, and kernels that stay
kernels (registered by device, never importing the ops they implement).

Imports are read from the source (``ast``), so an import inside a function counts as
much as one at the top of a module: a cycle cannot hide in a function body.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import dfdl
from dfdl.ops import REGISTRY

ROOT = Path(dfdl.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """The dfdl modules (files) that module ``name`` imports anywhere in its source."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for a in node.names:
                full = f"{base}.{a.name}"
                targets.append(full if full in MODULES else base)
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t != name and t.split(".")[0] == "dfdl":
                out.add(t)
    return out


GRAPH = {m: _imports(m) for m in MODULES}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    assert _cycles() == []


def test_the_cycle_finder_finds_cycles():
    saved = dict(GRAPH)
    try:
        GRAPH["dfdl.ir.graph"] = GRAPH["dfdl.ir.graph"] | {"dfdl.ir.bind"}
        # the strongly connected set holds both (and every module on a path between them)
        assert any({"dfdl.ir.bind", "dfdl.ir.graph"} <= set(c) for c in _cycles())
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


#: what each stage's modules may import from the others: the pipeline reads top to
#: bottom (ir -> training -> plan -> taskgraph -> runtime); ops, errors and data are
#: shared below it
MAY_IMPORT = {
    "dfdl.ops": {"dfdl.ops", "dfdl.errors"},
    "dfdl.ir": {"dfdl.ir", "dfdl.ops", "dfdl.errors"},
    "dfdl.training": {"dfdl.training", "dfdl.ir", "dfdl.ops", "dfdl.errors"},
    "dfdl.plan": {"dfdl.plan", "dfdl.training", "dfdl.ir", "dfdl.ops", "dfdl.errors"},
    "dfdl.taskgraph": {"dfdl.taskgraph", "dfdl.plan", "dfdl.ops", "dfdl.errors"},
    "dfdl.data": {"dfdl.data", "dfdl.errors"},
}


def _stage(module: str) -> str:
    return ".".join(module.split(".")[:2])


@pytest.mark.parametrize("stage", sorted(MAY_IMPORT))
def test_stages_import_only_downstream(stage):
    allowed = MAY_IMPORT[stage]
    bad = {
        (m, t)
        for m, targets in GRAPH.items()
        if _stage(m) == stage
        for t in targets
        if _stage(t) not in allowed
    }
    assert not bad, f"{stage} reaches upstream: {sorted(bad)}"


def test_only_the_entry_points_import_the_command_line():
    importers = {
        m for m, targets in GRAPH.items() if any(t.startswith("dfdl.cli") for t in targets)
    }
    assert {m for m in importers if not m.startswith("dfdl.cli")} <= {"dfdl.__main__"}


def _registering(module: str) -> bool:
    """Whether a module registers ops (calls ``register``, as a decorator or not)."""
    return any(
        isinstance(n, ast.Call) and getattr(n.func, "id", None) == "register"
        for n in ast.walk(ast.parse(MODULES[module].read_text()))
    )


def test_kernel_modules_never_import_op_modules():
    kernels = [m for m in MODULES if m.startswith("dfdl.ops.cpu") or m.startswith("dfdl.ops.gpu")]
    assert len(kernels) > 5
    ops = {m for m in MODULES if m.startswith("dfdl.ops.") and _registering(m)}
    assert "dfdl.ops.conv" in ops and "dfdl.ops.elementwise" in ops
    bad = {(m, t) for m in kernels for t in GRAPH[m] if t in ops or t == "dfdl.ops"}
    assert not bad, sorted(bad)


KERNELS = [(key, device, k) for key, op in REGISTRY.items() for device, k in op.kernels.items()]


@pytest.mark.parametrize("key, device, kernel", KERNELS, ids=[f"{k}-{d}" for k, d, _ in KERNELS])
def test_kernels_take_resolved_parameters_without_defaults(key, device, kernel):
    """A kernel gets its op's parameters resolved (the op's ``params`` rule): it repeats
    no ONNX attribute with its default, and falls back through ``accepts``, not itself."""
    op = REGISTRY[key]
    params = inspect.signature(kernel.fn).parameters.values()
    defaults = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is not p.empty]
    assert not defaults, f"{key}'s {device} kernel repeats attribute defaults {defaults}"
    keywords = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    if keywords:
        assert op.params is not None, f"{key} has kernel parameters {keywords} but no params rule"
    # registered by the device's kernel package, not by the op's module
    assert kernel.fn.__module__.startswith(f"dfdl.ops.{device}."), kernel.fn.__module__


def test_no_module_level_switches():
    """Configuration is explicit (an options object or an argument), not a module-level
    True/False that code reads and tests flip."""
    found = []
    for name, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign | ast.AnnAssign):
                value = node.value
                if isinstance(value, ast.Constant) and isinstance(value.value, bool):
                    found.append(f"{name}:{node.lineno}")
    assert not found, found
