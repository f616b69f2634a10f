"""The op registry: one :class:`OpDef` per ONNX (or ``dfdl``-domain) op type.

Every rule about an op lives next to the op, in the module that registers it:

* ``shape``   -- static output types from input types, constant inputs and attributes;
* ``forward`` -- the numpy reference, with ONNX semantics (``def Gemm(A, B, C=None, *,
  alpha=1.0, ...)``), returning one array or a tuple of arrays (one per output);
* ``vjp``     -- graph-to-graph reverse rule (filled in by the training work);
* ``tile``    -- how the op's outputs split into tiles and which input regions each needs;
* ``kernels`` -- drop-in replacements for ``forward`` per device (``{"cpu": fn}``).

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["Relu"].forward(np.array([-1.0, 2.0]))
    array([0., 2.])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: ONNX default domain names (both spellings appear in real files).
ONNX_DOMAINS = ("", "ai.onnx")
DFDL_DOMAIN = "dfdl"


@dataclass(frozen=True)
class TensorType:
    """Static type of a tensor: a concrete shape and a numpy dtype."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class TileSpec:
    """How one node's tiles relate to its inputs' and outputs' tiles.

    Written in dask's blockwise index notation: each tensor gets one character per
    axis. Axes sharing a letter are tiled alike; a letter present in inputs but in no
    output is *contracted*: each tile of it produces a partial output, and partials are
    combined by a tree reduction with ``reduce[letter]`` (``"sum"``, ``"max"``,
    ``"min"``). The character ``"."`` marks an axis that is never split (the whole axis
    is given to every tile). ``None`` for an input means "pass the whole tensor"
    (parameters such as a Reshape's target shape). An input axis of size 1 under a
    letter whose size is larger is a broadcast axis and always receives its one
    element.

    Attributes:
        inputs: one spec string (or None) per node input, in order.
        outputs: one spec string per node output, in order.
        reduce: combine operation per contracted letter.
        first_only: indices of inputs given only to the first tile of a contraction
            (bias terms, which must be added once); the other tiles get ``None``.
        adjust: optional ``adjust(attrs, consts, out_regions) -> (attrs, consts)`` that
            rewrites attributes and whole-tensor inputs for one tile (for example a
            Reshape's target shape, which must become the tile's shape). ``consts``
            maps input index to value for inputs whose spec is ``None``;
            ``out_regions`` holds one tuple of slices per output, in global
            coordinates.
        windows: halo reads. For ``(input index, axis)`` whose spec character is a
            letter, ``fn(lo, hi) -> (start, stop)`` gives the input range a tile reads
            when the letter's tile is ``[lo, hi)`` (in the letter's coordinates:
            convolution outputs, say). The range may reach past either end of the
            input; lowering clips it and hands the task exactly that slab, assembled
            from the producer tiles it overlaps. The axis need not have the letter's
            size (strides, kernels); it does not size the letter.
        spatial: the spec's spatial letters, outermost first. The planner splits the
            first one into slabs (``tiles={"space": s}``); ``"uneven"`` splits all.
        tile_attrs: optional ``tile_attrs(attrs, ranges) -> attrs`` run per task with
            ``ranges[letter] = (lo, hi)`` for every letter of the task (outputs' and
            contracted ones): the tile's own pads, for instance.
    """

    inputs: tuple[str | None, ...]
    outputs: tuple[str, ...]
    reduce: Mapping[str, str] = field(default_factory=dict)
    first_only: frozenset[int] = frozenset()
    adjust: Callable | None = None
    windows: Mapping[tuple[int, int], Callable[[int, int], tuple[int, int]]] = field(
        default_factory=dict
    )
    spatial: str = ""
    tile_attrs: Callable | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "first_only", frozenset(self.first_only))

    def contracted(self) -> list[str]:
        """Letters that appear in inputs but in no output, in first-seen order."""
        out = set("".join(self.outputs))
        seen: list[str] = []
        for spec in self.inputs:
            for ch in spec or "":
                if ch != "." and ch not in out and ch not in seen:
                    seen.append(ch)
        return seen


@dataclass(frozen=True)
class TileContext:
    """What a tile rule may look at: the node's static types, constants and attrs."""

    inputs: tuple[TensorType | None, ...]
    outputs: tuple[TensorType, ...]
    consts: tuple[np.ndarray | None, ...]
    attrs: Mapping[str, Any]


ShapeRule = Callable[..., list[TensorType]]
TileRule = Callable[[TileContext], TileSpec]


@dataclass(frozen=True)
class OpDef:
    """Everything dfdl knows about one op type (see the module docstring)."""

    name: str
    shape: ShapeRule
    forward: Callable
    tile: TileRule | None = None
    vjp: Callable | None = None
    kernels: Mapping[str, Callable] = field(default_factory=dict)
    domain: str = ""
    #: ops on the shape/constant path (Shape, Constant...): folded, never run as tasks
    fold_only: bool = False
    #: False for ops whose outputs carry no gradient (comparisons, ArgMax, Shape...)
    differentiable: bool = True
    #: inputs that must be known at plan time (a Reshape's shape, Slice's starts...)
    const_inputs: tuple[int, ...] = ()
    #: a GEMM-class contraction (MatMul, Conv...): its tasks are never fused into their
    #: consumer (:mod:`dfdl.taskgraph.fuse`); they are long enough to carry their own overhead
    contraction: bool = False

    def kernel(self, device: str = "cpu") -> Callable:
        """The tile function for ``device``: its kernel, or the numpy forward."""
        return self.kernels.get(device, self.forward)


REGISTRY: dict[str, OpDef] = {}


def _key(domain: str, name: str) -> str:
    return name if domain in ONNX_DOMAINS else f"{domain}.{name}"


def register(
    name: str,
    *,
    shape: ShapeRule,
    tile: TileRule | None = None,
    kernels: Mapping[str, Callable] | None = None,
    domain: str = "",
    fold_only: bool = False,
    differentiable: bool = True,
    const_inputs: tuple[int, ...] = (),
    vjp: Callable | None = None,
    contraction: bool = False,
) -> Callable[[Callable], Callable]:
    """Decorator registering a numpy forward as the op ``name``.

    Example:
        >>> @register("Neg", shape=same_shape, tile=elementwise_tile)
        ... def Neg(X):
        ...     return np.negative(X)
    """

    def deco(fn: Callable) -> Callable:
        key = _key(domain, name)
        if key in REGISTRY:
            raise ValueError(f"op {key} registered twice")
        REGISTRY[key] = OpDef(
            name=name,
            shape=shape,
            forward=fn,
            tile=tile,
            kernels=dict(kernels or {}),
            domain=domain,
            fold_only=fold_only,
            differentiable=differentiable,
            const_inputs=tuple(const_inputs),
            vjp=vjp,
            contraction=contraction,
        )
        return fn

    return deco


def defvjp(name: str, domain: str = "") -> Callable[[Callable], Callable]:
    """Decorator attaching a VJP rule to a registered op (written next to the op).

    A VJP rule is ``vjp(b, node, dys) -> list`` where ``b`` is a
    :class:`dfdl.training.autodiff.GradBuilder`, ``node`` the forward IR node and ``dys``
    the gradient value name of each node output (None where no gradient flows). It
    returns, per node input, the name of the gradient value (None for no gradient),
    built from registry ops with ``b.op(...)``. Gradients may keep the broadcast shape
    of the output: the autodiff driver reduces them to the input's shape.

    Example:
        >>> @defvjp("Neg")
        ... def _neg_vjp(b, node, dys):
        ...     return [b.op("Neg", [dys[0]])]
    """

    def deco(fn: Callable) -> Callable:
        key = _key(domain, name)
        op = REGISTRY[key]
        REGISTRY[key] = OpDef(**{**op.__dict__, "vjp": fn})
        return fn

    return deco


def add_kernel(name: str, device: str, fn: Callable, domain: str = "") -> None:
    """Attach a device kernel to an already registered op (kernels live in ops/cpu)."""
    op = REGISTRY[_key(domain, name)]
    kernels = dict(op.kernels)
    kernels[device] = fn
    REGISTRY[_key(domain, name)] = OpDef(**{**op.__dict__, "kernels": kernels})


def lookup(name: str, domain: str = "") -> OpDef | None:
    """The OpDef for ``(domain, name)``, or None when dfdl does not support it."""
    return REGISTRY.get(_key(domain, name))
