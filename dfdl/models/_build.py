"""Shared ``onnx.helper`` plumbing for the model zoo builders.

A :class:`Builder` collects nodes and initializers while an architecture is written out
layer by layer, draws PyTorch-style initial weights from one seeded generator (so a seed
fixes every weight), and finally wraps everything in a checked :class:`onnx.ModelProto`.

Initializer names follow the ``state_dict`` of the twin ``torch.nn.Module`` in
:mod:`dfdl.models.torch_twins`; constants that are not parameters (reshape targets,
scales, the dropout ratio) are ``Constant`` nodes named ``const/...``, so they never
train and can never clash with a parameter.

Example:
    >>> from onnx.numpy_helper import to_array
    >>> from dfdl.models import mlp
    >>> a, b = mlp((4, 3), seed=1).graph.initializer, mlp((4, 3), seed=1).graph.initializer
    >>> all((to_array(x) == to_array(y)).all() for x, y in zip(a, b))
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MIN_OPSET = 17
MAX_OPSET = 21
CONST_PREFIX = "const/"


class Builder:
    """Accumulates an ONNX graph with deterministic, seeded initial weights.

    Args:
        name: graph name.
        seed: seed of the weight generator.
        opset: default-domain opset the model will declare (17..21).
    """

    def __init__(self, name: str, seed: int, opset: int) -> None:
        if not MIN_OPSET <= opset <= MAX_OPSET:
            raise ValueError(f"opset must be in {MIN_OPSET}..{MAX_OPSET}, got {opset}")
        self.name = name
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, np.ndarray] = {}
        self._consts: dict[str, np.ndarray] = {}
        self._node_names: set[str] = set()

    # ---- tensors ------------------------------------------------------------------------

    def add_initializer(self, name: str, value: np.ndarray) -> str:
        """Registers ``value`` under ``name`` (must be new) and returns the name."""
        if name in self.initializers:
            raise ValueError(f"duplicate initializer {name!r}")
        self.initializers[name] = np.asarray(value, order="C")  # keeps 0-d scalars 0-d
        return name

    def const(self, name: str, value, dtype=np.float32) -> str:
        """A constant ``const/<name>`` (a ``Constant`` node), shared when repeated.

        A node, not an initializer: ``dfdl.train`` trains every floating-point initializer
        (as the README says), and a scale or a dropout ratio is no parameter of the twin.
        """
        full = CONST_PREFIX + name
        arr = np.asarray(value, dtype=dtype)
        if full in self._consts:
            if not np.array_equal(self._consts[full], arr):
                raise ValueError(f"constant {full!r} redefined with another value")
            return full
        self._consts[full] = arr
        self._node_names.add(full)
        tensor = numpy_helper.from_array(np.asarray(arr, order="C"), full)
        self.nodes.append(helper.make_node("Constant", [], [full], full, value=tensor))
        return full

    def uniform(self, name: str, shape: Sequence[int], bound: float) -> str:
        """A float32 parameter drawn from U(-bound, bound)."""
        value = self.rng.uniform(-bound, bound, size=tuple(shape)).astype(np.float32)
        return self.add_initializer(name, value)

    def normal(self, name: str, shape: Sequence[int], std: float = 1.0) -> str:
        """A float32 parameter drawn from N(0, std^2)."""
        value = (self.rng.standard_normal(size=tuple(shape)) * std).astype(np.float32)
        return self.add_initializer(name, value)

    def filled(self, name: str, shape: Sequence[int], fill: float) -> str:
        """A float32 parameter or buffer filled with ``fill``."""
        return self.add_initializer(name, np.full(tuple(shape), fill, dtype=np.float32))

    # ---- nodes --------------------------------------------------------------------------

    def op(
        self,
        op_type: str,
        inputs: Sequence[str],
        name: str,
        **attrs,
    ) -> str:
        """Appends one node named ``name`` (made unique); its single output has that name."""
        unique, k = name, 1
        while unique in self._node_names:
            unique, k = f"{name}_{k}", k + 1
        self._node_names.add(unique)
        self.nodes.append(helper.make_node(op_type, list(inputs), [unique], unique, **attrs))
        return unique

    def rename(self, old: str, new: str) -> str:
        """Renames tensor ``old`` (a node output) to ``new``, e.g. to "logits"."""
        for node in self.nodes:
            node.output[:] = [new if t == old else t for t in node.output]
            node.input[:] = [new if t == old else t for t in node.input]
        return new

    # ---- layers shared by several architectures ----------------------------------------

    def conv(
        self,
        x: str,
        prefix: str,
        c_in: int,
        c_out: int,
        kernel: Sequence[int],
        stride: int = 1,
        pad: int = 0,
        bias: bool = False,
    ) -> str:
        """Conv with torch ``ConvNd`` default init; weight (c_out, c_in, *kernel)."""
        kernel = list(kernel)
        # kaiming_uniform(a=sqrt(5)) reduces to U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        bound = 1.0 / math.sqrt(c_in * math.prod(kernel))
        inputs = [x, self.uniform(f"{prefix}.weight", [c_out, c_in, *kernel], bound)]
        if bias:
            inputs.append(self.uniform(f"{prefix}.bias", [c_out], bound))
        nd = len(kernel)
        return self.op(
            "Conv",
            inputs,
            prefix,
            kernel_shape=kernel,
            strides=[stride] * nd,
            pads=[pad] * (2 * nd),
        )

    def conv_transpose(self, x: str, prefix: str, c_in: int, c_out: int, k: int, nd: int) -> str:
        """ConvTranspose (kernel k, stride k) with bias; weight (c_in, c_out, *kernel)."""
        # torch computes fan_in from weight dim 1 (c_out) for transposed convolutions.
        bound = 1.0 / math.sqrt(c_out * k**nd)
        w = self.uniform(f"{prefix}.weight", [c_in, c_out] + [k] * nd, bound)
        b = self.uniform(f"{prefix}.bias", [c_out], bound)
        return self.op("ConvTranspose", [x, w, b], prefix, kernel_shape=[k] * nd, strides=[k] * nd)

    def batch_norm(self, x: str, prefix: str, channels: int) -> str:
        """Inference-form BatchNormalization with torch's fresh parameters and buffers."""
        inputs = [
            x,
            self.filled(f"{prefix}.weight", [channels], 1.0),
            self.filled(f"{prefix}.bias", [channels], 0.0),
            self.filled(f"{prefix}.running_mean", [channels], 0.0),
            self.filled(f"{prefix}.running_var", [channels], 1.0),
        ]
        # ONNX momentum weights the old running value: torch momentum 0.1 -> 0.9.
        return self.op("BatchNormalization", inputs, prefix, epsilon=1e-5, momentum=0.9)

    def gemm(self, x: str, prefix: str, n_in: int, n_out: int) -> str:
        """``torch.nn.Linear`` as Gemm(transB=1); weight stored (out, in)."""
        bound = 1.0 / math.sqrt(n_in)
        w = self.uniform(f"{prefix}.weight", [n_out, n_in], bound)
        b = self.uniform(f"{prefix}.bias", [n_out], bound)
        return self.op("Gemm", [x, w, b], prefix, transB=1)

    def dense(self, x: str, prefix: str, n_in: int, n_out: int) -> str:
        """MatMul + Add over the last axis; weight stored (in, out) so MatMul needs no transpose."""
        bound = 1.0 / math.sqrt(n_in)
        w = self.uniform(f"{prefix}.weight", [n_in, n_out], bound)
        b = self.uniform(f"{prefix}.bias", [n_out], bound)
        y = self.op("MatMul", [x, w], f"{prefix}.matmul")
        return self.op("Add", [y, b], f"{prefix}.add")

    def conv_bn_relu(self, x: str, prefix: str, idx: int, c_in: int, c_out: int, nd: int) -> str:
        """3^nd conv (pad 1, no bias) -> BatchNormalization -> Relu, torch names convN/bnN."""
        y = self.conv(x, f"{prefix}.conv{idx}", c_in, c_out, [3] * nd, pad=1)
        y = self.batch_norm(y, f"{prefix}.bn{idx}", c_out)
        return self.op("Relu", [y], f"{prefix}.relu{idx}")

    # ---- finishing ----------------------------------------------------------------------

    def model(
        self,
        inputs: Sequence[onnx.ValueInfoProto],
        outputs: Sequence[onnx.ValueInfoProto],
    ) -> onnx.ModelProto:
        """Wraps the graph in a model, runs the full checker and returns it."""
        graph = helper.make_graph(
            self.nodes,
            self.name,
            list(inputs),
            list(outputs),
            initializer=[numpy_helper.from_array(v, k) for k, v in self.initializers.items()],
        )
        opset = [helper.make_opsetid("", self.opset)]
        model = helper.make_model(
            graph,
            opset_imports=opset,
            ir_version=helper.find_min_ir_version_for(opset),
            producer_name="dfdl.models",
        )
        onnx.checker.check_model(model, full_check=True)
        return model


def float_input(name: str, dims: Sequence[int | str]) -> onnx.ValueInfoProto:
    """A float32 graph input/output; string dims are symbolic."""
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))


def int64_input(name: str, dims: Sequence[int | str]) -> onnx.ValueInfoProto:
    """An int64 graph input; string dims are symbolic."""
    return helper.make_tensor_value_info(name, TensorProto.INT64, list(dims))
