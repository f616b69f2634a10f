"""The op registry and every op dfdl supports (importing this registers them all).

The op modules register the ops (shape, forward, tile, VJP, params and cost rules); then
the CPU kernel package registers its numba kernels by device. GPU kernels
(``dfdl.ops.gpu``) are registered only where a GPU worker imports them. :data:`REGISTRY`
maps an op's key (``"Relu"``, ``"dfdl.BatchNormMoments"``) to its
:class:`~dfdl.ops.registry.OpDef`; :func:`~dfdl.ops.registry.lookup` finds one by type
and domain. Every op's numpy forward is its reference: a device kernel runs only where
it accepts the tile's arrays.

Example:
    >>> import numpy as np
    >>> REGISTRY["Relu"].forward(np.array([-1.0, 2.0]))
    array([0., 2.])
"""

from __future__ import annotations

# one module per family, each registering its ops; ``cpu`` registers the CPU kernels
# (a kernel registered before its op waits for it: the order does not matter)
from dfdl.ops import (  # noqa: F401  (imported for registration)
    batch_norm,
    conv,
    cpu,
    dropout,
    einsum,
    elementwise,
    fold,
    indexing,
    layout,
    linalg,
    loss,
    lrn,
    masks,
    norm,
    optim,
    pad,
    pool,
    reduce,
    resize,
    softmax,
)
from dfdl.ops.registry import (
    REGISTRY,
    Cost,
    Kernel,
    OpDef,
    TensorType,
    TileContext,
    TileSpec,
    lookup,
    node_cost,
    register,
)

__all__ = [
    "REGISTRY",
    "Cost",
    "Kernel",
    "OpDef",
    "TensorType",
    "TileContext",
    "TileSpec",
    "lookup",
    "node_cost",
    "register",
]
