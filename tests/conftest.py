"""Shared fixtures: one real LocalCluster (2 worker processes) for the whole session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def client():
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.fixture(scope="session", autouse=True)
def _plan_without_worker_footprint():
    """Plan tiles against the limits alone, as with Dask's process-memory thresholds off:
    the tests use limits of a few MiB to make tiny models spill. The tests of the
    footprint (``tests/plan/test_estimate.py``) set it themselves."""
    import dask

    with dask.config.set({"dfdl.memory.worker-footprint": 0}):
        yield


@pytest.fixture(scope="session", autouse=True)
def _close_backend_cluster():
    """Shut the ONNX backend's shared cluster down while pytest still captures logs."""
    yield
    from dfdl.onnx_backend import close_shared_client
    from dfdl.runtime.cluster import close_embedded

    close_shared_client()
    close_embedded()


def pytest_terminal_summary(terminalreporter):
    """Print, per tiling, how many ONNX node tests ran and passed, and how many cases
    were not collected (ops or opsets dfdl does not cover; excluded with a reason)."""
    reports = [
        r
        for outcome in ("passed", "failed", "skipped")
        for r in terminalreporter.stats.get(outcome, [])
    ]
    if any("test_backend_nodes.py" in getattr(r, "nodeid", "") for r in reports):
        from tests.test_backend_nodes import LEFT_OUT

        for tiling, left in LEFT_OUT.items():
            terminalreporter.write_line(
                f"ONNX node cases not collected ({tiling} tiling): {left['not covered']} whose "
                f"ops or opsets dfdl does not cover, {left['excluded']} excluded with a reason "
                "(tests/test_backend_nodes.py: EXCLUDED)"
            )
    for tiling in ("default", "uneven"):
        counts = {"passed": 0, "failed": 0, "skipped": 0}
        for outcome in counts:
            for rep in terminalreporter.stats.get(outcome, []):
                nodeid = getattr(rep, "nodeid", "")
                if "test_backend_nodes.py" in nodeid and f"_{tiling}::" in nodeid:
                    if rep.when == "call" or outcome == "skipped":
                        counts[outcome] += 1
        ran = counts["passed"] + counts["failed"]
        if ran or counts["skipped"]:
            terminalreporter.write_line(
                f"ONNX node tests ({tiling} tiling): {ran} ran, {counts['passed']} passed, "
                f"{counts['failed']} failed, {counts['skipped']} skipped"
            )
