"""dfdl.ops.cpu.blas: products against a float64 numpy reference for every operand
layout, MKL taking the layouts it can read in place, and the choice of library."""

import ctypes
import gc
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from dfdl.errors import DfdlError
from dfdl.ops import REGISTRY
from dfdl.ops.cpu import blas
from tests.ops.test_registry import CASES, assert_matches


def use_mkl(monkeypatch):
    """MKL for this test. Skipped where it is not installed, and in a process that
    imported torch, where test_mkl_tests_pass_in_a_process_without_torch runs it."""
    if blas._find_mkl() is None:
        pytest.skip("Intel MKL is not installed (pip install dfdl[mkl])")
    if "torch" in sys.modules:
        pytest.skip("torch is imported here; a fresh process runs the MKL tests")
    monkeypatch.setenv(blas.ENV, "mkl")
    if blas._MKL is blas._UNSET or blas._MKL is None:
        monkeypatch.setattr(blas, "_MKL", blas._load())


@pytest.fixture
def mkl(monkeypatch):
    use_mkl(monkeypatch)


needs_mkl = pytest.mark.usefixtures("mkl")


@pytest.fixture(params=["mkl", "numpy"])
def backend(request, monkeypatch):
    """Runs a test with MKL (skipped where it cannot run) and with numpy's BLAS."""
    if request.param == "mkl":
        use_mkl(monkeypatch)
    else:
        monkeypatch.setattr(blas, "_MKL", None)
    return request.param


RNG = np.random.default_rng(0)
A = RNG.standard_normal((64, 96), dtype=np.float32)
B = RNG.standard_normal((96, 80), dtype=np.float32)


def _wide(x, extra=7):
    """``x`` as a view into wider rows (leading dimension > columns)."""
    buf = np.zeros((x.shape[0], x.shape[1] + extra), x.dtype)
    buf[:, : x.shape[1]] = x
    return buf[:, : x.shape[1]]


LAYOUTS_2D = {
    "row-major": (lambda a: a, lambda b: b),
    "column-major": (np.asfortranarray, np.asfortranarray),
    "transposed views": (
        lambda a: np.ascontiguousarray(a.T).T,
        lambda b: np.ascontiguousarray(b.T).T,
    ),
    "wide rows": (_wide, _wide),
    "every other row": (
        lambda a: np.repeat(a, 2, axis=0)[::2],
        lambda b: np.repeat(b, 2, axis=0)[::2],
    ),
}


def _check(y, a, b):
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert y.shape == want.shape and y.dtype == a.dtype
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", LAYOUTS_2D)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_2d_products_match_numpy_for_every_layout(layout, dtype, backend):
    fa, fb = LAYOUTS_2D[layout]
    a, b = fa(A.astype(dtype)), fb(B.astype(dtype))
    _check(blas.matmul(a, b), a, b)


@needs_mkl
@pytest.mark.parametrize("layout", LAYOUTS_2D)
def test_mkl_reads_2d_layouts_in_place(layout):
    fa, fb = LAYOUTS_2D[layout]
    a, b = fa(A), fb(B)
    out = np.full((64, 80), np.nan, np.float32)
    assert blas._gemm(a, b, out, accumulate=False)
    _check(out, a, b)


def test_output_views_and_accumulation(backend):
    big = np.zeros((64, 100), np.float32)
    y = blas.matmul(A, B, big[:, 10:90])
    assert y.base is big or y.base is big.base
    _check(big[:, 10:90], A, B)
    assert not big[:, :10].any() and not big[:, 90:].any()
    acc = np.ones((64, 80), np.float32)
    blas.matmul(A, B, acc, accumulate=True)
    np.testing.assert_allclose(acc - 1, A.astype(np.float64) @ B, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="accumulate"):
        blas.matmul(A, B, accumulate=True)


BATCHED = {
    "stack @ stack": ((5, 64, 96), (5, 96, 80), None),
    "one-item stack": ((1, 64, 96), (1, 96, 80), None),
    "matrix @ one-item stack": ((64, 96), (1, 96, 80), None),
    "stack @ matrix": ((5, 64, 96), (96, 80), None),
    "broadcast batch": ((3, 64, 96), (1, 96, 80), None),
    "two batch axes": ((2, 3, 64, 96), (2, 3, 96, 80), None),
    "transposed last axes": ((3, 96, 64), (3, 80, 96), (0, 2, 1)),
}


@pytest.mark.parametrize("case", BATCHED)
def test_batched_products_match_numpy(case, backend):
    sa, sb, perm = BATCHED[case]
    a = RNG.standard_normal(sa, dtype=np.float32)
    b = RNG.standard_normal(sb, dtype=np.float32)
    if perm:
        a, b = a.transpose(perm), b.transpose(perm)
    _check(blas.matmul(a, b), a, b)
    if backend == "mkl":
        assert blas._batched(a, b, None, False) is not None, "MKL should take this stack"


@pytest.mark.parametrize(
    "sa, sb, perm",
    [((2, 3, 64, 96), (96, 80), (1, 0, 2, 3)), ((2, 3, 64, 96), (1, 3, 96, 80), None)],
    ids=["permuted batch axes", "broadcast inner batch axis"],
)
def test_batch_axes_that_do_not_flatten_still_match(sa, sb, perm, backend):
    a = RNG.standard_normal(sa, dtype=np.float32)
    a = a.transpose(perm) if perm else a
    b = RNG.standard_normal(sb, dtype=np.float32)
    _check(blas.matmul(a, b), a, b)


@pytest.mark.parametrize(
    "a, b",
    [
        (np.arange(96 * 64).reshape(64, 96) % 7, np.arange(96 * 80).reshape(96, 80) % 5),
        (A, B.astype(np.float64)),
        (A[::2, ::2], B[::2, ::2]),
        (np.ones((64, 0), np.float32), np.ones((0, 80), np.float32)),
        (A[0], B),
    ],
    ids=["integers", "mixed dtypes", "no unit stride", "empty contraction", "vector"],
)
def test_products_mkl_cannot_take_fall_back_to_numpy(a, b, backend):
    np.testing.assert_allclose(blas.matmul(a, b), np.matmul(a, b), rtol=1e-5, atol=1e-4)


def test_an_output_overlapping_an_input_falls_back(backend):
    x = np.ascontiguousarray(np.eye(64, dtype=np.float32) * 2)
    want = x @ x
    blas.matmul(x, x, out=x)
    np.testing.assert_array_equal(x, want)


@needs_mkl
def test_mkl_results_do_not_depend_on_alignment():
    def placed(x, offset):
        buf = np.empty(x.size + 32, x.dtype)
        start = (-(buf.ctypes.data // x.itemsize)) % 16 + offset
        view = buf[start : start + x.size].reshape(x.shape)
        view[...] = x
        return view

    a = RNG.standard_normal((257, 513), dtype=np.float32)
    b = RNG.standard_normal((513, 129), dtype=np.float32)
    results = [blas.matmul(placed(a, off), placed(b, (3 * off) % 16)) for off in range(0, 16, 3)]
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def _backend_in_subprocess(value):
    env = {**os.environ, blas.ENV: value}
    code = "from dfdl.ops.cpu import blas; print(blas.backend())"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_environment_picks_the_library():
    done = _backend_in_subprocess("numpy")
    assert done.returncode == 0 and done.stdout.strip() == "numpy"
    done = _backend_in_subprocess("blis")
    assert done.returncode != 0 and "DFDL_BLAS='blis'" in done.stderr
    assert "'auto', 'mkl' or 'numpy'" in done.stderr


@needs_mkl
def test_mkl_asked_for_and_installed_is_used():
    done = _backend_in_subprocess("mkl")
    assert done.returncode == 0 and done.stdout.strip() == "mkl"


def test_a_process_that_imported_torch_stays_off_mkl():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs the torch extra")
    if blas._find_mkl() is None:
        pytest.skip("Intel MKL is not installed (pip install dfdl[mkl])")
    code = "import torch; from dfdl.ops.cpu import blas; print(blas.backend())"
    env = {**os.environ, blas.ENV: "auto"}
    run = {"capture_output": True, "text": True, "timeout": 300}
    done = subprocess.run([sys.executable, "-c", code], env=env, **run)
    assert done.returncode == 0 and done.stdout.strip() == "numpy", done.stderr
    done = subprocess.run([sys.executable, "-c", code], env={**env, blas.ENV: "mkl"}, **run)
    assert done.returncode != 0 and "imported torch" in done.stderr


def test_mkl_tests_pass_in_a_process_without_torch():
    """The MKL tests of this file and of the conv kernels skip in a process that
    imported torch (another test file did, under pytest-xdist); here they run."""
    if "torch" not in sys.modules:
        pytest.skip("no torch in this process: the MKL tests ran in it")
    if blas._find_mkl() is None:
        pytest.skip("Intel MKL is not installed (pip install dfdl[mkl])")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    files = [__file__, os.path.join(os.path.dirname(__file__), "test_conv.py")]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "mkl and not without_torch",
            *files,
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout.splitlines()[-1]


def test_mkl_asked_for_but_missing_says_how_to_install(monkeypatch):
    monkeypatch.setenv(blas.ENV, "mkl")
    monkeypatch.setattr(blas, "_find_mkl", lambda: None)
    with pytest.raises(DfdlError, match=r"pip install dfdl\[mkl\]"):
        blas._load()
    monkeypatch.setenv(blas.ENV, "auto")
    assert blas._load() is None


@needs_mkl
def test_arguments_mkl_rejects_raise_instead_of_leaving_the_output_unwritten():
    a, b = A, B
    c = np.zeros((64, 80), np.float32)
    gemm = blas._lib().gemm[np.dtype(np.float32)]
    # ldc 10 < N 80: MKL's argument 14
    gemm(
        101, 111, 111, 64, 80, 96, 1.0, a.ctypes.data, 96, b.ctypes.data, 80, 0.0, c.ctypes.data, 10
    )
    with pytest.raises(DfdlError, match=r"argument 14 of cblas_sgemm.*DFDL_BLAS=numpy"):
        blas._raise_rejected(a, b, c)
    blas._raise_rejected(a, b, c)  # reported once
    _check(blas.matmul(a, b), a, b)


#: the matrix-product ops: every op whose kernel lives in dfdl.ops.linalg
LINALG_OPS = {d.name for d in REGISTRY.values() if d.forward.__module__ == "dfdl.ops.linalg"}
LINALG_CASES = [c for c in CASES if c.op in LINALG_OPS]


@needs_mkl
@pytest.mark.parametrize("case", LINALG_CASES, ids=lambda c: c.name())
def test_matrix_product_ops_match_their_reference_on_mkl(case, monkeypatch):
    monkeypatch.setattr(blas, "MIN_WORK", 1)  # every product on MKL, however small
    outs = REGISTRY[case.key].forward(*case.inputs, **case.attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    for i, want in enumerate(case.expected()):
        assert_matches(outs[i], want, case, f"output {i} on MKL")


def test_every_matrix_product_op_has_cases_here():
    assert {"Gemm", "MatMul", "MatMulGradB", "MatMulT"} <= LINALG_OPS
    assert {c.op for c in LINALG_CASES} == LINALG_OPS


@needs_mkl
def test_the_rejection_handler_outlives_every_loaded_library_object():
    """MKL keeps the handler's address: one freed with its library object left MKL
    calling whatever ctypes put there next (CI: a segfault)."""
    for _ in range(3):
        blas._load()  # each registers the handler, then is dropped
    gc.collect()
    others = [ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(abs) for _ in range(64)]
    c = np.zeros((64, 80), np.float32)
    gemm = blas._lib().gemm[np.dtype(np.float32)]
    gemm(
        101, 111, 111, 64, 80, 96, 1.0, A.ctypes.data, 96, B.ctypes.data, 80, 0.0, c.ctypes.data, 10
    )
    with pytest.raises(DfdlError, match="argument 14"):
        blas._raise_rejected(A, B, c)
    assert len(others) == 64


def test_auto_keeps_mkl_off_cpus_that_are_not_intels(monkeypatch):
    """MKL runs a slow generic path on AMD CPUs (bench/blas.py: 89-112 against 193-239
    GFLOP/s for OpenBLAS on one Zen 5 thread), so ``auto`` leaves it there; ``mkl``
    still loads it on any CPU."""
    if blas._find_mkl() is None:
        pytest.skip("Intel MKL is not installed (pip install dfdl[mkl])")
    monkeypatch.setenv(blas.ENV, "auto")
    monkeypatch.setattr(blas, "cpu_vendor", lambda: "AuthenticAMD")
    assert blas._load() is None
    if "torch" in sys.modules:
        return  # MKL loads in a process without torch only (tests above)
    monkeypatch.setattr(blas, "cpu_vendor", lambda: "GenuineIntel")
    assert isinstance(blas._load(), blas._Mkl)
    monkeypatch.setattr(blas, "cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setenv(blas.ENV, "mkl")
    assert isinstance(blas._load(), blas._Mkl)


def test_auto_in_a_fresh_process_follows_the_cpu_vendor():
    if blas._find_mkl() is None:
        pytest.skip("Intel MKL is not installed (pip install dfdl[mkl])")
    done = _backend_in_subprocess("auto")
    assert done.returncode == 0, done.stderr
    assert blas.cpu_vendor() is not None or sys.platform != "linux"
    expected = "mkl" if blas.cpu_vendor() in ("GenuineIntel", None) else "numpy"
    assert done.stdout.strip() == expected
