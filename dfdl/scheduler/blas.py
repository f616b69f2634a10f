"""Which OpenBLAS kernels the workers run: a fix for CPUs OpenBLAS does not recognise.

numpy's OpenBLAS picks its GEMM kernels from the CPU it detects at load time. On CPUs
newer than the OpenBLAS build (AMD Zen 4/5 here) it falls back to the AVX2 "Haswell"
kernels although the CPU has AVX-512: measured here, a float32 4096^2 matmul ran at
225 GFLOP/s on 2 cores with the detected kernels and at 439 with ``SkylakeX`` (the
3x3 convolutions of the ResNet benchmark went from 88 to 134-148 GFLOP/s per core).
OpenBLAS reads ``OPENBLAS_CORETYPE`` once, when it loads, so the override is given to
the worker processes before they start (the embedded cluster does it; for a cluster
you start yourself, export the variable in the workers' environment).

Example:
    >>> env = worker_environ()  # {} where OpenBLAS already uses the best kernels
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

#: OpenBLAS core types whose kernels use AVX-512 (lower case).
AVX512_CORES = frozenset({"skylakex", "cooperlake", "sapphirerapids"})
#: the CPU features OpenBLAS's SkylakeX kernels need.
SKYLAKEX_FLAGS = frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU feature flags of this machine (empty where /proc/cpuinfo is absent)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def openblas_architectures() -> list[str]:
    """The core type each OpenBLAS loaded in this process chose (via threadpoolctl)."""
    import numpy  # noqa: F401  (loads numpy's OpenBLAS, so threadpoolctl can see it)

    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [
        str(info.get("architecture") or "")
        for info in threadpool_info()
        if info.get("internal_api") == "openblas"
    ]


def openblas_coretype(
    flags: Iterable[str] | None = None,
    architectures: Iterable[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """The ``OPENBLAS_CORETYPE`` worker processes should load OpenBLAS with.

    Args:
        flags: CPU feature flags (default: this machine's).
        architectures: the core types OpenBLAS chose (default: this process's).
        environ: the environment (default ``os.environ``); a ``OPENBLAS_CORETYPE``
            already set there is the user's choice and is kept.

    Returns:
        ``"SkylakeX"`` where the CPU has AVX-512 and OpenBLAS chose kernels without
        it, else ``None`` (leave OpenBLAS's choice).

    Example:
        >>> openblas_coretype({"avx2"}, ["Haswell"], {})  # no AVX-512: keep Haswell
        >>> openblas_coretype(SKYLAKEX_FLAGS, ["Haswell"], {})
        'SkylakeX'
    """
    environ = os.environ if environ is None else environ
    if environ.get("OPENBLAS_CORETYPE"):
        return None
    flags = cpu_flags() if flags is None else frozenset(flags)
    if not SKYLAKEX_FLAGS <= flags:
        return None
    chosen = [a for a in (openblas_architectures() if architectures is None else architectures) if a]
    if not chosen or all(a.lower() in AVX512_CORES for a in chosen):
        return None
    return "SkylakeX"


def worker_environ() -> dict[str, str]:
    """Environment variables worker processes should start with for fast BLAS.

    Example:
        >>> sorted(worker_environ())  # doctest: +SKIP
        ['OPENBLAS_CORETYPE']
    """
    core = openblas_coretype()
    return {"OPENBLAS_CORETYPE": core} if core else {}
