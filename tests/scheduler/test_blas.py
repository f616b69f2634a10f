"""OpenBLAS kernel choice for worker processes (dfdl.scheduler.blas)."""

from __future__ import annotations

import pytest
from distributed import Client

from dfdl.scheduler import blas
from dfdl.scheduler.cluster import local_cluster

AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})


@pytest.mark.parametrize(
    ("flags", "architectures", "environ", "expected"),
    [
        (AVX2, ["Haswell"], {}, None),  # no AVX-512: OpenBLAS's choice is right
        (AVX2 | blas.SKYLAKEX_FLAGS, ["Haswell"], {}, "SkylakeX"),
        (AVX2 | blas.SKYLAKEX_FLAGS, ["Zen"], {}, "SkylakeX"),
        (AVX2 | blas.SKYLAKEX_FLAGS, ["SkylakeX"], {}, None),
        (AVX2 | blas.SKYLAKEX_FLAGS, ["SapphireRapids"], {}, None),
        (AVX2 | blas.SKYLAKEX_FLAGS, [], {}, None),  # no OpenBLAS loaded (MKL, ...)
        (AVX2 | {"avx512f"}, ["Haswell"], {}, None),  # AVX-512F alone is not enough
        (AVX2 | blas.SKYLAKEX_FLAGS, ["Haswell"], {"OPENBLAS_CORETYPE": "Zen"}, None),
    ],
)
def test_coretype_rule(flags, architectures, environ, expected):
    assert blas.openblas_coretype(flags, architectures, environ) == expected


def test_cpu_flags_reads_the_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\nbugs\t\t: none\n")
    assert blas.cpu_flags(str(info)) == {"fpu", "avx2", "avx512f"}
    assert blas.cpu_flags(str(tmp_path / "absent")) == frozenset()


def test_this_process_reports_its_openblas():
    # numpy wheels ship OpenBLAS; threadpoolctl names the core type it chose
    assert all(isinstance(a, str) and a for a in blas.openblas_architectures())


def _worker_blas():
    return blas.openblas_architectures()


def test_embedded_workers_use_avx512_kernels_where_the_cpu_has_them(monkeypatch):
    if not blas.SKYLAKEX_FLAGS <= blas.cpu_flags():
        pytest.skip("this CPU has no AVX-512: OpenBLAS's own choice is kept")
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    with local_cluster() as cluster, Client(cluster) as client:
        (architectures,) = client.run(_worker_blas).values()
    assert architectures, "the worker process has no OpenBLAS loaded"
    assert {a.lower() for a in architectures} <= blas.AVX512_CORES
