"""Every VJP rule against float64 central finite differences, through the tiled engine.

For each OpCase of a differentiable op, the loss is ``sum_k sum(out_k * r_k)`` with fixed
random ``r_k``; dfdl's autodiff builds the backward graph, whose tile tasks run (by
dask's synchronous scheduler, ``tests/ops/sync_run.py``) at the automatic tiling (and,
for each op's first :data:`UNEVEN_CASES_PER_OP` cases, at an uneven one); the gradient's
projections on random directions must equal central differences of the numpy forward
evaluated in float64.
A differentiable op without a VJP rule, or without a case that exercises it, fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from dfdl.ir.bind import bind
from dfdl.ir.onnx_io import to_ir
from dfdl.ops import REGISTRY
from dfdl.ops.registry import TensorType
from dfdl.plan.tiling import make_plan
from dfdl.training.autodiff import gradients
from tests.ops.sync_run import CORES, run_plan
from tests.ops.test_registry import CASES

DIRECTIONS = 3


def _float_inputs(case) -> list[int]:
    """Float inputs that are not plan-time parameters (a Resize's scales)."""
    params = REGISTRY[case.key].const_inputs
    return [
        i
        for i, x in enumerate(case.inputs)
        if x is not None
        and np.asarray(x).dtype.kind == "f"
        and np.asarray(x).size
        and i not in params
    ]


def _grad_cases():
    out = []
    for c in CASES:
        op = REGISTRY[c.key]
        if op.fold_only or not op.differentiable or not _float_inputs(c):
            continue
        if getattr(c, "no_grad", False):
            continue
        out.append(c)
    return out


GRAD_CASES = _grad_cases()
#: cases per op also checked at the uneven tiling (the first ones): there every case's
#: forward and backward kernels run in tests/ops/test_registry.py, and this file checks
#: the backward graph they compose (every case uneven took 478 of CI's 4372 test-seconds)
UNEVEN_CASES_PER_OP = 3


def _runs() -> list:
    """(tiles, case) of every case at the automatic tiling and the first
    :data:`UNEVEN_CASES_PER_OP` of each op at the uneven one."""
    seen: dict[str, int] = {}
    uneven = []
    for c in GRAD_CASES:
        seen[c.key] = seen.get(c.key, 0) + 1
        if seen[c.key] <= UNEVEN_CASES_PER_OP:
            uneven.append(("uneven", c))
    return [(None, c) for c in GRAD_CASES] + uneven


@pytest.mark.parametrize(
    "op", sorted(k for k, o in REGISTRY.items() if o.differentiable and not o.fold_only)
)
def test_every_differentiable_op_has_a_vjp_and_a_case(op):
    assert REGISTRY[op].vjp is not None, f"{op} is differentiable but has no VJP rule"
    assert any(c.key == op for c in GRAD_CASES), f"{op} has no case with float inputs"


def _loss_weights(case, outs) -> list[np.ndarray | None]:
    rng = np.random.default_rng(7)
    return [
        rng.uniform(-1, 1, size=np.shape(o)).astype(np.asarray(o).dtype)
        if np.asarray(o).dtype.kind == "f"
        else None
        for o in outs[: case.n_outputs]
    ]


def _objective(case, inputs, weights) -> float:
    outs = REGISTRY[case.key].forward(*inputs, **case.attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return float(
        sum(
            np.sum(np.asarray(o, dtype=np.float64) * w.astype(np.float64))
            for o, w in zip(outs, weights)
            if w is not None
        )
    )


@pytest.mark.parametrize(("tiles", "case"), _runs(), ids=[f"{t}-{c.name()}" for t, c in _runs()])
def test_vjp_matches_finite_differences(tiles, case):
    if REGISTRY[case.key].vjp is None:
        pytest.fail(f"{case.op} has no VJP rule")
    wrt_idx = _float_inputs(case)
    model = case.model()
    graph = to_ir(model)
    names = case.input_names()
    wrt = [names[i] for i in wrt_idx]
    feeds = case.feeds()
    for i in wrt_idx:  # float constants become inputs: they get gradients too
        if names[i] in graph.initializers:
            feeds[names[i]] = graph.initializers.pop(names[i])
            graph.inputs.append(names[i])
            graph.declared[names[i]] = (None, feeds[names[i]].dtype)
    types = {k: TensorType(np.shape(v), np.asarray(v).dtype) for k, v in feeds.items()}
    g = bind(graph, types)
    fwd_outs = REGISTRY[case.key].forward(*case.inputs, **case.attrs)
    fwd_outs = fwd_outs if isinstance(fwd_outs, tuple) else (fwd_outs,)
    weights = _loss_weights(case, fwd_outs)
    terms = []
    for k, w in enumerate(weights):
        if w is None:
            continue
        wname = f"lossweight{k}"
        g.initializers[wname] = w
        g.types[wname] = TensorType(w.shape, w.dtype)
        terms.append((g.outputs[k], wname))
    if not terms:
        pytest.skip("no float output")  # pragma: no cover (filtered above)
    from dfdl.training.autodiff import GradBuilder

    b = GradBuilder(g, phase="loss")
    parts = [b.op("ReduceSum", [b.op("Mul", [o, w])], {"keepdims": 0}) for o, w in terms]
    loss = b.add_all(parts)
    grads = gradients(g, loss, wrt)
    present = {w: n for w, n in grads.items() if n is not None}
    assert present, "the loss depends on no float input"
    g.outputs = list(present.values())
    g.prune()
    out = run_plan(make_plan(g, tiles, cores=CORES), feeds)

    rng = np.random.default_rng(11)
    base = [None if x is None else np.asarray(x) for x in case.inputs]
    for _ in range(DIRECTIONS):
        dirs = {i: rng.standard_normal(np.shape(base[i])) for i in wrt_idx}
        analytic = sum(
            float(np.sum(out[present[names[i]]].astype(np.float64) * dirs[i]))
            for i in wrt_idx
            if names[i] in present
        )
        scale = max(1.0, max(float(np.max(np.abs(base[i]))) for i in wrt_idx))
        eps = 1e-6 * scale
        plus = [
            x if i not in dirs else (x.astype(np.float64) + eps * dirs[i])
            for i, x in enumerate(base)
        ]
        minus = [
            x if i not in dirs else (x.astype(np.float64) - eps * dirs[i])
            for i, x in enumerate(base)
        ]
        numeric = (_objective(case, plus, weights) - _objective(case, minus, weights)) / (2 * eps)
        dtype = np.result_type(*[base[i].dtype for i in wrt_idx])
        rtol = 2e-3 if dtype == np.float32 else 1e-5
        if dtype == np.float16:
            rtol = 3e-2
        assert analytic == pytest.approx(numeric, rel=rtol, abs=rtol * 10), (
            f"directional derivative {analytic} != finite difference {numeric}"
        )
