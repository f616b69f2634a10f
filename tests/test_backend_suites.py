"""ONNX's model suites beyond the node tests, run through dfdl.backend as ONNX's own
runner (``onnx.backend.test.runner.Runner``) runs them, with its tolerances.

Suites (all shipped inside the ``onnx`` package, nothing is downloaded):

- ``simple``, ``pytorch-converted``, ``pytorch-operator``: small models (most of them
  opset 6 to 9, converted to opset 13 at load) with their recorded inputs and outputs;
  each runs at the automatic tiling and again at a forced uneven tiling.
- ``light``: the model-zoo classics (AlexNet, DenseNet-121, Inception v1/v2, ResNet-50,
  ShuffleNet, SqueezeNet, VGG-19, ZFNet-512; opset 9) of ``onnx/backend/test/data/light``:
  full-size networks at batch 1 whose weights are constants. As ONNX's runner does, the
  input is ``arange(n) / n`` in the input's shape and the expected output is the file's
  ``*_output_0.pb``. Automatic tiling only (they are the suite's expensive part).

The cases run on two workers inside the test process (``backend_in_process`` in
``tests/conftest.py``); the SqueezeNet logits check runs on the backend's own cluster.

Selected: every case whose ops (after conversion to opset 13, as dfdl loads it) are all
in dfdl's registry, so cases start running as ops are added. The others are not
collected; their reason (the ops dfdl lacks) is computed here and counted per suite in
the terminal summary (tests/conftest.py), next to each suite's pass/total. Selected cases
that are not expected to pass are in ``EXCLUDED``, each with its reason.
"""

from __future__ import annotations

import glob
import os
import re
import warnings
from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.backend.test.loader import load_model_tests
from onnx.backend.test.runner import Runner

import dfdl
from dfdl.errors import ModelError
from dfdl.ir.onnx_io import convert_opset
from dfdl.ir.sequences import SEQUENCE_OPS
from dfdl.ops import lookup

#: the suites, in the order the summary prints them
SUITES = ("simple", "pytorch-converted", "pytorch-operator", "light")
#: where the light models' URLs point, relative to the onnx package's parent folder
LIGHT_PREFIX = "onnx/backend/test/data/light/"

#: selected cases not expected to pass, by regular expression on "suite/case", with why
EXCLUDED: dict[str, str] = {
    r"^light/test_squeezenet$": (
        "its weights are constants (every one of the 1000 output channels the same), so its "
        "logits (9.5e9) tie exactly in onnxruntime and the recorded output is softmax's "
        "0.001 everywhere; summed in another order (numpy's BLAS on an AVX2 CPU takes some "
        "output columns in its edge kernel), logits 1 ulp apart (1024 at that scale) give "
        "softmax 0.25 and 0: ill-conditioned, not wrong. "
        "test_light_squeezenet_logits_match_onnxruntime checks the logits instead"
    ),
}


@dataclass(frozen=True)
class SuiteCase:
    """One case of an ONNX model suite: where its model and data are, its tolerances."""

    suite: str
    name: str
    model_path: str
    #: ``test_data_set_*`` folders (small suites); empty for the light models
    data_dirs: tuple[str, ...]
    #: the light model's recorded output (``*_output_0.pb``)
    expected: str
    rtol: float
    atol: float

    @property
    def id(self) -> str:
        return f"{self.suite}/{self.name}"


def _suite_cases() -> list[SuiteCase]:
    cases = []
    for kind in ("simple", "pytorch-converted", "pytorch-operator"):
        for c in load_model_tests(kind=kind):
            dirs = tuple(sorted(glob.glob(os.path.join(c.model_dir, "test_data_set_*"))))
            path = os.path.join(c.model_dir, "model.onnx")
            cases.append(SuiteCase(kind, c.name, path, dirs, "", c.rtol, c.atol))
    root = os.path.dirname(os.path.dirname(onnx.__file__))
    for c in load_model_tests(kind="real"):
        if c.url and c.url.startswith(LIGHT_PREFIX):
            path = os.path.join(root, c.url)
            expected = os.path.splitext(path)[0] + "_output_0.pb"
            cases.append(SuiteCase("light", c.name, path, (), expected, c.rtol, c.atol))
    return sorted(cases, key=lambda c: (SUITES.index(c.suite), c.name))


def _missing_ops(model: onnx.ModelProto) -> list[str]:
    """The ops of ``model`` (converted to opset 13 when older) that dfdl lacks (Sequence
    ops are rewritten into tensor ops while binding: :mod:`dfdl.ir.sequences`)."""
    try:
        model = convert_opset(model)
    except ModelError:
        pass  # judged by its own ops: a selected case that fails to convert is EXCLUDED
    missing = {
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
        for n in model.graph.node
        if lookup(n.op_type, n.domain) is None
        and not (n.domain in ("", "ai.onnx") and n.op_type in SEQUENCE_OPS)
    }
    return sorted(missing)


def _select() -> tuple[list[SuiteCase], dict[str, dict[str, list[str]]], dict[str, int]]:
    """(selected cases, per suite the cases left out -> the ops dfdl lacks, per suite
    the number of cases)."""
    selected, left_out, totals = [], {s: {} for s in SUITES}, Counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = _suite_cases()
    for case in cases:
        totals[case.suite] += 1
        missing = _missing_ops(onnx.load(case.model_path))
        if missing:
            left_out[case.suite][case.name] = missing
        else:
            selected.append(case)
    return selected, left_out, dict(totals)


SELECTED, LEFT_OUT, TOTALS = _select()


def _excluded(case: SuiteCase) -> str:
    return next((why for pattern, why in EXCLUDED.items() if re.search(pattern, case.id)), "")


#: per suite, the selected cases excluded with a reason
EXCLUDED_CASES: dict[str, list[str]] = {s: [] for s in SUITES}
for _case in SELECTED:
    if _excluded(_case):
        EXCLUDED_CASES[_case.suite].append(_case.name)

RUNS = [
    pytest.param(case, tiling, id=f"{case.id}/{tiling}")
    for case in SELECTED
    if not _excluded(case)
    for tiling in (("default",) if case.suite == "light" else ("default", "uneven"))
]


def _read(path: str, type_proto: onnx.TypeProto):
    """A recorded input or output, as ONNX's runner reads it (tensor or sequence)."""
    with open(path, "rb") as f:
        data = f.read()
    if type_proto.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        return numpy_helper.to_list(seq)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    return numpy_helper.to_array(tensor)


def _data_sets(case: SuiteCase, model: onnx.ModelProto) -> list[tuple[list, list]]:
    """(inputs, expected outputs) of each data set of the case."""
    if case.suite == "light":
        inits = {t.name for t in model.graph.initializer}
        inputs = [
            Runner.generate_dummy_data(vi, seed=0, name=case.name, random=False)
            for vi in model.graph.input
            if vi.name not in inits
        ]
        return [(inputs, [_read(case.expected, model.graph.output[0].type)])]
    out = []
    for d in case.data_dirs:
        n_in = len(glob.glob(os.path.join(d, "input_*.pb")))
        n_out = len(glob.glob(os.path.join(d, "output_*.pb")))
        inputs = [
            _read(os.path.join(d, f"input_{i}.pb"), model.graph.input[i].type) for i in range(n_in)
        ]
        outputs = [
            _read(os.path.join(d, f"output_{i}.pb"), model.graph.output[i].type)
            for i in range(n_out)
        ]
        out.append((inputs, outputs))
    return out


@pytest.mark.usefixtures("backend_in_process")
@pytest.mark.parametrize(("case", "tiling"), RUNS)
def test_suite_case(case: SuiteCase, tiling: str):
    """The case's outputs match the recorded ones within the suite's tolerances."""
    model = onnx.load(case.model_path)
    backend = dfdl.backend if tiling == "default" else dfdl.backend.with_tiles("uneven")
    rep = backend.prepare(model, "CPU")
    data = _data_sets(case, model)
    assert data, f"{case.id} has no data set"
    for inputs, expected in data:
        outputs = list(rep.run(inputs))
        Runner.assert_similar_outputs(expected, outputs, case.rtol, case.atol, case.id)


def test_light_squeezenet_logits_match_onnxruntime():
    """The excluded light SqueezeNet (see ``EXCLUDED``) up to its logits, before the
    Softmax whose exact ties decide its recorded output: as onnxruntime's within float32
    rounding of their scale."""
    import onnxruntime as ort

    (case,) = [c for c in SELECTED if c.id == "light/test_squeezenet"]
    model = onnx.load(case.model_path)
    (softmax,) = [n for n in model.graph.node if n.op_type == "Softmax"]
    assert softmax.output[0] == model.graph.output[0].name
    logits = onnx.shape_inference.infer_shapes(model)
    (info,) = [v for v in logits.graph.value_info if v.name == softmax.input[0]]
    logits.graph.node.remove([n for n in logits.graph.node if n.op_type == "Softmax"][0])
    logits.graph.output.pop()
    logits.graph.output.append(info)
    ((inputs, _),) = _data_sets(case, model)
    inits = {t.name for t in model.graph.initializer}
    names = [v.name for v in model.graph.input if v.name not in inits]
    feed = dict(zip(names, inputs, strict=True))
    (ref,) = ort.InferenceSession(logits.SerializeToString()).run(None, feed)
    (got,) = dfdl.backend.prepare(logits, "CPU").run(inputs)
    scale = float(np.max(np.abs(ref)))
    assert scale > 1e9  # the recorded case's scale: a tie of softmax at 1 ulp
    assert float(np.max(np.abs(np.asarray(got) - ref))) <= 1e-5 * scale


def test_selection_reasons_are_computed():
    """Every case is either selected or left out naming the ops dfdl lacks, and the
    counts add up per suite (what the terminal summary prints)."""
    for suite in SUITES:
        selected = sum(c.suite == suite for c in SELECTED)
        assert selected + len(LEFT_OUT[suite]) == TOTALS[suite] > 0
        for name, missing in LEFT_OUT[suite].items():
            assert missing and all(lookup(op) is None for op in missing if "." not in op), name
    assert all(p.values[0] in SELECTED for p in RUNS)
