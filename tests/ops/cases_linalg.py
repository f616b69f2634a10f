"""OpCases for Gemm, MatMul, dfdl.MatMulGradB and dfdl.MatMulT (M, K, N of sizes >= 3
so that tiling is uneven)."""

from __future__ import annotations

import numpy as np

from tests.ops.case import OpCase, rand

M, K, N = 5, 7, 6


def _gemm_cases() -> list[OpCase]:
    cases = []
    for ta in (0, 1):
        for tb in (0, 1):
            a = rand(*((K, M) if ta else (M, K)), seed=1)
            b = rand(*((N, K) if tb else (K, N)), seed=2)
            c = rand(M, N, seed=3)
            attrs = {"transA": ta, "transB": tb, "alpha": 0.5, "beta": 2.0}
            cases.append(OpCase("Gemm", [a, b, c], attrs, id=f"trans{ta}{tb}"))
    a, b = rand(M, K, seed=4), rand(K, N, seed=5)
    for name, c in [
        ("c_scalar", np.array(1.5, np.float32)),
        ("c_one", rand(1, seed=6)),
        ("c_row", rand(N, seed=7)),
        ("c_row2d", rand(1, N, seed=8)),
        ("c_col", rand(M, 1, seed=9)),
        ("c_full", rand(M, N, seed=10)),
    ]:
        cases.append(OpCase("Gemm", [a, b, c], {"beta": 0.25}, id=name))
    cases += [
        OpCase("Gemm", [a, b], id="no_c"),
        OpCase("Gemm", [a, b, None], {"alpha": 3.0}, id="c_absent"),
        OpCase("Gemm", [a, b, rand(M, N, seed=11)], {"beta": 0.0}, id="beta0"),
        OpCase(
            "Gemm",
            [rand(K, M, dtype=np.float64), rand(N, K, dtype=np.float64), rand(N, dtype=np.float64)],
            {"transA": 1, "transB": 1, "alpha": -1.25},
            id="f64",
        ),
        OpCase(
            "Gemm",
            [
                np.arange(M * K, dtype=np.int32).reshape(M, K) % 5 - 2,
                np.arange(K * N, dtype=np.int32).reshape(K, N) % 7 - 3,
                np.arange(N, dtype=np.int32),
            ],
            id="int32",
        ),
        OpCase("Gemm", [a, b, rand(M, N, seed=12)], consts=(1, 2), id="const_weights"),
    ]
    return cases


def _matmul_cases() -> list[OpCase]:
    pairs = [
        ("2d", (M, K), (K, N)),
        ("1d_2d", (K,), (K, N)),
        ("2d_1d", (M, K), (K,)),
        ("1d_1d", (K,), (K,)),
        ("1d_3d", (K,), (3, K, N)),
        ("3d_1d", (3, M, K), (K,)),
        ("3d", (3, M, K), (3, K, N)),
        ("2d_3d", (M, K), (4, K, N)),
        ("bcast", (5, 1, 3, 4), (7, 4, 6)),
        ("bcast_both", (3, 1, M, K), (1, 4, K, N)),
    ]
    cases = [
        OpCase("MatMul", [rand(*sa, seed=1), rand(*sb, seed=2)], id=name) for name, sa, sb in pairs
    ]
    cases += [
        OpCase(
            "MatMul",
            [rand(3, M, K, dtype=np.float64), rand(K, N, dtype=np.float64)],
            rtol=1e-10,
            id="f64",
        ),
        OpCase(
            "MatMul",
            [
                np.arange(3 * M * K, dtype=np.int64).reshape(3, M, K) % 9 - 4,
                np.arange(K * N, dtype=np.int64).reshape(K, N) % 5 - 2,
            ],
            id="int64",
        ),
        OpCase(
            "MatMul",
            [rand(2, M, K, dtype=np.float16), rand(K, N, dtype=np.float16)],
            rtol=1e-2,
            atol=1e-2,
            id="f16",
        ),
        OpCase("MatMul", [rand(5, 3, K), rand(K, N)], consts=(1,), id="const_weight"),
    ]
    return cases


def _grad_b_reference(a, dy):
    # the batched product summed down: the graph dfdl.MatMulGradB replaces
    full = np.matmul(np.swapaxes(a, -1, -2), dy)
    return [full.reshape(-1, a.shape[-1], dy.shape[-1]).sum(0).astype(a.dtype)]


def _grad_b_cases() -> list[OpCase]:
    def case(sa, sb, dtype=np.float32, **kw):
        inputs = [rand(*sa, dtype=dtype, seed=1), rand(*sb, dtype=dtype, seed=2)]
        return OpCase("MatMulGradB", inputs, domain="dfdl", reference=_grad_b_reference, **kw)

    return [
        case((3, M, K), (3, M, N), id="3d"),
        case((3, 4, M, K), (3, 4, M, N), id="4d"),
        case((M, K), (M, N), id="2d"),
        case((4, M, K), (4, M, N), np.float64, rtol=1e-10, id="f64"),
    ]


def _swapped(x, flag):
    return np.swapaxes(x, -1, -2) if flag else x


def _matmul_t_cases() -> list[OpCase]:
    def case(sa, sb, ta, tb, dtype=np.float32, **kw):
        # the operands as stored: a transposed one has its last two axes swapped
        sa = (*sa[:-2], sa[-1], sa[-2]) if ta else sa
        sb = (*sb[:-2], sb[-1], sb[-2]) if tb else sb
        inputs = [rand(*sa, dtype=dtype, seed=1), rand(*sb, dtype=dtype, seed=2)]

        def reference(a, b):
            return [np.matmul(_swapped(a, ta), _swapped(b, tb)).astype(a.dtype)]

        attrs = {"transA": ta, "transB": tb}
        return OpCase("MatMulT", inputs, attrs, domain="dfdl", reference=reference, **kw)

    cases = []
    for ta in (0, 1):
        for tb in (0, 1):
            cases += [
                case((M, K), (K, N), ta, tb, id=f"2d_t{ta}{tb}"),
                case((3, M, K), (3, K, N), ta, tb, id=f"3d_t{ta}{tb}"),
                case((2, 3, M, K), (K, N), ta, tb, id=f"4d_2d_t{ta}{tb}"),
                case((M, K), (2, 3, K, N), ta, tb, id=f"2d_4d_t{ta}{tb}"),
            ]
    cases += [
        case((3, 1, M, K), (1, 4, K, N), 1, 0, id="bcast_tA"),
        case((M, K), (K,), 1, 0, id="2d_1d_tA"),
        case((K,), (3, K, N), 0, 1, id="1d_3d_tB"),
        case((4, M, K), (K, N), 1, 1, np.float64, rtol=1e-10, id="f64"),
        case((5, 3, K), (K, N), 0, 1, consts=(1,), id="const_weight"),
    ]
    return cases


CASES = _gemm_cases() + _matmul_cases() + _grad_b_cases() + _matmul_t_cases()
