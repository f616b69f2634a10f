"""ONNX's official backend node tests, run through dfdl.backend (planner + lowering +
Dask), once at the automatic tiling and once at a forced uneven tiling.

Selected: every node test whose graph uses only op types in dfdl's registry. The one
list of exclusions, each with its reason, is ``EXCLUDED`` below. Cases that are not
selected or are excluded are not collected at all (ONNX's ``BackendTest`` would make a
skipped test of each: thousands); the terminal summary (tests/conftest.py) prints how
many there are, and how many node tests ran and passed.
"""

from __future__ import annotations

import re
import warnings
from collections import Counter

import onnx.backend.test
from onnx.backend.test.loader import load_model_tests

import dfdl
from dfdl.ops import REGISTRY

#: node tests not expected to pass, by regular expression on the case name, with why
EXCLUDED = {
    # random ops: the expected outputs come from numpy's global RNG, which dfdl's
    # counter-based, tiling-invariant dropout mask deliberately does not reproduce
    r"^test_training_dropout(?!_zero_ratio)": "random mask from numpy's RNG",
    # element types dfdl's tiles do not carry (numpy-native types only)
    r"(?i)float8|float4|e4m3|e5m2|e8m0|int4|int2|bfloat16": (
        "8-/4-/2-bit float/int and bfloat16 element types are not supported"
    ),
    r"(?i)string": "string tensors are not supported",
    # Resize modes dfdl does not implement (nearest and linear are supported)
    r"^test_resize_.*cubic": "Resize mode 'cubic' is not supported (UnsupportedOpError)",
    # non-tensor graph inputs
    r"^test_identity_(opt|sequence)": "optional/sequence inputs are not supported",
    # float16 chain (Conv, Sigmoid, Mul) evaluated op by op: dfdl's float16 result differs
    # from the reference by one float16 ulp (1.4e-3 relative) at 2 of 64 elements
    r"^test_causal_conv_with_state_silu_fp16_expanded": "float16 rounding, 1 ulp",
}


def _selected_cases() -> list[str]:
    names = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    for case in cases:
        types = {n.op_type for n in case.model.graph.node}
        domains = {n.domain for n in case.model.graph.node} - {"", "ai.onnx"}
        opset = {o.domain: o.version for o in case.model.opset_import}.get("", 0)
        if domains or not types <= set(REGISTRY) or opset < 13:
            continue
        names.append(case.name)
    return names


SELECTED = _selected_cases()
_include = "^(" + "|".join(re.escape(n) for n in SELECTED) + ")_cpu$"


def _suite(backend):
    suite = onnx.backend.test.BackendTest(backend, __name__)
    suite.include(_include)
    for pattern in EXCLUDED:
        if pattern and EXCLUDED[pattern]:
            suite.exclude(pattern)
    return suite


#: per tiling, the cases left out: "not covered" (ops or opsets) and "excluded" (EXCLUDED)
LEFT_OUT: dict[str, Counter] = {}


def _collected(suite, tiling: str) -> dict:
    """The suite's test classes, each without the tests ``BackendTest`` would skip."""
    LEFT_OUT[tiling] = Counter()
    classes = suite.test_cases
    for cls in classes.values():
        for name in [n for n in vars(cls) if n.startswith("test_")]:
            why = getattr(getattr(cls, name), "__unittest_skip_why__", "")
            if why.startswith("no matched include"):
                LEFT_OUT[tiling]["not covered"] += 1
            elif why.startswith("matched exclude"):
                LEFT_OUT[tiling]["excluded"] += 1
            else:
                continue
            delattr(cls, name)
    return classes


for _tiling, _backend in (("default", dfdl.backend), ("uneven", dfdl.backend.with_tiles("uneven"))):
    globals().update(
        {f"{k}_{_tiling}": v for k, v in _collected(_suite(_backend), _tiling).items()}
    )
