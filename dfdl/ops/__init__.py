"""The op registry and every op dfdl supports (importing this registers them all).

The op modules register the ops (shape, forward, tile, VJP, params and cost rules); then
the CPU kernel package registers its numba kernels by device. GPU kernels
(``dfdl.ops.gpu``) are registered only where a GPU worker imports them.
"""

from __future__ import annotations

# one module per family; each registers its ops on import, then the CPU kernels register
from dfdl.ops import (  # noqa: F401  (imported for registration)
    batch_norm_split,
    conv,
    elementwise,
    fold,
    layout,
    linalg,
    loss,
    norm,
    optim,
    pool,
    reduce,
    resize,
)
from dfdl.ops.cpu import linalg as _cpu_linalg  # noqa: F401,I001  (after the ops)
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
