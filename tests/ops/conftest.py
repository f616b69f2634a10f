"""Fixtures of the per-op tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def op_client():
    """A cluster of two one-thread workers inside the test process, for the per-op
    tiled runs: thousands of tiny graphs, where a round trip between worker processes
    (about 50 ms a graph) would be most of the time. What the per-op tests check (tile
    rules, kernels, VJPs) does not depend on processes; values crossing processes are
    checked by the training tests on the session's ``client`` (``tests/conftest.py``)."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c
