"""Property-based fuzzing of what users hand dfdl (``hypothesis``, a small budget for CI):
mutated ONNX models and arbitrary training arrays either load, bind and check, or raise a
``dfdl.errors.DfdlError``; never another exception (an ``IndexError`` from deep inside, a
numpy error), and never a hang.

The checks are the ones ``dfdl.train`` makes before any cluster starts
(:meth:`dfdl.runtime.session.TrainingSession.check`), so no cluster is needed.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import dfdl.models
from dfdl.errors import DfdlError
from dfdl.ir.onnx_io import load_model, to_ir
from dfdl.plan.compile import Workers
from dfdl.runtime.session import TrainingSession, train_config

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

#: the model every case starts from: 6 features, 8 hidden, 3 classes
SIZES = (6, 8, 3)
BUDGET = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _model() -> onnx.ModelProto:
    return dfdl.models.mlp(SIZES, seed=0)


def _check(model, data) -> None:
    """What dfdl.train runs before a cluster: load, bind, compile the first step, check."""
    config = train_config(batch_size=4, epochs=1, progress=False)
    TrainingSession(model, data, config).check(Workers(cores=2, processes=1, threads=2))


def _only_dfdl_errors(fn, *args) -> None:
    try:
        fn(*args)
    except DfdlError:
        pass


@BUDGET
@given(st.data())
def test_mutated_model_bytes_load_or_raise_a_dfdl_error(data):
    raw = bytearray(_model().SerializeToString())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(len(raw) // 2, len(raw)))
    _only_dfdl_errors(lambda b: to_ir(load_model(b)), bytes(raw[:cut]))


OPS = ["Gemm", "Relu", "MatMul", "Add", "Softmax", "Conv", "Unique", "Reshape", "Frob"]


@BUDGET
@given(st.data())
def test_mutated_model_structure_checks_or_raises_a_dfdl_error(data):
    model = _model()
    g = model.graph
    kind = data.draw(st.sampled_from(["op", "input", "dims", "attr", "drop", "dtype"]))
    node = g.node[data.draw(st.integers(0, len(g.node) - 1))]
    if kind == "op":
        node.op_type = data.draw(st.sampled_from(OPS))
    elif kind == "input":
        names = [*(t.name for t in g.initializer), "x", "nowhere", ""]
        node.input[data.draw(st.integers(0, len(node.input) - 1))] = data.draw(
            st.sampled_from(names)
        )
    elif kind == "dims":
        t = g.initializer[data.draw(st.integers(0, len(g.initializer) - 1))]
        a = onnx.numpy_helper.to_array(t)
        shape = data.draw(st.lists(st.integers(0, 9), min_size=0, max_size=3))
        size = int(np.prod(shape)) if shape else 1
        b = np.resize(a.reshape(-1), size).reshape(shape).astype(a.dtype)
        t.CopyFrom(onnx.numpy_helper.from_array(b, t.name))
    elif kind == "attr":
        node.attribute.append(
            onnx.helper.make_attribute(
                data.draw(st.sampled_from(["axis", "transB", "alpha", "bogus"])),
                data.draw(st.one_of(st.integers(-5, 5), st.floats(allow_nan=True))),
            )
        )
    elif kind == "drop":
        del g.node[data.draw(st.integers(0, len(g.node) - 1))]
    else:
        g.input[0].type.tensor_type.elem_type = data.draw(
            st.sampled_from([onnx.TensorProto.INT64, onnx.TensorProto.DOUBLE, 0, 99])
        )
    X = np.zeros((8, SIZES[0]), np.float32)
    y = np.zeros(8, np.int64)
    _only_dfdl_errors(_check, model, (X, y))


DTYPES = st.sampled_from(
    [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_, np.complex64]
)


@BUDGET
@given(
    X=hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9)),
    y=hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=9)),
)
def test_arbitrary_training_arrays_check_or_raise_a_dfdl_error(X, y):
    _only_dfdl_errors(_check, _model(), (X, y))
