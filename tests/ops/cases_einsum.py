"""OpCases for Einsum (dfdl/ops/einsum.py): the equations exporters emit for attention,
dense and bilinear layers, and the notation's corners (implicit output, ellipsis
broadcast, diagonals, upper-case labels, spaces, scalars)."""

from __future__ import annotations

import numpy as np

from tests.ops.case import OpCase, rand

F64, I64 = np.float64, np.int64


def _case(equation: str, *shapes, id: str, dtype=np.float32, **kw) -> OpCase:
    inputs = [rand(*s, dtype=dtype, seed=k) for k, s in enumerate(shapes)]
    return OpCase("Einsum", inputs, {"equation": equation}, id=id, **kw)


def _einsum() -> list[OpCase]:
    ints = np.random.default_rng(0).integers(-5, 6, size=(5, 4)).astype(I64)
    return [
        # attention scores and context, heads before and after the sequence axis
        _case("bhqd,bhkd->bhqk", (2, 3, 5, 4), (2, 3, 7, 4), id="attn_scores"),
        _case("bhqk,bhkd->bhqd", (2, 3, 5, 7), (2, 3, 7, 4), id="attn_context"),
        _case("bqhd,bkhd->bhqk", (2, 5, 3, 4), (2, 7, 3, 4), id="attn_scores_bshd"),
        # dense and bilinear layers
        _case("bi,ij->bj", (5, 4), (4, 6), id="linear"),
        _case("...i,oi->...o", (5, 3, 4), (6, 4), id="linear_ellipsis"),
        _case("bn,anm,bm->ba", (5, 3), (4, 3, 6), (5, 6), id="bilinear"),
        # the notation's corners
        _case("ij->ji", (5, 7), id="transpose"),
        _case("ji", (5, 7), id="implicit_transpose"),
        _case("ij->i", (5, 7), id="row_sum"),
        _case("ii->i", (5, 5), id="diagonal"),
        _case("ii", (5, 5), id="trace"),
        _case("bii->bi", (3, 5, 5), id="batch_diagonal"),
        _case("i,i", (7,), (7,), id="inner"),
        _case("i,j->ij", (5,), (3,), id="outer"),
        _case("...ij,...jk->...ik", (5, 1, 3, 4), (6, 4, 2), id="ellipsis_broadcast"),
        _case("ij,ij->ij", (1, 4), (5, 4), id="label_broadcast"),
        _case("BIJ,BJK->BIK", (3, 5, 4), (3, 4, 6), id="upper_case"),
        _case("ij, jk -> ik", (5, 4), (4, 3), id="spaces"),
        _case(",ij->ij", (), (5, 3), id="scalar_operand"),
        _case("bij,bjk", (3, 5, 4), (3, 4, 6), id="implicit_bmm_f64", dtype=F64),
        OpCase("Einsum", [ints, ints.T.copy()], {"equation": "ij,jk->ik"}, id="i64"),
    ]


CASES = _einsum()
