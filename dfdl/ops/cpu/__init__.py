"""numba kernels for CPU workers: each module registers its kernels for device "cpu".

Kernels receive tile arrays and the op's resolved parameters (:class:`dfdl.ops.registry.
Kernel`); they never import the op modules, and the registry falls back to an op's numpy
forward wherever a kernel does not accept the arrays.
"""

from __future__ import annotations

from dfdl.ops.cpu import (  # noqa: F401  (imported for registration)
    batch_norm,
    conv,
    dropout,
    elementwise,
    layout,
    linalg,
    loss,
    lrn,
    norm,
    optim,
    pool,
    resize,
    softmax,
)
