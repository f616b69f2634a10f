"""3-D U-Net for volumes, torch ``nn.Conv3d``/``nn.ConvTranspose3d`` layout.

:func:`unet3d` builds ``x (batch, in_channels, D, H, W) -> logits (batch, num_classes,
D, H, W)``: per level two 3x3x3 convolutions with BatchNormalization and Relu, 2x2x2 max
pools going down, 2x2x2 transposed convolutions and concatenated skips going up, and a
1x1x1 convolution to the classes. The weights follow from ``seed``.

Example:
    >>> [o.name for o in unet3d().graph.output]
    ['logits']
"""

from __future__ import annotations

import onnx

from dfdl.models._build import Builder, float_input


def unet3d(
    in_channels: int = 1,
    num_classes: int = 2,
    base: int = 16,
    levels: int = 3,
    volume: int = 32,
    seed: int = 0,
    opset: int = 21,
) -> onnx.ModelProto:
    """Builds a 3-D U-Net ``x (batch, in_channels, D, H, W) -> logits (batch, classes, D, H, W)``.

    Level ``i`` has ``base * 2**i`` channels and two (conv 3x3x3 -> BN -> Relu); levels are
    joined by MaxPool 2x2x2 going down and ConvTranspose 2x2x2 stride 2 + channel Concat with
    the skip going up; a 1x1x1 conv maps to classes.

    Args:
        in_channels: input channels.
        num_classes: output channels.
        base: channels of the first level.
        levels: resolution levels (``levels - 1`` poolings); ``volume`` must divide by
            ``2**(levels - 1)``.
        volume: D = H = W of the input (the graph declares it statically).
        seed: seed of the initial weights.
        opset: ONNX opset (17..21).

    Returns:
        The checked model; parameter names match :class:`torch_twins.UNet3D`'s state_dict.
    """
    if levels < 1 or volume % 2 ** (levels - 1):
        raise ValueError(
            f"volume {volume} must be divisible by 2**(levels-1) = {2 ** (levels - 1)}"
        )
    b = Builder("unet3d", seed, opset)
    chans = [base * 2**i for i in range(levels)]
    skips = []
    y, c_in = "x", in_channels
    for i, c in enumerate(chans):
        if i > 0:
            y = b.op("MaxPool", [y], f"down.{i}", kernel_shape=[2] * 3, strides=[2] * 3)
        y = _double_conv(b, y, f"enc.{i}", c_in, c)
        skips.append(y)
        c_in = c
    for i in reversed(range(levels - 1)):
        y = b.conv_transpose(y, f"up.{i}", chans[i + 1], chans[i], 2, 3)
        y = b.op("Concat", [y, skips[i]], f"cat.{i}", axis=1)
        y = _double_conv(b, y, f"dec.{i}", 2 * chans[i], chans[i])
    y = b.rename(b.conv(y, "head", chans[0], num_classes, [1] * 3, bias=True), "logits")
    vol = [volume] * 3
    return b.model(
        [float_input("x", ["batch", in_channels, *vol])],
        [float_input("logits", ["batch", num_classes, *vol])],
    )


def _double_conv(b: Builder, x: str, prefix: str, c_in: int, c_out: int) -> str:
    y = b.conv_bn_relu(x, prefix, 1, c_in, c_out, 3)
    return b.conv_bn_relu(y, prefix, 2, c_out, c_out, 3)
