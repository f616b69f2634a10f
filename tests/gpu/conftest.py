"""tests/gpu runs only where cupy sees an NVIDIA GPU: every test here is marked ``gpu``
and skipped elsewhere (CI has no GPU; the device check runs ``bench/gpu_check.sh``)."""

from __future__ import annotations

import pytest


def gpu_ready() -> str | None:
    """Why this machine cannot run the GPU tests, or None when it can."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CUDA sees no GPU"
    except Exception as e:  # noqa: BLE001 - any failure is the reason
        return f"no cupy GPU ({type(e).__name__}: {e})"
    return None


_WHY = gpu_ready()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if _WHY:
                item.add_marker(pytest.mark.skip(reason=_WHY))
