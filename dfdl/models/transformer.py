"""Pre-norm Transformer encoder classifier over token ids.

:func:`transformer` builds ``tokens (batch, seq) int64 -> logits (batch, num_classes)``:
token and learned positional embeddings, pre-norm encoder layers (multi-head
self-attention with dropout on its probabilities, a GELU feed-forward), a final
LayerNormalization, the mean over the sequence and a linear classifier. Any batch and
any sequence length up to ``seq`` fit the same model; the weights follow from ``seed``.

Example:
    >>> [i.name for i in transformer().graph.input]
    ['tokens']
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from dfdl.models._build import Builder, float_input, int64_input

_LN_EPS = 1e-5
_MASK = -1e9  # additive causal mask; finite so no inf - inf appears in any kernel


def transformer(
    vocab: int = 1000,
    d_model: int = 128,
    heads: int = 4,
    ff: int = 512,
    layers: int = 2,
    seq: int = 64,
    num_classes: int = 10,
    dropout: float = 0.1,
    seed: int = 0,
    opset: int = 21,
    causal: bool = False,
) -> onnx.ModelProto:
    """Builds ``tokens (batch, seq) int64 -> logits (batch, num_classes)``.

    Token embedding (Gather) + learned positional embedding (the first ``seq`` rows of a
    ``(seq, d_model)`` table, Slice'd to the input length) -> ``layers`` pre-norm encoder
    layers (multi-head self-attention, GELU feed-forward) -> LayerNormalization -> mean over
    the sequence -> linear classifier. Projections are MatMul + Add with weights stored
    (in, out). Dropout sits on the attention probabilities, ratio as a constant initializer.

    Args:
        vocab: vocabulary size.
        d_model: model width; must divide by ``heads``.
        heads: attention heads.
        ff: feed-forward hidden width.
        layers: encoder layers.
        seq: maximum sequence length (size of the positional table).
        num_classes: classifier outputs.
        dropout: attention-probability dropout ratio.
        seed: seed of the initial weights.
        opset: ONNX opset (17..21); Gelu needs 20, below it the exact Erf form is emitted.
        causal: mask attention to earlier positions.

    Returns:
        The checked model; parameter names match :class:`torch_twins.Transformer`'s state_dict.
    """
    if d_model % heads:
        raise ValueError(f"d_model {d_model} must divide by heads {heads}")
    dh = d_model // heads
    b = Builder("transformer", seed, opset)

    emb = b.op(
        "Gather", [b.normal("tok_emb.weight", [vocab, d_model]), "tokens"], "tok_emb", axis=0
    )
    # Slice the positional table (and causal mask) to the actual length: valid for any seq.
    length = b.op("Shape", ["tokens"], "seq_len", start=1, end=2)
    zero = b.const("zero", [0], np.int64)
    pos = b.op(
        "Slice",
        [b.normal("pos_emb", [seq, d_model], 0.02), zero, length, zero],
        "pos_emb.slice",
    )
    y = b.op("Add", [emb, pos], "embed")
    mask = None
    if causal:
        table = b.const("causal_mask", np.triu(np.full((seq, seq), _MASK), k=1))
        ends = b.op("Concat", [length, length], "mask_len", axis=0)
        mask = b.op("Slice", [table, b.const("zeros2", [0, 0], np.int64), ends], "mask.slice")

    for i in range(layers):
        p = f"layers.{i}"
        h = _layer_norm(b, y, f"{p}.ln1", d_model)
        h = _attention(b, h, f"{p}.attn", d_model, heads, dh, dropout, mask)
        y = b.op("Add", [y, h], f"{p}.residual1")
        h = _layer_norm(b, y, f"{p}.ln2", d_model)
        h = _gelu(b, b.dense(h, f"{p}.ff1", d_model, ff), f"{p}.gelu")
        h = b.dense(h, f"{p}.ff2", ff, d_model)
        y = b.op("Add", [y, h], f"{p}.residual2")

    y = _layer_norm(b, y, "norm", d_model)
    if opset >= 18:
        y = b.op("ReduceMean", [y, b.const("seq_axis", [1], np.int64)], "pool", keepdims=0)
    else:
        y = b.op("ReduceMean", [y], "pool", axes=[1], keepdims=0)
    y = b.rename(b.dense(y, "head", d_model, num_classes), "logits")
    return b.model(
        [int64_input("tokens", ["batch", "seq"])],
        [float_input("logits", ["batch", num_classes])],
    )


def _layer_norm(b: Builder, x: str, prefix: str, d: int) -> str:
    w = b.filled(f"{prefix}.weight", [d], 1.0)
    bias = b.filled(f"{prefix}.bias", [d], 0.0)
    return b.op("LayerNormalization", [x, w, bias], prefix, axis=-1, epsilon=_LN_EPS)


def _attention(
    b: Builder, x: str, p: str, d: int, heads: int, dh: int, dropout: float, mask: str | None
) -> str:
    # 0 copies batch/seq from the input, so the model stays valid for any batch and seq.
    split = b.const("split_heads", [0, 0, heads, dh], np.int64)
    q, k, v = (
        b.op("Reshape", [b.dense(x, f"{p}.{n}", d, d), split], f"{p}.{n}.split") for n in "qkv"
    )
    q = b.op("Transpose", [q], f"{p}.q.heads", perm=[0, 2, 1, 3])  # (b, h, s, dh)
    k = b.op("Transpose", [k], f"{p}.k.heads", perm=[0, 2, 3, 1])  # (b, h, dh, s)
    v = b.op("Transpose", [v], f"{p}.v.heads", perm=[0, 2, 1, 3])  # (b, h, s, dh)
    scores = b.op("MatMul", [q, k], f"{p}.scores")
    scores = b.op("Mul", [scores, b.const("attn_scale", 1.0 / math.sqrt(dh))], f"{p}.scale")
    if mask is not None:
        scores = b.op("Add", [scores, mask], f"{p}.mask")
    probs = b.op("Softmax", [scores], f"{p}.softmax", axis=-1)
    probs = b.op("Dropout", [probs, b.const("dropout_ratio", dropout)], f"{p}.dropout")
    ctx = b.op("MatMul", [probs, v], f"{p}.context")
    ctx = b.op("Transpose", [ctx], f"{p}.merge", perm=[0, 2, 1, 3])  # (b, s, h, dh)
    ctx = b.op("Reshape", [ctx, b.const("merge_heads", [0, 0, d], np.int64)], f"{p}.merge.reshape")
    return b.dense(ctx, f"{p}.out", d, d)


def _gelu(b: Builder, x: str, name: str) -> str:
    if b.opset >= 20:
        return b.op("Gelu", [x], name, approximate="none")
    # Exact GELU: 0.5 * x * (1 + erf(x / sqrt(2))).
    e = b.op(
        "Erf", [b.op("Div", [x, b.const("sqrt2", math.sqrt(2.0))], f"{name}.div")], f"{name}.erf"
    )
    e = b.op("Add", [e, b.const("one", 1.0)], f"{name}.add")
    e = b.op("Mul", [x, e], f"{name}.mul")
    return b.op("Mul", [e, b.const("half", 0.5)], f"{name}.half")
