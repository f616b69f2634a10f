"""Einsum (opset 12 to 28): the product of the operands summed over the labels that are
not in the output, written in Einstein notation (``"bhqd,bhkd->bhqk"``).

Semantics as ``numpy.einsum`` (ONNX's reference): labels are ASCII letters (case
matters); ``...`` stands for the same broadcast axes in every term (right-aligned, sizes
1 broadcast); without ``->`` the output is ``...`` followed by the labels that appear
exactly once, sorted. A label repeated in one term takes a diagonal; a label of size 1
in one operand broadcasts against the others.

Tiling is dask's blockwise rule read off the equation (:func:`einsum_terms`, with ``...``
spelled out as labels): every label is a tile letter shared by the operands that carry
it, and the labels the output lacks are contracted, their tiles' partial products summed
by the planner's tree. A repeated label's tile reads the matching diagonal block.

VJPs are Einsums: an operand's gradient is the einsum of ``dY`` with the other operands
into the operand's labels. Labels that only this operand carries get a constant vector of
ones (the gradient spreads over them); a label repeated in the operand gets a fresh label
tied to it by a constant identity matrix (the gradient lands on the diagonal); broadcast
axes are summed down by the autodiff driver.

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["Einsum"].forward(np.eye(2), np.ones((2, 3)), equation="ij,jk->ik").shape
    (2, 3)
"""

from __future__ import annotations

import math
import string
from collections import Counter

import numpy as np

from dfdl.errors import ModelError, ShapeError, UnsupportedOpError
from dfdl.ops.registry import Cost, TensorType, TileContext, TileSpec, defvjp, io_bytes, register

#: the labels an equation may use
LABELS = string.ascii_letters


def _term_labels(term: str, equation: str) -> tuple[str, bool]:
    """A term's labels without its ``...``, and whether it has one."""
    ellipsis = "..." in term
    rest = term.replace("...", "", 1)
    bad = [c for c in rest if c not in LABELS]
    if bad:
        raise ModelError(f"Einsum: invalid character {bad[0]!r} in equation {equation!r}")
    return rest, ellipsis


def einsum_terms(equation: str, ranks) -> tuple[list[str], str]:
    """The input terms and the output term of ``equation`` for operands of ``ranks``,
    with ``...`` spelled out as labels the equation does not use.

    Example:
        >>> einsum_terms("...ij,...jk", [3, 2])
        (['Aij', 'jk'], 'Aik')
    """
    eq = equation.replace(" ", "")
    if eq.count("->") > 1:
        raise ModelError(f"Einsum: equation {equation!r} has more than one '->'")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ModelError(
            f"Einsum: equation {equation!r} has {len(terms)} terms for {len(ranks)} inputs"
        )
    used = {c for c in eq if c in LABELS}
    free = [c for c in LABELS if c not in used]
    parsed, ell = [], 0
    for term, rank in zip(terms, ranks, strict=True):
        labels, has = _term_labels(term, equation)
        extra = rank - len(labels)
        if extra < 0 or (extra and not has):
            raise ShapeError(
                f"Einsum: term {term!r} of {equation!r} does not fit an input of rank {rank}"
            )
        parsed.append((term, extra))
        ell = max(ell, extra)
    if ell > len(free):
        raise UnsupportedOpError(
            f"Einsum: {equation!r} needs more than {len(LABELS)} labels", op_type="Einsum"
        )
    names = "".join(free[:ell])
    inputs = [term.replace("...", names[ell - extra :], 1) for term, extra in parsed]
    if not arrow:
        counts = Counter(c for term, _ in parsed for c in _term_labels(term, equation)[0])
        return inputs, names + "".join(sorted(c for c, n in counts.items() if n == 1))
    labels, has = _term_labels(rhs, equation)
    if ell and not has:
        raise ModelError(
            f"Einsum: the output of {equation!r} has no '...' for the inputs' broadcast axes"
        )
    output = rhs.replace("...", names, 1)
    seen = set("".join(inputs))
    for c in labels:
        if c not in seen:
            raise ModelError(f"Einsum: output label {c!r} of {equation!r} is in no input")
    if len(set(output)) != len(output):
        raise ModelError(f"Einsum: the output of {equation!r} repeats a label")
    return inputs, output


def label_sizes(terms: list[str], shapes) -> dict[str, int]:
    """Each label's size (broadcast over operands; a repeated label's axes must agree
    within an operand).

    Example:
        >>> label_sizes(["ij", "jk"], [(2, 3), (1, 4)])
        {'i': 2, 'j': 3, 'k': 4}
    """
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes, strict=True):
        own: dict[str, int] = {}
        for c, d in zip(term, shape, strict=True):
            if own.setdefault(c, d) != d:
                raise ShapeError(f"Einsum: label {c!r} has sizes {own[c]} and {d} in one input")
            prev = sizes.get(c)
            if prev is None or prev == 1:
                sizes[c] = d
            elif d not in (1, prev):
                raise ShapeError(f"Einsum: label {c!r} has sizes {prev} and {d}")
    return sizes


def _einsum_shape(inputs, consts, *, equation, **attrs):
    if not inputs:
        raise ModelError("Einsum: needs at least one input")
    dtype = inputs[0].dtype
    if any(t.dtype != dtype for t in inputs):
        raise ShapeError(f"Einsum: input dtypes differ ({[str(t.dtype) for t in inputs]})")
    terms, output = einsum_terms(equation, [t.rank for t in inputs])
    sizes = label_sizes(terms, [t.shape for t in inputs])
    return [TensorType(tuple(sizes[c] for c in output), dtype)]


def _einsum_tile(ctx: TileContext) -> TileSpec:
    terms, output = einsum_terms(ctx.attrs["equation"], [t.rank for t in ctx.inputs])
    contracted = set("".join(terms)) - set(output)
    return TileSpec(inputs=tuple(terms), outputs=(output,), reduce=dict.fromkeys(contracted, "sum"))


def _einsum_cost(inputs, outputs, *, equation, **attrs) -> Cost:
    terms, _ = einsum_terms(equation, [t.rank for t in inputs])
    points = math.prod(label_sizes(terms, [t.shape for t in inputs]).values())
    # a multiply per operand after the first and an add, at every point of the label grid
    return Cost(max(1, len(inputs)) * points, io_bytes(inputs, outputs))


@register("Einsum", shape=_einsum_shape, tile=_einsum_tile, contraction=True, cost=_einsum_cost)
def Einsum(*Inputs, equation):
    """``numpy.einsum(equation, *Inputs)`` in the inputs' dtype (see the module
    docstring for the notation)."""
    arrays = [np.asarray(x) for x in Inputs]
    einsum_terms(equation, [a.ndim for a in arrays])  # ONNX's rules, with dfdl's errors
    out = np.einsum(equation.replace(" ", ""), *arrays, optimize=True)
    return np.asarray(out).astype(arrays[0].dtype, copy=False)


@defvjp("Einsum")
def _einsum_vjp(b, node, dys):
    types = [b.type(i) for i in node.inputs]
    terms, output = einsum_terms(node.attrs["equation"], [t.rank for t in types])
    used = set("".join(terms)) | set(output)
    free = iter(c for c in LABELS if c not in used)
    grads = []
    for k, (x, term) in enumerate(zip(types, terms, strict=True)):
        if x.dtype.kind != "f":
            grads.append(None)
            continue
        operands = [dys[0]] + [n for j, n in enumerate(node.inputs) if j != k]
        parts = [output] + [t for j, t in enumerate(terms) if j != k]
        have = set("".join(parts))
        target = ""
        for axis, c in enumerate(term):
            if c in target:  # a diagonal: a fresh label, tied to c by an identity matrix
                fresh = next(free, None)
                if fresh is None:
                    raise UnsupportedOpError(
                        f"Einsum: the gradient of {node.attrs['equation']!r} needs more than "
                        f"{len(LABELS)} labels",
                        op_type="Einsum",
                    )
                operands.append(b.const(np.eye(x.shape[axis], dtype=x.dtype), hint="eye"))
                parts.append(c + fresh)
                target += fresh
                continue
            if c not in have:  # summed over this operand alone: dY spreads over the axis
                operands.append(b.const(np.ones(x.shape[axis], dtype=x.dtype), hint="ones"))
                parts.append(c)
                have.add(c)
            target += c
        grads.append(b.op("Einsum", operands, {"equation": ",".join(parts) + "->" + target}))
    return grads
