"""The op registry: one :class:`OpDef` per ONNX (or ``dfdl``-domain) op type.

Every rule about an op lives next to the op, in the module that registers it:

* ``shape``   -- static output types from input types, constant inputs and attributes;
* ``forward`` -- the numpy reference, with ONNX semantics (``def Gemm(A, B, C=None, *,
  alpha=1.0, ...)``), returning one array or a tuple of arrays (one per output); it is
  also every device's fallback;
* ``vjp``     -- graph-to-graph reverse rule (:func:`defvjp`);
* ``tile``    -- how the op's outputs split into tiles and which input regions each needs;
* ``params``  -- the op's resolved geometry for its kernels (pads, strides, statistics
  layout...), computed from the inputs and attributes of one tile;
* ``cost``    -- FLOPs and bytes of one node (:func:`node_cost`: the estimate, bench).

Kernels are not named by the op: a kernel module registers itself for a device with
:func:`kernel` (``dfdl.ops.cpu`` for numba kernels, ``dfdl.ops.gpu`` for cupy ones) and
never imports the op's module. :meth:`OpDef.kernel` gives the tile function of a device,
which runs the kernel where the kernel accepts the tile's arrays and the numpy forward
elsewhere.

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

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))


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
class Kernel:
    """One device's implementation of an op on a tile.

    Attributes:
        fn: ``fn(*inputs, **params)``: the tile's input arrays, in the op's input order
            (trailing absent optional inputs dropped, as for the forward), and the op's
            keyword parameters: what the op's ``params`` rule resolves from the node's
            attributes and the arrays, or the attributes themselves where the op has no
            such rule.
        accepts: ``accepts(*inputs, **attrs) -> bool``: whether ``fn`` handles these
            arrays (dtypes, ranks, layouts); where it does not, the op's numpy forward
            runs instead. None: every input.
    """

    fn: Callable
    accepts: Callable[..., bool] | None = None


@dataclass(frozen=True)
class Cost:
    """What one node costs: floating-point operations, and bytes read and written."""

    flops: int
    bytes: int


class Dispatch:
    """The tile function of an op on one device: the device's kernel where it accepts
    the arrays, the numpy forward elsewhere. Pickled by reference to its functions, so
    a task carries it to any worker.

    Example:
        >>> d = Dispatch(np.negative, np.abs, accepts=lambda x: x.dtype.kind == "f")
        >>> d(np.array([-1.0])), d(np.array([-1]))
        (array([1.]), array([1]))
    """

    __slots__ = ("accepts", "forward", "kernel", "params")

    def __init__(self, forward, kernel, accepts=None, params=None):
        self.forward = forward
        self.kernel = kernel
        self.accepts = accepts
        self.params = params

    def __call__(self, *inputs, **attrs):
        if self.accepts is not None and not self.accepts(*inputs, **attrs):
            return self.forward(*inputs, **attrs)
        if self.params is not None:
            return self.kernel(*inputs, **self.params(*inputs, **attrs))
        return self.kernel(*inputs, **attrs)

    def __reduce__(self):
        return Dispatch, (self.forward, self.kernel, self.accepts, self.params)

    def __repr__(self) -> str:
        return f"Dispatch({getattr(self.kernel, '__qualname__', self.kernel)})"


@dataclass(frozen=True)
class OpDef:
    """Everything dfdl knows about one op type (see the module docstring)."""

    name: str
    shape: ShapeRule
    forward: Callable
    tile: TileRule | None = None
    vjp: Callable | None = None
    kernels: Mapping[str, Kernel] = field(default_factory=dict)
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
    #: ``params(*inputs, **attrs) -> dict``: the keyword parameters of the op's kernels
    params: Callable | None = None
    #: ``cost(inputs, outputs, **attrs) -> Cost`` from static types (None: one FLOP per
    #: output element, every input and output read or written once)
    cost: Callable | None = None

    def kernel(self, device: str = "cpu") -> Callable:
        """The tile function for ``device``: on the CPU a :class:`Dispatch` to its kernel,
        or the numpy forward where no kernel is registered; on another device what that
        device's package makes of the op (:func:`device_dispatch`)."""
        if device != "cpu":
            return _device_dispatch(device)(self)
        k = self.kernels.get(device)
        if k is None:
            return self.forward
        return Dispatch(self.forward, k.fn, k.accepts, self.params)


#: device -> ``dispatch(op) -> tile function`` for devices other than the CPU
_DEVICE_DISPATCH: dict[str, Callable[[OpDef], Callable]] = {}


def device_dispatch(device: str, dispatch: Callable[[OpDef], Callable]) -> None:
    """Register how ``device``'s package turns an op into its tile function (its kernel,
    or a fallback where it has none): ``dfdl.ops.gpu`` registers ``"gpu"``."""
    _DEVICE_DISPATCH[device] = dispatch


def _device_dispatch(device: str) -> Callable[[OpDef], Callable]:
    if device not in _DEVICE_DISPATCH:
        import importlib

        try:  # the device's package registers itself when imported (without its library)
            importlib.import_module(f"dfdl.ops.{device}")
        except ModuleNotFoundError:
            pass
    if device not in _DEVICE_DISPATCH:
        raise ValueError(f"no kernels for device {device!r} (devices: cpu, gpu)")
    return _DEVICE_DISPATCH[device]


REGISTRY: dict[str, OpDef] = {}
#: kernels registered before their op (a kernel module imported first)
_PENDING: dict[str, dict[str, Kernel]] = {}


def _key(domain: str, name: str) -> str:
    return name if domain in ONNX_DOMAINS else f"{domain}.{name}"


def register(
    name: str,
    *,
    shape: ShapeRule,
    tile: TileRule | None = None,
    domain: str = "",
    fold_only: bool = False,
    differentiable: bool = True,
    const_inputs: tuple[int, ...] = (),
    vjp: Callable | None = None,
    contraction: bool = False,
    params: Callable | None = None,
    cost: Callable | None = None,
) -> Callable[[Callable], Callable]:
    """Decorator registering a numpy forward as the op ``name``.

    Example:
        >>> @register("Neg", shape=same_shape, tile=elementwise_tile)  # doctest: +SKIP
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
            kernels=_PENDING.pop(key, {}),
            domain=domain,
            fold_only=fold_only,
            differentiable=differentiable,
            const_inputs=tuple(const_inputs),
            vjp=vjp,
            contraction=contraction,
            params=params,
            cost=cost,
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
        >>> @defvjp("Neg")  # doctest: +SKIP
        ... def _neg_vjp(b, node, dys):
        ...     return [b.op("Neg", [dys[0]])]
    """

    def deco(fn: Callable) -> Callable:
        key = _key(domain, name)
        op = REGISTRY[key]
        REGISTRY[key] = OpDef(**{**op.__dict__, "vjp": fn})
        return fn

    return deco


def add_kernel(
    name: str,
    device: str,
    fn: Callable,
    *,
    accepts: Callable[..., bool] | None = None,
    domain: str = "",
) -> None:
    """Register ``fn`` as ``device``'s kernel of the op (see :class:`Kernel`).

    Example:
        >>> add_kernel("Relu", "cpu", relu, accepts=floats)  # doctest: +SKIP
    """
    key = _key(domain, name)
    k = Kernel(fn, accepts)
    op = REGISTRY.get(key)
    if op is None:
        _PENDING.setdefault(key, {})[device] = k
        return
    REGISTRY[key] = OpDef(**{**op.__dict__, "kernels": {**op.kernels, device: k}})


def kernel(
    name: str, device: str = "cpu", *, accepts: Callable[..., bool] | None = None, domain: str = ""
) -> Callable[[Callable], Callable]:
    """Decorator form of :func:`add_kernel`, used by the kernel modules.

    Example:
        >>> @kernel("Relu", accepts=floats)  # doctest: +SKIP
        ... def relu(X):
        ...     return _map(_relu, X)
    """

    def deco(fn: Callable) -> Callable:
        add_kernel(name, device, fn, accepts=accepts, domain=domain)
        return fn

    return deco


def lookup(name: str, domain: str = "") -> OpDef | None:
    """The OpDef for ``(domain, name)``, or None when dfdl does not support it."""
    return REGISTRY.get(_key(domain, name))


def node_cost(node, types: Mapping[str, TensorType]) -> Cost:
    """The :class:`Cost` of one IR node from the static types of its values: its op's
    ``cost`` rule, or one FLOP per element of its first output.

    Example:
        >>> node_cost(node, graph.types).flops  # doctest: +SKIP
    """
    ins = [types[i] if i else None for i in node.inputs]
    outs = [types[o] if o else None for o in node.outputs]
    op = lookup(node.op_type, node.domain)
    if op is not None and op.cost is not None:
        return op.cost(ins, outs, **node.attrs)
    return Cost(outs[0].size if outs and outs[0] is not None else 0, io_bytes(ins, outs))


def io_bytes(inputs, outputs) -> int:
    """Bytes of every present input and output (each read or written once)."""
    return sum(t.nbytes for t in (*inputs, *outputs) if t is not None)
