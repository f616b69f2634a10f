"""OpCases for indexing ops (dfdl/ops/indexing.py): GatherElements, GatherND,
ScatterElements, ScatterND, dfdl.GatherElementsGrad, dfdl.GatherNDGrad,
dfdl.ScatterElementsGrad, dfdl.ScatterNDGrad.

The references of the dfdl-domain ops (and of GatherElements where the indices are
smaller than the data off the axis, which onnx's ReferenceEvaluator refuses) are plain
python loops over the index positions."""

from __future__ import annotations

import numpy as np

from tests.ops.case import OpCase, rand

F64, I32, I64 = np.float64, np.int32, np.int64


def _idx(shape, n, seed=0, dtype=I64, negative=True):
    """Random indices in [-n, n) (or [0, n))."""
    low = -n if negative else 0
    return np.random.default_rng(seed).integers(low, n, size=shape).astype(dtype)


def _unique_along(shape, axis, n, seed=0, dtype=I64):
    """Indices without repeats along ``axis`` (each line a partial permutation of n),
    some of them negative."""
    rng = np.random.default_rng(seed)
    moved = list(shape)
    m = moved.pop(axis)
    lines = [rng.permutation(n)[:m] for _ in range(int(np.prod(moved)))]
    out = np.moveaxis(np.array(lines).reshape(*moved, m), -1, axis)
    out = np.where(rng.random(out.shape) < 0.3, out - n, out)
    return out.astype(dtype)


def _unique_tuples(count, dims, seed=0, dtype=I64):
    """``count`` distinct index tuples into ``dims``, some components negative."""
    rng = np.random.default_rng(seed)
    flat = rng.permutation(int(np.prod(dims)))[:count]
    out = np.stack(np.unravel_index(flat, dims), axis=-1)
    out = np.where(rng.random(out.shape) < 0.3, out - np.array(dims), out)
    return out.astype(dtype)


def _positions(indices, axis):
    """(index position, wrapped position in data) for each element of ``indices``."""
    for k in np.ndindex(*indices.shape):
        yield k, k[:axis] + (int(indices[k]),) + k[axis + 1 :]


def _wrap(pos, shape):
    return tuple(p % n for p, n in zip(pos, shape, strict=False))


def _gather_elements_ref(axis):
    def ref(data, indices):
        out = np.empty(indices.shape, data.dtype)
        for k, p in _positions(indices, axis % data.ndim):
            out[k] = data[_wrap(p, data.shape)]
        return [out]

    return ref


def _gather_elements() -> list[OpCase]:
    G = "GatherElements"
    return [
        OpCase(G, [rand(7, 4), _idx((5, 4), 7)], id="axis0"),
        OpCase(G, [rand(5, 7, 4), _idx((5, 9, 4), 7, dtype=I32)], {"axis": 1}, id="axis1_i32"),
        # onnx's reference mishandles a negative axis here
        OpCase(
            G,
            [rand(5, 3, 6, dtype=F64), _idx((5, 3, 2), 6)],
            {"axis": -1},
            id="last_f64",
            reference=_gather_elements_ref(-1),
        ),
        OpCase(G, [_idx((4, 6), 50, seed=3), _idx((4, 6), 4, seed=1)], id="i64_data"),
        OpCase(G, [rand(6, 5), _idx((6, 5), 5, seed=2)], {"axis": 1}, consts=(1,), id="const_idx"),
        OpCase(
            G,
            [rand(5, 7, 4), _idx((3, 9, 2), 7, seed=4)],
            {"axis": 1},
            id="smaller_than_data",
            reference=_gather_elements_ref(1),
        ),
    ]


def _gather_nd() -> list[OpCase]:
    G = "GatherND"
    return [
        OpCase(G, [rand(5, 4, 3), _idx((6, 3), 3)], id="elements"),
        OpCase(G, [rand(5, 4, 3), _idx((2, 3, 1), 4)], id="rows_2d_idx"),
        OpCase(G, [rand(5, 4, 3, dtype=F64), _idx((7, 2), 4)], id="slices_f64"),
        OpCase(G, [rand(5, 4, 3), _idx((5, 2, 1), 4)], {"batch_dims": 1}, id="batch1"),
        OpCase(G, [rand(5, 4, 6), _idx((5, 4, 3, 1), 6)], {"batch_dims": 2}, id="batch2"),
        OpCase(G, [rand(5, 4, 3), _idx((5, 2), 3)], {"batch_dims": 1}, id="batch1_elements"),
        OpCase(G, [_idx((4, 5), 50, seed=3), _idx((3, 2), 4)], id="i64_data"),
        OpCase(G, [rand(6, 5), _idx((4, 1), 6)], consts=(1,), id="const_idx"),
    ]


def _scatter_elements() -> list[OpCase]:
    S = "ScatterElements"
    data, data3 = rand(6, 5), rand(5, 7, 4)
    dup = _idx((4, 5), 6, seed=5)
    return [
        OpCase(S, [data, _unique_along((4, 5), 0, 6), rand(4, 5, seed=1)], id="none_axis0"),
        OpCase(
            S,
            [data3, _unique_along((5, 3, 4), 1, 7, dtype=I32), rand(5, 3, 4, seed=1)],
            {"axis": 1},
            id="none_axis1_i32",
        ),
        OpCase(S, [data, dup, rand(4, 5, seed=2)], {"reduction": "add"}, id="add_dups"),
        OpCase(S, [data, dup, rand(4, 5, seed=3)], {"reduction": "mul"}, id="mul_dups"),
        OpCase(S, [data, dup, rand(4, 5, seed=4)], {"reduction": "max"}, id="max_dups"),
        OpCase(S, [data, dup, rand(4, 5, seed=5)], {"reduction": "min"}, id="min_dups"),
        OpCase(
            S,
            [
                rand(5, 7, 4, dtype=F64),
                _idx((5, 7, 9), 4, seed=6),
                rand(5, 7, 9, seed=6, dtype=F64),
            ],
            {"axis": -1, "reduction": "add"},
            id="add_last_f64",
        ),
        OpCase(
            S,
            [data3, _unique_along((3, 2, 4), 1, 7, seed=7), rand(3, 2, 4, seed=7)],
            {"axis": 1},
            id="smaller_than_data",
        ),
        OpCase(
            S,
            [data3, _idx((2, 5, 3), 7, seed=8), rand(2, 5, 3, seed=8)],
            {"axis": 1, "reduction": "mul"},
            id="smaller_mul",
        ),
        OpCase(
            S,
            [_idx((4, 6), 50, seed=3), _idx((4, 3), 6, seed=9), _idx((4, 3), 50, seed=10)],
            {"axis": 1, "reduction": "add"},
            id="i64_data",
        ),
        OpCase(
            S,
            [data, _unique_along((3, 5), 0, 6, seed=11), rand(3, 5, seed=11)],
            consts=(1,),
            id="const_idx",
        ),
    ]


def _scatter_nd() -> list[OpCase]:
    S = "ScatterND"
    data = rand(6, 5, 4)
    dup_rows = _idx((7, 1), 6, seed=5)
    dup_elems = _idx((3, 4, 3), 4, seed=6)
    return [
        OpCase(S, [data, _unique_tuples(4, (6,)), rand(4, 5, 4, seed=1)], id="none_rows"),
        OpCase(
            S,
            [data, _unique_tuples(6, (6, 5)).reshape(2, 3, 2), rand(2, 3, 4, seed=2)],
            id="none_pairs",
        ),
        OpCase(S, [data, _unique_tuples(9, (6, 5, 4)), rand(9, seed=3)], id="none_elements"),
        OpCase(S, [data, dup_rows, rand(7, 5, 4, seed=4)], {"reduction": "add"}, id="add_dups"),
        OpCase(S, [data, dup_rows, rand(7, 5, 4, seed=5)], {"reduction": "mul"}, id="mul_dups"),
        OpCase(S, [data, dup_elems, rand(3, 4, seed=6)], {"reduction": "max"}, id="max_elems"),
        OpCase(S, [data, dup_elems, rand(3, 4, seed=7)], {"reduction": "min"}, id="min_elems"),
        OpCase(
            S,
            [rand(6, 5, dtype=F64), _idx((5, 2), 5, seed=8), rand(5, seed=8, dtype=F64)],
            {"reduction": "add"},
            id="add_elements_f64",
        ),
        OpCase(
            S,
            [_idx((6, 4), 50, seed=3), _idx((3, 1), 6, seed=9), _idx((3, 4), 50, seed=10)],
            {"reduction": "add"},
            id="i64_data",
        ),
        OpCase(
            S,
            [data, _unique_tuples(3, (6,), seed=12), rand(3, 5, 4, seed=12)],
            consts=(1,),
            id="const_idx",
        ),
    ]


# ---------------------------------------------------------------- backward ops


def _gather_elements_grad_ref(dy, indices, *, axis, data_shape):
    out = np.zeros(data_shape, dy.dtype)
    for k, p in _positions(indices, axis % len(data_shape)):
        out[_wrap(p, data_shape)] += dy[k]
    return [out]


def _gather_elements_grad() -> list[OpCase]:
    def case(dy, idx, axis, data_shape, id):
        attrs = {"axis": axis, "data_shape": list(data_shape)}
        return OpCase(
            "GatherElementsGrad",
            [dy, idx],
            attrs,
            id=id,
            domain="dfdl",
            reference=lambda d, i: _gather_elements_grad_ref(d, i, **attrs),
        )

    return [
        case(rand(5, 4), _idx((5, 4), 7), 0, (7, 4), "axis0"),
        case(rand(5, 9, 4), _idx((5, 9, 4), 7, dtype=I32), 1, (5, 7, 4), "axis1_i32"),
        case(rand(5, 3, 2, dtype=F64), _idx((5, 3, 2), 6), -1, (5, 3, 6), "last_f64"),
        case(rand(3, 9, 2), _idx((3, 9, 2), 7, seed=4), 1, (5, 7, 4), "smaller_than_data"),
        case(rand(6, 1), np.array([[1], [0], [1], [1], [0], [1]], I64), 0, (2, 1), "repeats"),
    ]


def _gather_nd_grad_ref(dy, indices, *, batch_dims, data_shape):
    out = np.zeros(data_shape, dy.dtype)
    b = batch_dims
    for k in np.ndindex(*indices.shape[:-1]):
        pos = k[:b] + tuple(int(i) for i in indices[k])
        out[_wrap(pos, data_shape)] += dy[k]
    return [out]


def _gather_nd_grad() -> list[OpCase]:
    def case(dy, idx, batch_dims, data_shape, id):
        attrs = {"batch_dims": batch_dims, "data_shape": list(data_shape)}
        return OpCase(
            "GatherNDGrad",
            [dy, idx],
            attrs,
            id=id,
            domain="dfdl",
            reference=lambda d, i: _gather_nd_grad_ref(d, i, **attrs),
        )

    return [
        case(rand(6), _idx((6, 3), 3), 0, (5, 4, 3), "elements"),
        case(rand(2, 3, 4, 3), _idx((2, 3, 1), 4), 0, (5, 4, 3), "rows_2d_idx"),
        case(rand(7, 3, dtype=F64), _idx((7, 2), 4), 0, (5, 4, 3), "slices_f64"),
        case(rand(5, 2, 3), _idx((5, 2, 1), 4), 1, (5, 4, 3), "batch1"),
        case(rand(5, 4, 3), _idx((5, 4, 3, 1), 6), 2, (5, 4, 6), "batch2"),
        case(rand(9, 3), np.full((9, 1), -2, I64), 0, (4, 3), "all_same_row"),
    ]


def _scatter_ref(reduction, width_of):
    """Reference ScatterElementsGrad/ScatterNDGrad: loops over the updates. ``width_of``
    maps (data, indices) to (target of each update position as a tuple, update
    positions)."""

    def ref(dy, data, indices, updates):
        targets = width_of(data, indices, updates)
        out = data.astype(F64).copy()
        for t, u in targets:
            out[t] = {"mul": np.multiply, "max": np.maximum, "min": np.minimum}[reduction](
                out[t], updates[u]
            )
        du = np.zeros(updates.shape, F64)
        if reduction == "mul":
            factor = np.ones(data.shape, F64)
            for t, u in targets:
                factor[t] *= updates[u]
            dd = dy * factor
            for t, u in targets:
                others = data[t].astype(F64)
                for t2, u2 in targets:
                    if t2 == t and u2 != u:
                        others = others * updates[u2]
                du[u] = dy[t] * others
            return [dd.astype(dy.dtype), du.astype(dy.dtype)]
        ties = (data == out).astype(F64)
        for t, u in targets:
            ties[t] += updates[u] == out[t]
        dd = np.where(data == out, dy / ties, 0)
        for t, u in targets:
            du[u] = dy[t] / ties[t] if updates[u] == out[t] else 0
        return [dd.astype(dy.dtype), du.astype(dy.dtype)]

    return ref


def _element_targets(axis):
    def targets(data, indices, updates):
        return [(_wrap(p, data.shape), k) for k, p in _positions(indices, axis % data.ndim)]

    return targets


def _nd_targets(data, indices, updates):
    out = []
    k = indices.shape[-1]
    for i in np.ndindex(*indices.shape[:-1]):
        row = _wrap(tuple(int(v) for v in indices[i]), data.shape[:k])
        for tail in np.ndindex(*data.shape[k:]):
            out.append((row + tail, i + tail))
    return out


def _scatter_elements_grad() -> list[OpCase]:
    def case(inputs, axis, reduction, id):
        attrs = {"axis": axis, "reduction": reduction}
        return OpCase(
            "ScatterElementsGrad",
            inputs,
            attrs,
            n_outputs=2,
            id=id,
            domain="dfdl",
            reference=_scatter_ref(reduction, _element_targets(axis)),
        )

    data = rand(6, 5, low=0.5, high=2.0)
    dup = _idx((4, 5), 6, seed=5)
    ties = np.array([[1.0, 2.0, 2.0], [2.0, 0.5, 3.0]], np.float32)
    return [
        case([rand(6, 5, seed=1), data, dup, rand(4, 5, seed=3)], 0, "mul", "mul_dups"),
        case([rand(6, 5, seed=1), data, dup, rand(4, 5, seed=4)], 0, "max", "max_dups"),
        case([rand(6, 5, seed=1), data, dup, rand(4, 5, seed=5)], 0, "min", "min_dups"),
        case(
            [
                rand(5, 7, 4, seed=2, dtype=F64),
                rand(5, 7, 4, dtype=F64, low=0.5),
                _idx((2, 5, 3), 7, seed=8, dtype=I32),
                rand(2, 5, 3, seed=8, dtype=F64),
            ],
            1,
            "mul",
            "smaller_mul_f64",
        ),
        case(
            [
                rand(2, 3, seed=3),
                ties,
                np.array([[0, 0, 1], [2, 2, 0]], I64),
                np.array([[1.0, 0.0, 2.0], [2.0, 2.0, 3.0]], np.float32),
            ],
            1,
            "max",
            "max_ties",
        ),
        case(
            [
                rand(2, 3, seed=3),
                ties,
                np.array([[0, 0, 1], [2, 2, 0]], I64),
                np.array([[1.0, 0.0, 2.0], [2.0, 2.0, 3.0]], np.float32),
            ],
            1,
            "mul",
            "mul_zero_update",
        ),
    ]


def _scatter_nd_grad() -> list[OpCase]:
    def case(inputs, reduction, id):
        return OpCase(
            "ScatterNDGrad",
            inputs,
            {"reduction": reduction},
            n_outputs=2,
            id=id,
            domain="dfdl",
            reference=_scatter_ref(reduction, _nd_targets),
        )

    data = rand(6, 5, 4, low=0.5, high=2.0)
    dup_rows = _idx((7, 1), 6, seed=5)
    dup_elems = _idx((3, 4, 3), 4, seed=6)
    return [
        case([rand(6, 5, 4, seed=1), data, dup_rows, rand(7, 5, 4, seed=5)], "mul", "mul_rows"),
        case([rand(6, 5, 4, seed=1), data, dup_elems, rand(3, 4, seed=6)], "max", "max_elems"),
        case([rand(6, 5, 4, seed=1), data, dup_elems, rand(3, 4, seed=7)], "min", "min_elems"),
        case(
            [
                rand(6, 5, seed=2, dtype=F64),
                rand(6, 5, dtype=F64, low=0.5),
                _idx((5, 2), 5, seed=8),
                rand(5, seed=8, dtype=F64),
            ],
            "mul",
            "mul_elements_f64",
        ),
        case(
            [
                rand(4, 2, seed=3),
                np.full((4, 2), 1.0, np.float32),
                np.array([[1], [1], [2]], I64),
                np.array([[1.0, 0.5], [1.0, 3.0], [0.5, 0.0]], np.float32),
            ],
            "max",
            "max_ties",
        ),
    ]


CASES = [
    *_gather_elements(),
    *_gather_nd(),
    *_scatter_elements(),
    *_scatter_nd(),
    *_gather_elements_grad(),
    *_gather_nd_grad(),
    *_scatter_elements_grad(),
    *_scatter_nd_grad(),
]
