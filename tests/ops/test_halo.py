"""Spatial tiling with halos (dfdl.ops.halo and the ops that use it).

The window arithmetic is checked against brute force; every halo-tiled op is checked to
have 2-D and 3-D cases whose uneven plan really splits spatial axes (so the registry's
``test_tiled_run_matches_reference`` at ``tiles="uneven"`` covers halos), and a few
larger cases run at several slab counts against the untiled reference.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import dfdl
from dfdl.ops import REGISTRY, halo
from tests.ops.case import OpCase, rand
from tests.ops.cases_pool import _max_grad_case
from tests.ops.test_registry import CASES

#: ops whose spatial axes the planner splits into halo'd slabs (issue 5, scope 2)
HALO_OPS = (
    "Conv",
    "ConvTranspose",
    "MaxPool",
    "AveragePool",
    "Resize",
    "dfdl.ConvGradInput",
    "dfdl.ConvGradWeight",
    "dfdl.MaxPoolGrad",
)

GEOMETRIES = list(itertools.product((1, 2, 3, 5), (1, 2, 3), (0, 1, 2)))  # eff, stride, pad


@pytest.mark.parametrize(("eff", "stride", "pad"), GEOMETRIES)
def test_gather_window_is_what_the_outputs_read(eff, stride, pad):
    size = 11
    n_out = (size + 2 * pad - eff) // stride + 1
    for lo, hi in itertools.combinations(range(n_out + 1), 2):
        read = [o * stride - pad + j for o in range(lo, hi) for j in range(eff)]
        assert halo.gather_window(eff, stride, pad)(lo, hi) == (min(read), max(read) + 1)
        begin, end = halo.gather_pads(eff, stride, pad, size, lo, hi)
        assert begin == max(0, -min(read)) and end == max(0, max(read) + 1 - size)
        # the clipped slab plus those pads holds exactly hi - lo windows
        slab = min(size, max(read) + 1) - max(0, min(read))
        assert (slab + begin + end - eff) // stride + 1 == hi - lo


@pytest.mark.parametrize(("eff", "stride", "pad"), GEOMETRIES)
def test_scatter_window_holds_every_source_that_reaches_the_tile(eff, stride, pad):
    n_src = 7
    n_out = stride * (n_src - 1) + eff - 2 * pad
    x, w = np.arange(1.0, n_src + 1), np.arange(1.0, eff + 1) ** 2
    for lo, hi in itertools.combinations(range(n_out + 1), 2):
        start, stop = halo.scatter_window(eff, stride, pad, n_src)(lo, hi)
        reach = [i for i in range(n_src) for j in range(eff) if lo <= i * stride - pad + j < hi]
        assert 0 <= start < stop <= n_src
        assert all(start <= i < stop for i in reach)
        begin, end = halo.scatter_pads(eff, stride, pad, n_src, lo, hi)
        assert begin >= 0
        # scattering the slab with these pads gives exactly hi - lo outputs, and they are
        # the whole scatter's outputs lo..hi-1
        assert stride * (stop - start - 1) + eff - begin - end == hi - lo
        np.testing.assert_array_equal(
            _scatter(x[start:stop], w, stride, begin, hi - lo),
            _scatter(x, w, stride, pad, n_out)[lo:hi],
        )


def _scatter(x, w, stride, pad, n_out):
    """1-D transposed convolution written as loops: x[i] * w[j] lands on i*s - pad + j."""
    y = np.zeros(n_out)
    for i, j in itertools.product(range(len(x)), range(len(w))):
        if 0 <= i * stride - pad + j < n_out:
            y[i * stride - pad + j] += x[i] * w[j]
    return y


def _splits_space(case: OpCase) -> bool:
    node = dfdl.plan(case.model(), tiles="uneven").nodes[0]
    return bool(node.spec.spatial) and any(len(node.letters[ch]) > 1 for ch in node.spec.spatial)


@pytest.mark.parametrize("op", HALO_OPS)
@pytest.mark.parametrize("nd", [2, 3])
def test_uneven_cases_split_spatial_axes(op, nd):
    """The registry's uneven-tiling runs include halo'd slabs of this op in nd-D."""
    cases = [c for c in CASES if c.key == op and np.ndim(c.inputs[0]) == nd + 2]
    assert any(_splits_space(c) for c in cases), f"no {nd}-D case of {op} splits space"


def _conv_case(**attrs) -> OpCase:
    return OpCase("Conv", [rand(2, 3, 13, 11, 9), rand(4, 3, 3, 3, 3), rand(4)], attrs)


LARGER = [
    _conv_case(pads=[1] * 6),
    _conv_case(strides=[2, 2, 2], pads=[1, 0, 1, 1, 0, 1]),
    _conv_case(dilations=[2, 1, 2], auto_pad="SAME_UPPER"),
    OpCase(
        "ConvTranspose",
        [rand(2, 3, 7, 6, 5), rand(3, 4, 2, 2, 2)],
        {"strides": [2, 2, 2]},
    ),
    OpCase(
        "ConvTranspose",
        [rand(1, 2, 6, 7), rand(2, 3, 3, 3)],
        {"strides": [2, 3], "pads": [1, 0, 0, 1], "output_padding": [1, 1]},
    ),
    OpCase("MaxPool", [rand(2, 3, 13, 10, 9)], {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}),
    OpCase(
        "MaxPool",
        [rand(1, 2, 17, 12)],
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    ),
    _max_grad_case(
        rand(2, 3, 13, 10, 9), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}, "3d", seed=1
    ),
    _max_grad_case(  # overlapping windows, ceil mode and many ties
        np.round(rand(1, 2, 17, 12)),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
        "2d_ties",
    ),
    OpCase(
        "AveragePool",
        [rand(1, 2, 15, 11)],
        {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "count_include_pad": 1},
    ),
    OpCase(
        "Resize",
        [rand(1, 2, 7, 6, 5), None, np.array([1, 1, 2, 2, 2], np.float32)],
        {"mode": "linear"},
        consts=(1, 2),
    ),
    OpCase(
        "Resize",
        [rand(1, 2, 9, 8), None, np.array([1, 1, 0.5, 1.5], np.float32)],
        {"mode": "nearest", "coordinate_transformation_mode": "asymmetric"},
        consts=(1, 2),
    ),
]


@pytest.mark.parametrize("case", LARGER, ids=lambda c: c.name())
@pytest.mark.parametrize("slabs", [2, 3, 5])
def test_slab_tiling_matches_untiled(case, slabs, client):
    model = case.model()
    plan = dfdl.plan(model, tiles={"space": slabs})
    node = plan.nodes[0]
    assert len(node.letters[node.spec.spatial[0]]) == min(
        slabs, plan.graph.types[node.node.outputs[0]].shape[2]
    )
    got = dfdl.run(model, case.feeds(), client=client, tiles={"space": slabs})["out0"]
    want = REGISTRY[case.key].kernel("cpu")(*case.inputs, **case.attrs)
    want = want[0] if isinstance(want, tuple) else want
    if case.key == "Conv":
        # a slab is a GEMM with fewer columns: BLAS may round differently, nothing more
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=0, atol=8 * np.finfo(np.float32).eps * scale)
    else:  # the same terms in the same order: bit for bit
        np.testing.assert_array_equal(got, want)
    ref = REGISTRY[case.key].forward(*case.inputs, **case.attrs)
    ref = ref[0] if isinstance(ref, tuple) else ref
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
