"""The op registry and every op dfdl supports (importing this registers them all)."""

from __future__ import annotations

# one module per family; each registers its ops on import
from dfdl.ops import (  # noqa: E402,F401  (imported for registration)
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
from dfdl.ops.registry import REGISTRY, OpDef, TensorType, TileContext, TileSpec, lookup, register

__all__ = ["REGISTRY", "OpDef", "TensorType", "TileContext", "TileSpec", "lookup", "register"]
