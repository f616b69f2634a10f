"""Every registered op, checked case by case (cases come from ``tests/ops/cases_*.py``).

An op in the registry without a case fails ``test_every_op_has_cases``. The tiled runs
are planned as ``dfdl.run`` plans them and their tile tasks run in this process
(``tests/ops/sync_run.py``).
"""

from __future__ import annotations

import importlib
import pkgutil

import numpy as np
import pytest

import dfdl.ops.gpu  # noqa: F401  (its kernels' accept rules are checked on the cases too)
import tests.ops as cases_pkg
from dfdl.ops import REGISTRY
from dfdl.ops.registry import TensorType
from tests.ops.sync_run import run_model


def _load_cases():
    cases = []
    for mod in pkgutil.iter_modules(cases_pkg.__path__):
        if mod.name.startswith("cases_"):
            cases.extend(importlib.import_module(f"tests.ops.{mod.name}").CASES)
    return cases


CASES = _load_cases()
RUNNABLE = [c for c in CASES if not REGISTRY[c.key].fold_only]


def assert_matches(got, want, case, what):
    got = np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if want.dtype.kind in "fc":
        np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


@pytest.mark.parametrize("op", sorted(REGISTRY))
def test_every_op_has_cases(op):
    assert any(c.key == op for c in CASES), f"op {op} is registered but has no OpCase"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name())
def test_forward_matches_reference(case):
    op = REGISTRY[case.key]
    outs = op.forward(*case.inputs, **case.attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    want = case.expected()
    for i, w in enumerate(want):
        assert_matches(outs[i], w, case, f"output {i}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name())
def test_shape_rule_matches_forward(case):
    op = REGISTRY[case.key]
    types = [
        None if x is None else TensorType(np.shape(x), np.asarray(x).dtype) for x in case.inputs
    ]
    consts = [
        np.asarray(x) if (i in case.consts and x is not None) else None
        for i, x in enumerate(case.inputs)
    ]
    got = op.shape(types, consts, **case.attrs)
    outs = op.forward(*case.inputs, **case.attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    for i in range(case.n_outputs):
        assert got[i].shape == np.shape(outs[i]), f"output {i} shape"
        assert got[i].dtype == np.asarray(outs[i]).dtype, f"output {i} dtype"


@pytest.mark.parametrize("case", RUNNABLE, ids=lambda c: c.name())
@pytest.mark.parametrize("tiles", [None, "uneven"])
def test_tiled_run_matches_reference(case, tiles):
    got = run_model(case.model(), case.feeds(), tiles=tiles)
    want = case.expected()
    for i, w in enumerate(want):
        assert_matches(got[f"out{i}"], w, case, f"output {i} at tiles={tiles}")


def _present(inputs: list) -> list:
    """The inputs as a tile task passes them: trailing absent ones dropped."""
    inputs = list(inputs)
    while inputs and inputs[-1] is None:
        inputs.pop()
    return inputs


@pytest.mark.parametrize(
    "case", [c for c in CASES if "cpu" in REGISTRY[c.key].kernels], ids=lambda c: c.name()
)
def test_cpu_kernel_matches_forward(case):
    op = REGISTRY[case.key]
    want = op.forward(*case.inputs, **case.attrs)
    got = op.kernel("cpu")(*_present(case.inputs), **case.attrs)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for i in range(case.n_outputs):
        assert_matches(got[i], np.asarray(want[i]), case, f"cpu kernel output {i}")


@pytest.mark.parametrize("op", sorted(k for k, o in REGISTRY.items() if o.kernels))
def test_every_kernel_runs_on_some_case(op):
    """A kernel that accepts none of its op's cases would be checked by no test."""
    cases = [c for c in CASES if c.key == op]
    for device, k in REGISTRY[op].kernels.items():
        if k.accepts is not None:
            taken = [c for c in cases if k.accepts(*_present(c.inputs), **c.attrs)]
            assert taken, f"the {device} kernel of {op} accepts none of its cases"
