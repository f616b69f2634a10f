"""Multi-layer perceptron: Gemm + Relu, torch ``nn.Linear`` layout.

:func:`mlp` builds ``x (batch, sizes[0]) -> logits (batch, sizes[-1])`` with a Relu
between layers; the batch axis is symbolic, and the weights follow from ``seed``.

Example:
    >>> m = mlp((4, 8, 3))
    >>> [i.name for i in m.graph.input], [o.name for o in m.graph.output]
    (['x'], ['logits'])
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from dfdl.models._build import Builder, float_input


def mlp(
    sizes: Sequence[int] = (784, 256, 256, 10), seed: int = 0, opset: int = 21
) -> onnx.ModelProto:
    """Builds an MLP ``x (batch, sizes[0]) -> logits (batch, sizes[-1])``.

    Args:
        sizes: layer widths, input first; ``len(sizes) - 1`` Gemm layers with Relu between.
        seed: seed of the initial weights.
        opset: ONNX opset (17..21).

    Returns:
        The checked model; parameters are ``layers.{i}.weight`` (out, in) and ``layers.{i}.bias``.
    """
    sizes = [int(s) for s in sizes]
    if len(sizes) < 2:
        raise ValueError("mlp needs at least an input and an output size")
    b = Builder("mlp", seed, opset)
    y = "x"
    n_layers = len(sizes) - 1
    for i in range(n_layers):
        y = b.gemm(y, f"layers.{i}", sizes[i], sizes[i + 1])
        if i < n_layers - 1:
            y = b.op("Relu", [y], f"layers.{i}.relu")
    b.rename(y, "logits")
    return b.model(
        [float_input("x", ["batch", sizes[0]])],
        [float_input("logits", ["batch", sizes[-1]])],
    )
