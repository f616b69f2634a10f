"""OpCases for Pad and dfdl.PadGrad (dfdl/ops/pad.py).

Cases with negative pads take onnxruntime as their oracle (onnx's reference evaluator
refuses negative pads); the others take the reference evaluator. Pad sizes are chosen so
that uneven tiles of the output (``10 -> 5, 3, 2``) fall wholly inside the padding,
straddle it, and crop.
"""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tests.ops.case import OpCase, rand

F64, I64 = np.float64, np.int64


def _i(*v):
    return np.array(v, dtype=I64)


def _ort(mode: str):
    """onnxruntime's Pad as a reference (the inputs after ``data`` are initializers)."""

    def ref(data, pads, constant_value=None, axes=None):
        import onnxruntime as ort

        inits = [numpy_helper.from_array(np.asarray(pads), "pads")]
        names = ["x", "pads"]
        for name, v in (("cv", constant_value), ("axes", axes)):
            if v is not None:
                inits.append(numpy_helper.from_array(np.asarray(v), name))
            names.append(name if v is not None else "")
        while not names[-1]:
            names.pop()
        elem = helper.np_dtype_to_tensor_dtype(data.dtype)
        graph = helper.make_graph(
            [helper.make_node("Pad", names, ["y"], mode=mode)],
            "pad",
            [helper.make_tensor_value_info("x", elem, data.shape)],
            [helper.make_tensor_value_info("y", elem, None)],
            inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        model.ir_version = 10
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, {"x": data})

    return ref


def _pad() -> list[OpCase]:
    P = "Pad"
    x = rand(5, 3, 4)
    cases = []
    for mode in ("constant", "edge", "reflect", "wrap"):
        m = {"mode": mode}
        cases += [
            OpCase(P, [x, _i(0, 2, 1, 0, 3, 2)], m, consts=(1,), id=f"{mode}_all_axes"),
            # a 3-long axis padded to 10: tiles (5, 3, 2) lie in, across and after the pads
            OpCase(P, [x, _i(6, 1), None, _i(1)], m, consts=(1, 3), id=f"{mode}_wide_axis1"),
            OpCase(P, [rand(5, 7), _i(1, 2, 2, 0)], m, consts=(1,), id=f"{mode}_2d"),
            OpCase(
                P, [x, _i(2, 1, 0, 3), None, _i(-1, 0)], m, consts=(1, 3), id=f"{mode}_neg_axes"
            ),
            OpCase(
                P,
                [x, _i(-2, 2, 1, -1), None, _i(0, 2)],
                m,
                consts=(1, 3),
                id=f"{mode}_crop",
                reference=_ort(mode),
            ),
        ]
    return cases + [
        OpCase(P, [x, _i(1, 1, 1, 1, 1, 1), np.array(2.5, np.float32)], consts=(1, 2), id="value"),
        OpCase(
            P,
            [rand(5, 4, dtype=F64), _i(0, 3, 0, 2), np.array(-1.0), _i(0, 1)],
            consts=(1, 2, 3),
            id="value_axes_f64",
        ),
        OpCase(P, [_i(3, 1, 4, 1, 5), _i(2, 3), np.array(7, I64)], consts=(1, 2), id="i64"),
        OpCase(
            P,
            [np.arange(20, dtype=np.int32).reshape(4, 5), _i(3, 2, 1, 4)],
            {"mode": "reflect"},
            consts=(1,),
            id="reflect_long_i32",  # pads longer than the axis reflect again (numpy.pad)
        ),
        OpCase(P, [x, _i(0, 0, 0, 0, 0, 0)], consts=(1,), id="zero_pads"),
        OpCase(
            P,
            [rand(5, 6), _i(-6, 0), None, _i(1)],
            consts=(1, 3),
            id="crop_all",
            reference=_ort("constant"),
        ),
        OpCase(P, [np.array([True, False, True]), _i(2, 1)], consts=(1,), id="bool"),
    ]


def _reference_pad(data, pads, constant_value, axes, mode):
    """onnx's reference evaluator's Pad (onnxruntime's where a pad is negative)."""
    if np.min(pads) < 0:
        return _ort(mode)(data, pads, constant_value, axes)
    names = ["x", "pads", "cv"] + (["axes"] if axes is not None else [])
    values = [pads, constant_value] + ([axes] if axes is not None else [])
    elem = helper.np_dtype_to_tensor_dtype(data.dtype)
    graph = helper.make_graph(
        [helper.make_node("Pad", names, ["y"], mode=mode)],
        "pad",
        [helper.make_tensor_value_info("x", elem, data.shape)],
        [helper.make_tensor_value_info("y", elem, None)],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in zip(names[1:], values)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return ReferenceEvaluator(model).run(None, {"x": data})


def _pad_grad_ref(shape, mode):
    """Reference PadGrad: the reference Pad of an index grid says where each element of
    dY came from (-1: the constant)."""

    def ref(dy, pads, axes=None):
        grid = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
        pos = _reference_pad(grid, pads, np.array(-1, np.int64), axes, mode)[0].reshape(-1)
        out = np.zeros(int(np.prod(shape)), dtype=dy.dtype)
        np.add.at(out, pos[pos >= 0], dy.reshape(-1)[pos >= 0])
        return [out.reshape(shape)]

    return ref


def _pad_grad() -> list[OpCase]:
    def case(shape, dy_shape, pads, axes, mode, id, dtype=np.float32):
        inputs = [rand(*dy_shape, dtype=dtype), pads] + ([] if axes is None else [axes])
        return OpCase(
            "PadGrad",
            inputs,
            {"mode": mode, "shape": list(shape)},
            consts=(1, 2),
            id=id,
            domain="dfdl",
            reference=_pad_grad_ref(shape, mode),
        )

    return [
        case((5, 3, 4), (5, 6, 6), _i(2, 1, 1, 1), _i(1, 2), "reflect", "reflect"),
        case((5, 3, 4), (5, 10, 4), _i(6, 1), _i(1), "edge", "edge_wide"),
        case((5, 3, 4), (5, 8, 7), _i(2, 3, 3, 0), _i(1, 2), "wrap", "wrap"),
        case((5, 3, 4), (5, 10, 4), _i(6, 1), _i(-2), "reflect", "reflect_long"),
        case((5, 4), (5, 5), _i(-1, 2), _i(1), "edge", "edge_crop"),
        case((5, 4), (8, 4), _i(1, 2), _i(0), "constant", "constant"),
        case((6, 5), (7, 7), _i(0, 1, 1, 1), None, "wrap", "no_axes_f64", dtype=F64),
    ]


CASES = [*_pad(), *_pad_grad()]
