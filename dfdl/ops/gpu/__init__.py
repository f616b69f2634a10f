"""cupy kernels for GPU workers (planned).

Nothing here is imported by ``import dfdl``: GPU kernels are imported lazily on workers
that have a GPU, so dfdl installs and runs on machines without cupy or CUDA.
"""
