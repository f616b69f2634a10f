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


#: why ONNX's BackendTest skips a case: not selected (ops or opsets dfdl does not cover),
#: or excluded (``tests/test_backend_nodes.py: EXCLUDED``, each with its reason)
_WHY = {"no matched include pattern": "not covered", "matched exclude pattern": "excluded"}
_deselected: dict[str, int] = {}


def pytest_collection_modifyitems(config, items):
    """ONNX node cases whose ops dfdl does not cover are deselected here, not collected as
    thousands of skips (``tests/test_backend_nodes.py`` says which cases run and why)."""
    keep, drop = [], []
    for item in items:
        why = _WHY.get(getattr(getattr(item, "obj", None), "__unittest_skip_why__", None))
        if why is None:
            keep.append(item)
        else:
            drop.append(item)
            _deselected[why] = _deselected.get(why, 0) + 1
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_terminal_summary(terminalreporter):
    """Print how many ONNX node cases were deselected, and how many of the selected ran
    and passed, per tiling."""
    if _deselected:
        terminalreporter.write_line(
            f"ONNX node cases deselected: {_deselected.get('not covered', 0)} whose ops or "
            f"opsets dfdl does not cover, {_deselected.get('excluded', 0)} excluded with a "
            "reason (tests/test_backend_nodes.py: EXCLUDED)"
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
