"""Small ResNet (basic blocks) for images, torch ``nn.Conv2d``/``nn.BatchNorm2d`` layout.

:func:`resnet` builds ``x (batch, in_channels, image_size, image_size) -> logits (batch,
num_classes)``: a 3x3 stem with BatchNormalization, Relu and a 2x2 max pool, then
stages of basic blocks (3x3 convolutions with BatchNormalization and Relu, 1x1
projection shortcuts where channels or stride change), global average pooling and a
Gemm head.
The weights follow from ``seed``.

Example:
    >>> [o.name for o in resnet().graph.output]
    ['logits']
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from dfdl.models._build import Builder, float_input


def resnet(
    in_channels: int = 3,
    image_size: int = 32,
    stem: int = 64,
    stages: Sequence[int] = (64, 128, 256),
    blocks_per_stage: int = 2,
    num_classes: int = 10,
    seed: int = 0,
    opset: int = 21,
) -> onnx.ModelProto:
    """Builds a ResNet ``x (batch, in_channels, H, W) -> logits (batch, num_classes)``.

    Stem: conv 3x3 -> BN -> Relu -> MaxPool 2x2. Each stage has ``blocks_per_stage`` basic
    blocks; the first block of every stage after the first halves the resolution (stride 2),
    and a 1x1 conv + BN projects the shortcut whenever channels or stride change.

    Args:
        in_channels: image channels.
        image_size: H = W of the input (the graph declares it statically).
        stem: stem conv channels.
        stages: output channels per stage.
        blocks_per_stage: basic blocks in each stage.
        num_classes: classifier outputs.
        seed: seed of the initial weights.
        opset: ONNX opset (17..21).

    Returns:
        The checked model; parameter names match :class:`torch_twins.ResNet`'s state_dict.
    """
    b = Builder("resnet", seed, opset)
    y = b.conv("x", "stem.conv", in_channels, stem, [3, 3], pad=1)
    y = b.batch_norm(y, "stem.bn", stem)
    y = b.op("Relu", [y], "stem.relu")
    y = b.op("MaxPool", [y], "stem.pool", kernel_shape=[2, 2], strides=[2, 2])
    c_in = stem
    for s, c_out in enumerate(stages):
        for k in range(blocks_per_stage):
            stride = 2 if (s > 0 and k == 0) else 1
            y = _basic_block(b, y, f"stages.{s}.{k}", c_in, c_out, stride)
            c_in = c_out
    y = b.op("GlobalAveragePool", [y], "pool")
    y = b.op("Flatten", [y], "flatten", axis=1)
    y = b.rename(b.gemm(y, "fc", c_in, num_classes), "logits")
    return b.model(
        [float_input("x", ["batch", in_channels, image_size, image_size])],
        [float_input("logits", ["batch", num_classes])],
    )


def _basic_block(b: Builder, x: str, prefix: str, c_in: int, c_out: int, stride: int) -> str:
    y = b.conv(x, f"{prefix}.conv1", c_in, c_out, [3, 3], stride=stride, pad=1)
    y = b.op("Relu", [b.batch_norm(y, f"{prefix}.bn1", c_out)], f"{prefix}.relu1")
    y = b.conv(y, f"{prefix}.conv2", c_out, c_out, [3, 3], pad=1)
    y = b.batch_norm(y, f"{prefix}.bn2", c_out)
    shortcut = x
    if stride != 1 or c_in != c_out:
        shortcut = b.conv(x, f"{prefix}.shortcut.conv", c_in, c_out, [1, 1], stride=stride)
        shortcut = b.batch_norm(shortcut, f"{prefix}.shortcut.bn", c_out)
    y = b.op("Add", [y, shortcut], f"{prefix}.add")
    return b.op("Relu", [y], f"{prefix}.relu2")
