"""``prefer_wide_vectors`` marks only the kernel that calls it, and on an AVX-512 CPU
LLVM then vectorizes that kernel with 512-bit registers."""

from __future__ import annotations

import re

import numba
import numpy as np
import pytest

from dfdl.ops.cpu import conv_direct, gelu_f32
from dfdl.ops.cpu.vector_width import ATTRIBUTE, prefer_wide_vectors


@numba.njit(fastmath={"contract"})
def _axpy_wide(a, x, y):
    prefer_wide_vectors()
    for i in range(np.uint64(x.size)):
        y[i] += a * x[i]


@numba.njit(fastmath={"contract"})
def _axpy(a, x, y):
    for i in range(np.uint64(x.size)):
        y[i] += a * x[i]


def _compiled(fn):
    x = np.arange(100, dtype=np.float32)
    y = np.ones(100, np.float32)
    fn(np.float32(2), x, y)
    np.testing.assert_array_equal(y, 1 + 2 * np.arange(100, dtype=np.float32))
    sig = fn.signatures[0]
    return fn.inspect_llvm(sig), fn.inspect_asm(sig)


def test_only_the_calling_kernel_gets_the_attribute():
    wide_ir, _ = _compiled(_axpy_wide)
    plain_ir, _ = _compiled(_axpy)
    assert ATTRIBUTE in wide_ir
    assert ATTRIBUTE not in plain_ir


def test_the_compute_bound_kernels_ask_for_wide_vectors():
    x = np.ones((1, 8, 4, 6, 6), np.float32)
    w = np.ones((8, 8, 3, 3, 3), np.float32)
    conv_direct.conv(x, w, [1] * 3, [1] * 3)
    conv_direct.conv_grad_weight(x, x, [1] * 3, [1] * 3, (3, 3, 3))
    flat = x.reshape(-1)
    gelu_f32.gelu(flat, np.empty_like(flat))
    gelu_f32.gelu_grad(flat, flat, np.empty_like(flat))
    kernels = (
        conv_direct._stencil,
        conv_direct._stencil_grad_weight,
        gelu_f32.gelu,
        gelu_f32.gelu_grad,
    )
    for kernel in kernels:
        # a fresh, uncached compile of the same source and options (cached code has no IR)
        options = {k: v for k, v in kernel.targetoptions.items() if k not in ("cache", "nopython")}
        fresh = numba.njit(**options)(kernel.py_func)
        sig = kernel.signatures[0]
        fresh.compile(sig)
        assert ATTRIBUTE in fresh.inspect_llvm(sig)


def _has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512f" in f.read()
    except OSError:
        return False


def _host_prefers_256_bit() -> bool:
    """Whether LLVM tunes this host for 256-bit vectors: its Intel AVX-512 CPUs, not AMD's
    Zen 4 and 5 (``znver4``, ``znver5``), where 512-bit vectors are the default."""
    import llvmlite.binding as llvm

    return not llvm.get_host_cpu_name().startswith("znver")


@pytest.mark.skipif(not _has_avx512(), reason="the CPU has no AVX-512")
def test_on_avx512_the_wide_kernel_uses_zmm_registers():
    _, wide_asm = _compiled(_axpy_wide)
    _, plain_asm = _compiled(_axpy)
    fma = r"vfmadd\w*ps\s[^\n]*%{}"
    assert re.search(fma.format("zmm"), wide_asm)
    if _host_prefers_256_bit():  # the attribute is what changes the width
        assert not re.search(fma.format("zmm"), plain_asm)
