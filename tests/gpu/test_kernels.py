"""Every registry op's GPU tile function (its cupy kernel, or its CPU function on host
copies) against the op's numpy forward, with the case's float inputs on the device as a
step's intermediate values are: every per-op case (tests/ops) of the ops with a GPU
kernel, the first case of each other op (its CPU function is tested on all of them in
tests/ops)."""

from __future__ import annotations

import numpy as np
import pytest

from dfdl.ops import REGISTRY
from dfdl.ops.gpu.device import is_device_array, to_host
from tests.ops.test_registry import RUNNABLE, _present, assert_matches


def _on_device(case) -> list:
    import cupy

    return [
        cupy.asarray(x)
        if isinstance(x, np.ndarray) and x.ndim and x.dtype.kind == "f" and i not in case.consts
        else x
        for i, x in enumerate(case.inputs)
    ]


def _cases() -> list:
    seen: set[str] = set()
    out = []
    for c in RUNNABLE:
        if "gpu" in REGISTRY[c.key].kernels or c.key not in seen:
            out.append(c)
        seen.add(c.key)
    return out


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c.name())
def test_gpu_tile_function_matches_forward(case):
    op = REGISTRY[case.key]
    want = op.forward(*case.inputs, **case.attrs)
    fn = op.kernel("gpu")
    got = fn(*_present(_on_device(case)), **case.attrs)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for i in range(case.n_outputs):
        assert_matches(to_host(got[i]), np.asarray(want[i]), case, f"gpu output {i}")


@pytest.mark.parametrize(
    "case",
    [c for c in RUNNABLE if "gpu" in REGISTRY[c.key].kernels],
    ids=lambda c: c.name(),
)
def test_gpu_kernels_keep_values_on_the_device_and_repeat_bit_for_bit(case):
    fn = REGISTRY[case.key].kernel("gpu")
    if fn.accepts is not None and not fn.accepts(*_present(case.inputs), **case.attrs):
        pytest.skip("the kernel does not take this case (the CPU function does)")
    member = case.attrs.get("update")  # an UpdateGroup runs its member op's tile function
    if member and "gpu" not in REGISTRY[f"dfdl.{member}"].kernels:
        pytest.skip(f"{member} has no GPU kernel: the group runs its CPU function")
    inputs = _present(_on_device(case))
    first, again = fn(*inputs, **case.attrs), fn(*inputs, **case.attrs)
    first = first if isinstance(first, tuple) else (first,)
    again = again if isinstance(again, tuple) else (again,)
    for a, b in zip(first, again):
        assert is_device_array(a)
        np.testing.assert_array_equal(to_host(a), to_host(b))
