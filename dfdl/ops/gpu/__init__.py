"""cupy kernels for GPU workers, registered for device ``"gpu"``.

Importing this package needs neither cupy nor CUDA: the kernel modules import cupy when a
kernel first runs, on a GPU worker. The client imports it to lower a training step for
GPU workers (:meth:`dfdl.ops.registry.OpDef.kernel` with ``device="gpu"``); the tasks
carry references to the kernels, which the worker resolves.

On a GPU worker a tile's arrays live on the device (cupy arrays) from the first kernel
that touches them: numpy inputs (batches, scalars, the first step's weights) are copied
to the device by the kernel reading them. An op without a GPU kernel, or with one that
does not accept the tile (an integer tile, a layout it does not handle), runs its CPU
tile function on host copies of its inputs (:class:`~dfdl.ops.gpu.device.GpuDispatch`),
so every registered op runs on a GPU worker; :data:`~dfdl.ops.gpu.device.FALLBACKS`
counts those runs per op. Values that leave a GPU worker for the client (losses,
weights) are copied to the host first (:func:`~dfdl.ops.gpu.device.to_host`).

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["Gemm"].kernel("gpu")
    GpuDispatch(Gemm: gemm)
"""

from __future__ import annotations

from dfdl.ops.gpu import batch_norm, conv, device, kernels, layout, nn, pool  # noqa: F401
from dfdl.ops.registry import device_dispatch

device_dispatch("gpu", device.dispatch)
