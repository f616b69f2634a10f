"""OpCases for layout ops (dfdl/ops/layout.py): Reshape, Flatten, Transpose, Squeeze,
Unsqueeze, Concat, Split, Slice, Expand, Gather, Tile, DepthToSpace, SpaceToDepth,
dfdl.SliceGrad, dfdl.GatherGrad."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from tests.ops.case import OpCase, rand

F64, I64 = np.float64, np.int64
INT_MAX = np.iinfo(np.int64).max


def _ints(*shape, dtype=I64, low=-9, high=10, seed=0):
    return np.random.default_rng(seed + sum(shape)).integers(low, high, size=shape).astype(dtype)


def _i(*v):
    return np.array(v, dtype=I64)


def _reshape() -> list[OpCase]:
    x = rand(5, 7, 4)
    R = "Reshape"
    return [
        OpCase(R, [x, _i(5, -1)], consts=(1,), id="merge_tail"),
        OpCase(R, [x, _i(35, 4)], consts=(1,), id="merge_head"),
        OpCase(R, [x, _i(0, 7, 2, 2)], consts=(1,), id="zero_copies"),
        OpCase(R, [x, _i(5, 7, 2, 2)], {"allowzero": 1}, consts=(1,), id="allowzero_nonzero"),
        OpCase(R, [x, _i(-1)], consts=(1,), id="flat"),
        OpCase(R, [x, _i(4, 5, 7)], consts=(1,), id="no_common"),
        OpCase(R, [x, _i(5, 1, 7, 4, 1)], consts=(1,), id="insert_ones"),
        OpCase(R, [_ints(5, 7), _i(7, 5)], consts=(1,), id="i64"),
        OpCase(R, [rand(5, 6, 7, dtype=F64), _i(5, 2, 3, 7)], consts=(1,), id="split_mid"),
        OpCase(R, [x, _i(0, 1, 0, -1)], consts=(1,), id="zero_and_infer"),
    ]


def _flatten() -> list[OpCase]:
    x = rand(5, 7, 4)
    cases = [OpCase("Flatten", [x], {"axis": a}, id=f"axis{a}") for a in (0, 1, 2, 3, -1, -2)]
    return cases + [
        OpCase("Flatten", [x], id="default"),
        OpCase("Flatten", [rand(5, 1, 7)], {"axis": 2}, id="unit_mid"),
        OpCase("Flatten", [_ints(5, 7, 2, 2)], {"axis": 1}, id="i64_4d"),
        OpCase("Flatten", [rand(7)], {"axis": 1}, id="1d_axis1"),
        OpCase("Flatten", [rand(7)], {"axis": 0}, id="1d_axis0"),
    ]


def _transpose() -> list[OpCase]:
    T = "Transpose"
    return [
        OpCase(T, [rand(5, 7, 4)], id="default"),
        OpCase(T, [rand(5, 7, 4)], {"perm": [0, 2, 1]}, id="021"),
        OpCase(T, [rand(5, 7, 4)], {"perm": [2, 0, 1]}, id="201"),
        OpCase(T, [rand(5, 7, 3, 2, dtype=F64)], {"perm": [0, 2, 3, 1]}, id="nchw_nhwc"),
        OpCase(T, [_ints(5, 7)], {"perm": [1, 0]}, id="i64_2d"),
        OpCase(T, [rand(5, 7)], {"perm": [0, 1]}, id="identity"),
    ]


def _squeeze() -> list[OpCase]:
    x = rand(5, 1, 7, 1)
    S, U = "Squeeze", "Unsqueeze"
    return [
        OpCase(S, [x, _i(1)], consts=(1,), id="axis1"),
        OpCase(S, [x, _i(-1, 1)], consts=(1,), id="neg_axes"),
        OpCase(S, [x], id="all_ones"),
        OpCase(S, [_ints(1, 5, 7), _i(0)], consts=(1,), id="i64_lead"),
        OpCase(S, [rand(1, 1)], id="to_scalar"),
        OpCase(U, [rand(5, 7), _i(0)], consts=(1,), id="axis0"),
        OpCase(U, [rand(5, 7), _i(1)], consts=(1,), id="axis1"),
        OpCase(U, [rand(5, 7), _i(-1)], consts=(1,), id="neg"),
        OpCase(U, [rand(5, 7), _i(0, 3)], consts=(1,), id="two"),
        OpCase(U, [rand(5, 7), _i(3, 0, 2)], consts=(1,), id="unsorted"),
        OpCase(U, [_ints(5, 7), _i(1, -1)], consts=(1,), id="i64"),
        OpCase(U, [np.array(2.5, np.float32), _i(0)], consts=(1,), id="scalar"),
    ]


def _concat() -> list[OpCase]:
    C = "Concat"
    a, b, c = rand(5, 3, 4), rand(5, 7, 4, seed=1), rand(5, 1, 4, seed=2)
    return [
        OpCase(C, [a, b, c], {"axis": 1}, id="axis1_three"),
        OpCase(C, [a, b, c], {"axis": -2}, id="neg_axis"),
        OpCase(C, [rand(5, 7), rand(2, 7, seed=1)], {"axis": 0}, id="batch"),
        OpCase(C, [rand(5, 7), rand(5, 2, seed=1)], {"axis": -1}, id="last"),
        OpCase(C, [_ints(5, 7), _ints(5, 3, seed=1)], {"axis": 1}, id="i64"),
        OpCase(C, [rand(5, 7)], {"axis": 0}, id="single"),
        OpCase(C, [_i(5, 7), _i(-1), _i(3)], {"axis": 0}, id="shape_vectors"),
    ]


def _split() -> list[OpCase]:
    S = "Split"
    x = rand(5, 7, 4)
    return [
        OpCase(S, [x], {"axis": 1, "num_outputs": 3}, n_outputs=3, id="num3_uneven"),
        OpCase(S, [x, _i(2, 5)], {"axis": 1}, n_outputs=2, consts=(1,), id="sizes"),
        OpCase(S, [x, _i(1, 4)], n_outputs=2, consts=(1,), id="axis0_sizes"),
        OpCase(S, [x], {"axis": -1, "num_outputs": 2}, n_outputs=2, id="neg_even"),
        OpCase(S, [x, _i(3, 1, 3)], {"axis": -2}, n_outputs=3, consts=(1,), id="three"),
        OpCase(S, [_ints(5, 7)], {"axis": 1, "num_outputs": 2}, n_outputs=2, id="i64"),
        OpCase(S, [rand(10, dtype=F64)], {"num_outputs": 4}, n_outputs=4, id="1d_f64"),
    ]


def _slice() -> list[OpCase]:
    S = "Slice"
    x = rand(5, 7, 4)
    return [
        OpCase(S, [x, _i(1), _i(4), _i(1)], consts=(1, 2, 3), id="axis1"),
        OpCase(S, [x, _i(-3), _i(-1), _i(1)], consts=(1, 2, 3), id="neg_bounds"),
        OpCase(S, [x, _i(-1), _i(-INT_MAX), _i(1), _i(-1)], consts=(1, 2, 3, 4), id="reverse"),
        OpCase(S, [x, _i(5), _i(0), _i(1), _i(-2)], consts=(1, 2, 3, 4), id="neg_step2"),
        OpCase(S, [x, _i(1, 0), _i(INT_MAX, 3), _i(0, 2)], consts=(1, 2, 3), id="int_max"),
        OpCase(S, [x, _i(0, 1), _i(3, 6)], consts=(1, 2), id="default_axes"),
        OpCase(S, [x, _i(0, 1), _i(2, 7), None, _i(1, 3)], consts=(1, 2, 4), id="no_axes_steps"),
        OpCase(S, [x, _i(-10), _i(100), _i(-1)], consts=(1, 2, 3), id="clamp_whole"),
        OpCase(S, [x, _i(10), _i(100), _i(1)], consts=(1, 2, 3), id="empty"),
        OpCase(S, [x, _i(1, 0), _i(6, 5), _i(-2, 0), _i(2, 2)], consts=(1, 2, 3, 4), id="two"),
        OpCase(S, [_ints(5, 7), _i(2), _i(5), _i(-1)], consts=(1, 2, 3), id="i64"),
        OpCase(S, [x, _i(0), _i(INT_MAX), _i(1)], consts=(1, 2, 3), id="full_axis"),
    ]


def _expand() -> list[OpCase]:
    E = "Expand"
    return [
        OpCase(E, [rand(7, 1), _i(5, 7, 4)], consts=(1,), id="add_lead"),
        OpCase(E, [rand(5, 1, 4), _i(7, 1)], consts=(1,), id="shape_ones"),
        OpCase(E, [rand(1, 4), _i(5, 1)], consts=(1,), id="bidirectional"),
        OpCase(E, [rand(5, 7), _i(5, 7)], consts=(1,), id="same"),
        OpCase(E, [np.array(1.5, np.float32), _i(5, 7)], consts=(1,), id="scalar"),
        OpCase(E, [_ints(7), _i(5, 1, 7)], consts=(1,), id="i64"),
    ]


def _gather() -> list[OpCase]:
    G = "Gather"
    idx = np.array([[0, -1, 3], [6, -7, 2], [1, 1, 5], [4, -2, 0], [3, 3, 3]], dtype=I64)
    return [
        OpCase(G, [rand(7, 4), idx], id="embedding"),
        OpCase(G, [rand(5, 7, 4), np.array([6, 0, -3], np.int32)], {"axis": 1}, id="axis1_i32"),
        OpCase(G, [rand(5, 7, 4), np.array(-2, I64)], {"axis": 1}, id="scalar_index"),
        OpCase(G, [rand(5, 7, 4, dtype=F64), idx[:, :2] % 4], {"axis": -1}, id="last_2d_idx"),
        OpCase(G, [_i(5, 7, 4), _i(0, 2)], id="shape_gather"),
        OpCase(G, [_i(5, 7, 4), np.array(1, I64)], id="shape_scalar"),
        OpCase(G, [_ints(5, 7), np.array(3, I64)], id="i64_scalar_axis0"),
    ]


def _tile() -> list[OpCase]:
    T = "Tile"
    return [
        OpCase(T, [rand(5, 3, 4), _i(1, 3, 1)], consts=(1,), id="axis1"),
        OpCase(T, [rand(5, 3, 4), _i(2, 1, 3)], consts=(1,), id="two_axes"),
        # size-1 axes repeated: tiled as broadcast axes (each tile repeats its element)
        OpCase(T, [rand(5, 1, 4), _i(1, 7, 1)], consts=(1,), id="unit_axis"),
        OpCase(T, [rand(1, 1), _i(5, 6)], consts=(1,), id="unit_both"),
        OpCase(T, [rand(5, 4), _i(1, 1)], consts=(1,), id="identity"),
        OpCase(T, [rand(5, 2), _i(0, 3)], consts=(1,), id="zero_repeat"),
        OpCase(T, [_ints(5, 3), _i(1, 4)], consts=(1,), id="i64"),
        OpCase(T, [rand(3, 1, 2, dtype=F64), _i(2, 5, 2)], consts=(1,), id="f64_mixed"),
    ]


def _depth_space() -> list[OpCase]:
    D, S = "DepthToSpace", "SpaceToDepth"
    cases = []
    for mode in ("DCR", "CRD"):
        m2 = {"blocksize": 2, "mode": mode}
        m3 = {"blocksize": 3, "mode": mode}
        cases += [
            OpCase(D, [rand(5, 12, 3, 4)], m2, id=f"{mode}_b2"),
            OpCase(D, [rand(3, 27, 2, 3, dtype=F64)], m3, id=f"{mode}_b3_f64"),
            # SpaceToDepth's mode attribute is new in opset 28
            OpCase(S, [rand(5, 3, 6, 8)], m2, opset=28, id=f"{mode}_b2"),
            OpCase(S, [rand(3, 2, 9, 6, dtype=F64)], m3, opset=28, id=f"{mode}_b3_f64"),
        ]
    return cases + [
        OpCase(D, [_ints(2, 8, 3, 3)], {"blocksize": 2}, id="default_mode_i64"),
        OpCase(S, [_ints(2, 3, 4, 6)], {"blocksize": 2}, id="default_mode_i64"),
        OpCase(D, [rand(5, 7, 3, 4)], {"blocksize": 1, "mode": "CRD"}, id="block1"),
    ]


def _slice_grad_ref(shape):
    """Reference SliceGrad: ONNX's own Slice, run on a grid of flat positions, says where
    each element of dY goes."""

    def ref(dy, starts, ends, axes=None, steps=None):
        params = [("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps)]
        inits = [
            helper.make_tensor(n, TensorProto.INT64, [len(v)], v)
            for n, v in params
            if v is not None
        ]
        names = ["x"] + [n if v is not None else "" for n, v in params]
        node = helper.make_node("Slice", names, ["y"])
        graph = helper.make_graph(
            [node],
            "s",
            [helper.make_tensor_value_info("x", TensorProto.INT64, shape)],
            [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
            inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        grid = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
        pos = ReferenceEvaluator(model).run(None, {"x": grid})[0]
        out = np.zeros(int(np.prod(shape)), dtype=dy.dtype)
        out[pos.reshape(-1)] = dy.reshape(-1)
        return [out.reshape(shape)]

    return ref


def _slice_grad() -> list[OpCase]:
    def case(shape, dy_shape, params, id, dtype=np.float32):
        inputs = [rand(*dy_shape, dtype=dtype), *params]
        consts = tuple(i + 1 for i, p in enumerate(params) if p is not None)
        return OpCase(
            "SliceGrad",
            inputs,
            {"shape": list(shape)},
            consts=consts,
            id=id,
            domain="dfdl",
            reference=_slice_grad_ref(shape),
        )

    x = (5, 7, 4)
    return [
        case(x, (5, 3, 4), [_i(1), _i(4), _i(1)], "axis1"),
        case(x, (5, 3, 4), [_i(5), _i(0), _i(1), _i(-2)], "neg_step2"),
        case(x, (5, 7, 4), [_i(-1), _i(-INT_MAX), _i(1), _i(-1)], "reverse"),
        case(x, (3, 3, 4), [_i(1, 0), _i(6, 5), _i(-2, 0), _i(2, 2)], "two"),
        case(x, (3, 5, 4), [_i(0, 1), _i(3, 6)], "default_axes"),
        case(x, (2, 2, 4), [_i(0, 1), _i(2, 7), None, _i(1, 3)], "no_axes_steps"),
        case(x, (5, 7, 4), [_i(0), _i(INT_MAX), _i(1)], "full_axis"),
        case((11,), (4,), [_i(2), _i(10), _i(0), _i(2)], "1d_f64", dtype=F64),
    ]


def _gather_grad_ref(dy, indices, *, axis, data_shape):
    """Reference GatherGrad: one python loop over the indices."""
    out = np.zeros(data_shape, dtype=dy.dtype)
    ax = axis % len(data_shape)
    pre = (slice(None),) * ax
    for k in np.ndindex(*np.shape(indices)):
        i = int(np.asarray(indices)[k]) % data_shape[ax]
        out[(*pre, i)] += dy[(*pre, *k)]
    return [out]


def _gather_grad() -> list[OpCase]:
    def case(dy, idx, axis, data_shape, id):
        attrs = {"axis": axis, "data_shape": list(data_shape)}
        return OpCase(
            "GatherGrad",
            [dy, idx],
            attrs,
            id=id,
            domain="dfdl",
            reference=lambda d, i: _gather_grad_ref(d, i, **attrs),
        )

    idx = np.array([[0, -1, 3], [6, -7, 2], [1, 1, 5], [4, -2, 0], [3, 3, 3]], dtype=I64)
    return [
        case(rand(5, 3, 4), idx, 0, (7, 4), "embedding"),
        case(rand(5, 3, 4), np.array([6, 0, -3], np.int32), 1, (5, 7, 4), "axis1_i32"),
        case(rand(5, 4), np.array(-2, I64), 1, (5, 7, 4), "scalar_index"),
        case(rand(5, 7, 5, 2, dtype=F64), idx[:, :2] % 4, -1, (5, 7, 4), "last_2d_idx_f64"),
        case(rand(5, 3, 7), np.full((5, 3), 2, I64), 0, (3, 7), "all_same_row"),
        case(rand(6, 1), np.array([1, 0, 1, 1, 0, 1], I64), 0, (2, 1), "repeats_1wide"),
    ]


CASES = [
    *_reshape(),
    *_flatten(),
    *_transpose(),
    *_squeeze(),
    *_concat(),
    *_split(),
    *_slice(),
    *_expand(),
    *_gather(),
    *_tile(),
    *_depth_space(),
    *_slice_grad(),
    *_gather_grad(),
]
