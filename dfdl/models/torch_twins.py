"""PyTorch twins of the zoo models, for cross-checking and for testing torch exports.

Each twin has the structure of its ONNX builder and a ``state_dict`` whose names and shapes
equal the builder's parameter initializers, so :func:`load_onnx_weights` makes the two
compute the same function. torch is imported lazily: this module imports without it, and
the classes (``MLP``, ``ResNet``, ``UNet3D``, ``Transformer``) are created on first access.
:func:`export` writes a twin through torch's exporter, for testing what torch exports.

Example:
    >>> import dfdl.models
    >>> m = dfdl.models.mlp((4, 3))
    >>> module = load_onnx_weights(twin("mlp", sizes=(4, 3)), m)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import inspect
import io
import math
import os
import types

import onnx
from onnx import numpy_helper

from dfdl.models import ZOO

_CLASS_NAMES = {"mlp": "MLP", "resnet": "ResNet", "unet3d": "UNet3D", "transformer": "Transformer"}


def twin(name: str, **model_kwargs):
    """The torch twin of ``dfdl.models.ZOO[name](**model_kwargs)``, in eval mode.

    ``seed`` and ``opset`` are accepted and ignored: weights come from
    :func:`load_onnx_weights`.
    """
    bound = inspect.signature(ZOO[name]).bind(**model_kwargs)
    bound.apply_defaults()
    kwargs = {k: v for k, v in bound.arguments.items() if k not in ("seed", "opset")}
    return getattr(_classes(), _CLASS_NAMES[name])(**kwargs).eval()


def load_onnx_weights(module, model: onnx.ModelProto):
    """Copies a zoo model's parameter initializers into ``module`` (in place) and returns it.

    Raises:
        KeyError: a twin parameter or buffer has no initializer, or a parameter-like
            initializer has no twin parameter.
        ValueError: shapes differ.
    """
    import torch

    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    state = {k: v for k, v in module.state_dict().items() if not k.endswith("num_batches_tracked")}
    if missing := sorted(set(state) - set(inits)):
        raise KeyError(f"no initializer for twin tensors {missing}")
    if extra := sorted(set(inits) - set(state)):
        raise KeyError(f"initializers without a twin tensor {extra}")
    with torch.no_grad():
        for key, dst in state.items():
            src = inits[key]
            if tuple(src.shape) != tuple(dst.shape):
                raise ValueError(f"{key}: initializer {src.shape} vs twin {tuple(dst.shape)}")
            dst.copy_(torch.from_numpy(src.copy()))
    return module


def export(
    module,
    example_input,
    path: str | os.PathLike | None = None,
    exporter: str = "dynamo",
    opset: int = 18,
) -> onnx.ModelProto:
    """Exports ``module`` with ``torch.onnx.export`` in eval mode, batch dimension dynamic.

    Uses the settings dfdl recommends: dynamo with ``optimize=False`` (keeps BatchNorm
    separate from Conv), or TorchScript with ``do_constant_folding=False``.

    Args:
        module: a twin (its train/eval mode is restored afterwards).
        example_input: one tensor (``x`` or ``tokens``) with batch size >= 2.
        path: where to write the ``.onnx`` file, or None to keep it in memory.
        exporter: "dynamo" or "torchscript".
        opset: opset to export at (dynamo needs >= 18).

    Returns:
        The exported model; input named like the builder's, output "logits".
    """
    import torch

    input_name = _input_name(module)
    kwargs = dict(input_names=[input_name], output_names=["logits"], opset_version=opset)
    was_training = module.training
    module.eval()
    try:
        if exporter == "dynamo":
            dims = {input_name: {0: torch.export.Dim("batch")}}
            program = torch.export.export(module, (example_input,), dynamic_shapes=dims)
            # onnxscript 0.7's aten.conv3d makes a rank-2 zero bias for bias=False convs,
            # which onnxruntime rejects (onnxscript#2931); aten.convolution is translated right.
            program = program.run_decompositions({torch.ops.aten.conv3d.default: _conv3d})
            program = torch.onnx.export(
                program, (example_input,), dynamo=True, optimize=False, **kwargs
            )
            if path is not None:
                program.save(os.fspath(path))
            return program.model_proto
        if exporter == "torchscript":
            buf = io.BytesIO()
            torch.onnx.export(
                module,
                (example_input,),
                buf,
                dynamo=False,
                dynamic_axes={input_name: {0: "batch"}, "logits": {0: "batch"}},
                training=torch.onnx.TrainingMode.EVAL,
                do_constant_folding=False,
                **kwargs,
            )
            if path is not None:
                with open(path, "wb") as f:
                    f.write(buf.getvalue())
            return onnx.load_from_string(buf.getvalue())
        raise ValueError(f"exporter must be 'dynamo' or 'torchscript', got {exporter!r}")
    finally:
        module.train(was_training)


def _conv3d(
    x, weight, bias=None, stride=(1, 1, 1), padding=(0, 0, 0), dilation=(1, 1, 1), groups=1
):
    import torch

    conv = torch.ops.aten.convolution.default
    return conv(x, weight, bias, stride, padding, dilation, False, [0, 0, 0], groups)


def _input_name(module) -> str:
    # The twins' forward argument is named like the builder's graph input ("x", "tokens").
    return next(iter(inspect.signature(module.forward).parameters))


def __getattr__(name: str):
    # Lazy class access (torch_twins.ResNet) without importing torch at module import.
    if name[:1].isupper() and not name.startswith("_"):
        try:
            return getattr(_classes(), name)
        except AttributeError:
            pass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _classes() -> types.SimpleNamespace:
    import torch
    from torch import nn
    from torch.nn import functional as F

    class MLP(nn.Module):
        """Twin of :func:`dfdl.models.mlp`."""

        def __init__(self, sizes=(784, 256, 256, 10)):
            super().__init__()
            pairs = zip(sizes[:-1], sizes[1:], strict=True)
            self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in pairs)

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i < len(self.layers) - 1:
                    x = F.relu(x)
            return x

    def conv_bn(c_in, c_out, nd, k=3, stride=1):
        conv = (nn.Conv2d, nn.Conv3d)[nd - 2]
        bn = (nn.BatchNorm2d, nn.BatchNorm3d)[nd - 2]
        return conv(c_in, c_out, k, stride, padding=k // 2, bias=False), bn(c_out)

    class BasicBlock(nn.Module):
        def __init__(self, c_in, c_out, stride):
            super().__init__()
            self.conv1, self.bn1 = conv_bn(c_in, c_out, 2, stride=stride)
            self.conv2, self.bn2 = conv_bn(c_out, c_out, 2)
            self.shortcut = None
            if stride != 1 or c_in != c_out:
                conv, bn = conv_bn(c_in, c_out, 2, k=1, stride=stride)
                self.shortcut = nn.ModuleDict({"conv": conv, "bn": bn})

        def forward(self, x):
            y = F.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            s = x if self.shortcut is None else self.shortcut.bn(self.shortcut.conv(x))
            return F.relu(y + s)

    class ResNet(nn.Module):
        """Twin of :func:`dfdl.models.resnet`."""

        def __init__(
            self,
            in_channels=3,
            image_size=32,
            stem=64,
            stages=(64, 128, 256),
            blocks_per_stage=2,
            num_classes=10,
        ):
            super().__init__()
            conv, bn = conv_bn(in_channels, stem, 2)
            self.stem = nn.ModuleDict({"conv": conv, "bn": bn})
            blocks, c_in = [], stem
            for s, c_out in enumerate(stages):
                stage = []
                for k in range(blocks_per_stage):
                    stage.append(BasicBlock(c_in, c_out, 2 if (s > 0 and k == 0) else 1))
                    c_in = c_out
                blocks.append(nn.ModuleList(stage))
            self.stages = nn.ModuleList(blocks)
            self.fc = nn.Linear(c_in, num_classes)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.stem.bn(self.stem.conv(x))), 2)
            for stage in self.stages:
                for block in stage:
                    x = block(x)
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    class DoubleConv(nn.Module):
        def __init__(self, c_in, c_out):
            super().__init__()
            self.conv1, self.bn1 = conv_bn(c_in, c_out, 3)
            self.conv2, self.bn2 = conv_bn(c_out, c_out, 3)

        def forward(self, x):
            return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))

    class UNet3D(nn.Module):
        """Twin of :func:`dfdl.models.unet3d`."""

        def __init__(self, in_channels=1, num_classes=2, base=16, levels=3, volume=32):
            super().__init__()
            chans = [base * 2**i for i in range(levels)]
            self.enc = nn.ModuleList(
                DoubleConv(a, c) for a, c in zip([in_channels] + chans[:-1], chans, strict=True)
            )
            self.up = nn.ModuleList(
                nn.ConvTranspose3d(chans[i + 1], chans[i], 2, 2) for i in range(levels - 1)
            )
            self.dec = nn.ModuleList(DoubleConv(2 * c, c) for c in chans[:-1])
            self.head = nn.Conv3d(chans[0], num_classes, 1)

        def forward(self, x):
            skips = []
            for i, enc in enumerate(self.enc):
                x = enc(F.max_pool3d(x, 2) if i > 0 else x)
                skips.append(x)
            for i in reversed(range(len(self.up))):
                x = self.dec[i](torch.cat([self.up[i](x), skips[i]], dim=1))
            return self.head(x)

    class Dense(nn.Module):
        # Weight stored (in, out), as the builder's MatMul + Add expects.
        def __init__(self, n_in, n_out):
            super().__init__()
            bound = 1.0 / math.sqrt(n_in)
            self.weight = nn.Parameter(torch.empty(n_in, n_out).uniform_(-bound, bound))
            self.bias = nn.Parameter(torch.empty(n_out).uniform_(-bound, bound))

        def forward(self, x):
            return torch.matmul(x, self.weight) + self.bias

    class Attention(nn.Module):
        def __init__(self, d, heads, dropout):
            super().__init__()
            self.heads, self.dh = heads, d // heads
            self.q, self.k, self.v, self.out = (Dense(d, d) for _ in range(4))
            self.dropout = nn.Dropout(dropout)

        def forward(self, x, mask):
            b, s, d = x.shape
            q = self.q(x).reshape(b, s, self.heads, self.dh).permute(0, 2, 1, 3)
            k = self.k(x).reshape(b, s, self.heads, self.dh).permute(0, 2, 3, 1)
            v = self.v(x).reshape(b, s, self.heads, self.dh).permute(0, 2, 1, 3)
            scores = torch.matmul(q, k) * (1.0 / math.sqrt(self.dh))
            if mask is not None:
                scores = scores + mask
            probs = self.dropout(torch.softmax(scores, dim=-1))
            ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(b, s, d)
            return self.out(ctx)

    class EncoderLayer(nn.Module):
        def __init__(self, d, heads, ff, dropout):
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.attn = Attention(d, heads, dropout)
            self.ln2 = nn.LayerNorm(d)
            self.ff1, self.ff2 = Dense(d, ff), Dense(ff, d)

        def forward(self, x, mask):
            x = x + self.attn(self.ln1(x), mask)
            return x + self.ff2(F.gelu(self.ff1(self.ln2(x))))

    class Transformer(nn.Module):
        """Twin of :func:`dfdl.models.transformer`."""

        def __init__(
            self,
            vocab=1000,
            d_model=128,
            heads=4,
            ff=512,
            layers=2,
            seq=64,
            num_classes=10,
            dropout=0.1,
            causal=False,
        ):
            super().__init__()
            self.tok_emb = nn.Embedding(vocab, d_model)
            self.pos_emb = nn.Parameter(torch.randn(seq, d_model) * 0.02)
            self.layers = nn.ModuleList(
                EncoderLayer(d_model, heads, ff, dropout) for _ in range(layers)
            )
            self.norm = nn.LayerNorm(d_model)
            self.head = Dense(d_model, num_classes)
            mask = torch.triu(torch.full((seq, seq), -1e9), diagonal=1) if causal else None
            self.register_buffer("causal_mask", mask, persistent=False)

        def forward(self, tokens):
            s = tokens.shape[1]
            x = self.tok_emb(tokens) + self.pos_emb[:s]
            mask = None if self.causal_mask is None else self.causal_mask[:s, :s]
            for layer in self.layers:
                x = layer(x, mask)
            return self.head(self.norm(x).mean(dim=1))

    classes = {k: v for k, v in locals().items() if isinstance(v, type)}
    for cls in classes.values():
        # Pickle finds them through this module's __getattr__.
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
    return types.SimpleNamespace(**classes)
