"""Per-op test cases: each op module's test file lists OpCases for the ops it owns.

``tests/ops/test_registry.py`` is parametrized over the registry and runs every case
of every op (numpy forward against onnx's ReferenceEvaluator, shape rule against the
forward, tiled execution against the untiled reference), and fails for an op that has
no case at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

OPSET = 21


@dataclass
class OpCase:
    """One single-node model: the op, its inputs (None = omitted optional input),
    attributes, how many outputs to request and which inputs are initializers.

    Attributes:
        op: op type (registry key).
        inputs: input arrays in order; None for an omitted optional input.
        attrs: ONNX attributes.
        n_outputs: how many outputs the node produces.
        consts: indices of inputs stored as initializers (shape parameters etc.).
        rtol, atol: tolerances against the reference.
        opset: default-domain opset of the model.
        id: a short readable name for the test id.
        reference: optional callable(*inputs) -> list of expected outputs, for cases the
            ReferenceEvaluator cannot compute (it is the oracle otherwise; required for
            ``dfdl``-domain ops).
        domain: the op's domain ("" for ONNX ops, "dfdl" for dfdl's backward ops).
    """

    op: str
    inputs: list[Any]
    attrs: dict[str, Any] = field(default_factory=dict)
    n_outputs: int = 1
    consts: tuple[int, ...] = ()
    rtol: float = 1e-5
    atol: float = 1e-6
    opset: int = OPSET
    id: str = ""
    reference: Any = None
    domain: str = ""
    _expected: Any = field(default=None, repr=False, compare=False)

    def input_names(self) -> list[str]:
        return ["" if x is None else f"in{i}" for i, x in enumerate(self.inputs)]

    def output_names(self) -> list[str]:
        return [f"out{i}" for i in range(self.n_outputs)]

    def model(self, typed: bool = True) -> onnx.ModelProto:
        """The case as an ONNX model (checked when ``typed``: outputs get the
        reference's dtypes)."""
        names = self.input_names()
        node = helper.make_node(
            self.op, names, self.output_names(), domain=self.domain, **self.attrs
        )
        inits, graph_inputs = [], []
        for i, (name, x) in enumerate(zip(names, self.inputs)):
            if x is None:
                continue
            x = np.asarray(x)
            if i in self.consts:
                inits.append(numpy_helper.from_array(x, name))
            else:
                graph_inputs.append(
                    helper.make_tensor_value_info(
                        name, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape
                    )
                )
        if typed:
            outputs = [
                helper.make_tensor_value_info(
                    n, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), np.shape(v)
                )
                for n, v in zip(self.output_names(), self.expected())
            ]
        else:
            outputs = [onnx.ValueInfoProto(name=n) for n in self.output_names()]
        graph = helper.make_graph([node], f"case_{self.op}", graph_inputs, outputs, inits)
        opsets = [helper.make_opsetid("", self.opset)]
        if self.domain:
            opsets.append(helper.make_opsetid(self.domain, 1))
        model = helper.make_model(graph, opset_imports=opsets)
        model.ir_version = 10
        if typed:
            onnx.checker.check_model(model)
        return model

    def feeds(self) -> dict[str, np.ndarray]:
        """Graph-input feeds (non-constant, present inputs)."""
        return {
            n: np.asarray(x)
            for i, (n, x) in enumerate(zip(self.input_names(), self.inputs))
            if x is not None and i not in self.consts
        }

    def expected(self) -> list[np.ndarray]:
        """Reference outputs: ``reference`` if given, else onnx's ReferenceEvaluator."""
        if self.reference is not None:
            return [np.asarray(o) for o in self.reference(*self.inputs)]
        from onnx.reference import ReferenceEvaluator

        if self._expected is None:
            ref = ReferenceEvaluator(self.model(typed=False))
            self._expected = list(ref.run(None, self.feeds()))
        return self._expected

    @property
    def key(self) -> str:
        """The op's registry key (``"dfdl.ConvGradWeight"`` for dfdl-domain ops)."""
        return f"{self.domain}.{self.op}" if self.domain else self.op

    def name(self) -> str:
        return f"{self.key}-{self.id}" if self.id else self.key


def rand(*shape: int, dtype=np.float32, seed: int = 0, low=-2.0, high=2.0) -> np.ndarray:
    """Deterministic uniform test data."""
    rng = np.random.default_rng(seed + 1000 * len(shape) + sum(shape))
    return rng.uniform(low, high, size=shape).astype(dtype)
