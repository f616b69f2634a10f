"""Shared fixtures: one real LocalCluster (2 worker processes) for the whole session,
and one of 2 in-process workers for the per-op tests."""

from __future__ import annotations

from collections import Counter

import pytest


def _two_workers(processes: bool):
    """A client of a LocalCluster of two one-thread workers, closed after use."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=processes, dashboard_address=None
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.fixture(scope="session")
def client():
    yield from _two_workers(processes=True)


@pytest.fixture(scope="session")
def op_client():
    """Two one-thread workers inside the test process, for the ONNX suites' thousands of
    small graphs (``backend_in_process``), where a round trip between worker processes
    (about 50 ms a graph) would be most of the time. What they check (each op's tiles on a
    cluster) does not depend on processes; values crossing processes are checked by the
    training tests on ``client``."""
    yield from _two_workers(processes=False)


@pytest.fixture(scope="module")
def backend_in_process(op_client):
    """``dfdl.backend`` runs on ``op_client`` instead of its own cluster of worker
    processes."""
    from dfdl.onnx_backend import DfdlBackend

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DfdlBackend, "client", op_client)
        yield


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


def _outcomes(terminalreporter, file: str):
    """(outcome, nodeid) of each test of ``file`` that ran (its call) or was skipped."""
    for outcome in ("passed", "failed", "skipped"):
        for rep in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(rep, "nodeid", "")
            if file in nodeid and (rep.when == "call" or outcome == "skipped"):
                yield outcome, nodeid


def pytest_terminal_summary(terminalreporter):
    """Print, per tiling, how many ONNX node tests ran and passed (and how many of them
    were converted from an opset older than 13), how many cases were not collected (ops
    dfdl does not cover; excluded with a reason), and for each of ONNX's model suites
    (tests/test_backend_suites.py) its pass/total and why the rest did not run."""
    nodes = list(_outcomes(terminalreporter, "test_backend_nodes.py"))
    old: set[str] = set()
    if nodes:
        from tests.test_backend_nodes import LEFT_OUT, SELECTED_OLD_OPSET

        for tiling, left in LEFT_OUT.items():
            terminalreporter.write_line(
                f"ONNX node cases not collected ({tiling} tiling): {left['not covered']} whose "
                f"ops or domains dfdl does not cover, {left['excluded']} excluded with a reason "
                "(tests/test_backend_nodes.py: EXCLUDED)"
            )
        old = {f"::{name}_cpu" for name in SELECTED_OLD_OPSET}
    for tiling in ("default", "uneven"):
        counts = Counter(o for o, nodeid in nodes if f"_{tiling}::" in nodeid)
        converted = Counter(
            o for o, nodeid in nodes if f"_{tiling}::" in nodeid and nodeid.endswith(tuple(old))
        )
        ran = counts["passed"] + counts["failed"]
        if ran or counts["skipped"]:
            terminalreporter.write_line(
                f"ONNX node tests ({tiling} tiling): {ran} ran, {counts['passed']} passed, "
                f"{counts['failed']} failed, {counts['skipped']} skipped; of them "
                f"{converted['passed'] + converted['failed']} older than opset 13 (converted "
                f"at load), {converted['passed']} passed"
            )
    suites = list(_outcomes(terminalreporter, "test_backend_suites.py::test_suite_case["))
    if suites:
        from tests.test_backend_suites import EXCLUDED_CASES, SUITES, TOTALS
        from tests.test_backend_suites import LEFT_OUT as LACKING

        # test ids: "suite/case/tiling"
        runs = Counter()
        for o, nodeid in suites:
            suite, _, tiling = nodeid.split("[", 1)[1].rstrip("]").rsplit("/", 2)
            runs[suite, tiling, o] += 1
        for suite in SUITES:
            lacking = Counter(op for ops in LACKING[suite].values() for op in ops)
            why = ", ".join(f"{op} {n}" for op, n in lacking.most_common())
            for tiling in ("default", "uneven"):
                count = {o: runs[suite, tiling, o] for o in ("passed", "failed", "skipped")}
                if not sum(count.values()):
                    continue
                terminalreporter.write_line(
                    f"ONNX {suite} suite ({tiling} tiling): {count['passed']}/{TOTALS[suite]} "
                    f"passed, {count['failed']} failed, {count['skipped']} skipped; not run: "
                    f"{len(LACKING[suite])} using ops dfdl lacks"
                    + (f" (cases per op: {why})" if why else "")
                    + f", {len(EXCLUDED_CASES[suite])} excluded with a reason "
                    "(tests/test_backend_suites.py: EXCLUDED)"
                )
