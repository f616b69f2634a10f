"""Training over a TLS-secured cluster; clients without the cluster's credentials refused.

The cluster is a real LocalCluster with ``Security.temporary()`` credentials (a fresh CA,
certificate and key; scheduler, workers and client all speak ``tls://``). The command
line case runs ``python -m dfdl train --scheduler tls://...`` as a subprocess against it.
dfdl's own clusters (the embedded one of ``dfdl.train(client=None)``, ``dfdl.LocalCluster``)
are private by default: their scheduler, nannies and workers refuse whoever lacks the
cluster's certificate, and no HTTP server listens unless a dashboard was asked for.
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import urllib.request

import numpy as np
import onnx
import psutil
import pytest
from distributed import Client
from distributed.comm import connect
from distributed.security import Security

import dfdl
import dfdl.models
from dfdl.errors import ConfigError
from dfdl.runtime.cluster import embedded_client, open_client
from tests.cli.helpers import dfdl_cli

SIZES = (16, 64, 4)
BATCH = 32
STEPS = 3


def _data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH * STEPS, SIZES[0]), dtype=np.float32)
    return x, rng.integers(0, SIZES[-1], BATCH * STEPS)


def _train(client) -> dfdl.TrainResult:
    return dfdl.train(
        dfdl.models.mlp(SIZES),
        data=_data(),
        loss="cross_entropy",
        optimizer=dfdl.optim.Adam(lr=1e-3),
        batch_size=BATCH,
        steps=STEPS,
        client=client,
        tiles={"batch": 2, "model": 2},
        progress=False,
    )


@pytest.fixture(scope="module")
def secured():
    security = Security.temporary()
    with dfdl.LocalCluster(2, security=security) as cluster, Client(cluster) as client:
        yield cluster, client, security


def test_training_over_tls_gives_the_tcp_numbers(secured, client):
    cluster, tls_client, _ = secured
    assert cluster.scheduler_address.startswith("tls://")
    assert all(a.startswith("tls://") for a in tls_client.scheduler_info()["workers"])
    over_tls = _train(tls_client)
    over_tcp = _train(client)  # the session's plain tcp:// cluster
    assert over_tls.history["loss"] == over_tcp.history["loss"]
    for k in over_tcp.params:
        np.testing.assert_array_equal(over_tls.params[k], over_tcp.params[k], err_msg=k)


@pytest.mark.parametrize(
    "how",
    ["no credentials", "another cluster's credentials", "plain tcp"],
)
def test_client_without_the_credentials_is_refused(secured, how):
    cluster, _, _ = secured
    before = set(cluster.scheduler.clients)
    address = cluster.scheduler_address
    security = None
    if how == "another cluster's credentials":
        security = Security.temporary()
    elif how == "plain tcp":
        address = address.replace("tls://", "tcp://")
    with pytest.raises(ConfigError, match="cannot connect to the scheduler") as info:
        open_client(address, security, timeout=5)
    assert set(cluster.scheduler.clients) == before  # no client got in
    if how == "plain tcp":  # the message says what the address lacks
        assert "tls://... for a scheduler that uses TLS" in str(info.value)


def _pem_files(security: Security, tmp_path) -> dict[str, str]:
    # Security.temporary() holds the PEM texts themselves; the command line takes files
    files = {}
    for flag, text in (
        ("--tls-ca-file", security.tls_ca_file),
        ("--tls-cert", security.tls_client_cert),
        ("--tls-key", security.tls_client_key),
    ):
        path = tmp_path / f"{flag.strip('-')}.pem"
        path.write_text(text)
        files[flag] = str(path)
    return files


def test_command_line_trains_over_tls_and_names_missing_credentials(secured, tmp_path):
    cluster, _, security = secured
    onnx.save(dfdl.models.mlp(SIZES), str(tmp_path / "mlp.onnx"))
    x, y = _data()
    np.savez(tmp_path / "data.npz", X=x, y=y)
    common = ("train", "mlp.onnx", "--data", "data.npz", "--batch-size", str(BATCH))
    where = ("--scheduler", cluster.scheduler_address)
    creds = [a for flag, path in _pem_files(security, tmp_path).items() for a in (flag, path)]
    r = dfdl_cli(*common, *where, *creds, "-o", "out.onnx", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out.onnx").is_file()
    r = dfdl_cli(*common, *where, "-o", "refused.onnx", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "no TLS credentials were given" in r.stderr and "--tls-ca-file" in r.stderr
    assert not (tmp_path / "refused.onnx").exists()


# who tries to get into a private cluster: (label, address rewrite, credentials)
INTRUDERS = {
    "plain tcp": ("tcp://", lambda: None),
    "tls without a certificate": ("tls://", lambda: None),
    "tls with another cluster's certificate": ("tls://", Security.temporary),
}


def _identity(address: str, security: Security | None) -> dict:
    """The ``identity`` a scheduler, nanny or worker at ``address`` answers over Dask's
    comms: what anyone who connects can ask (or ``run`` code, on a worker)."""

    async def ask():
        args = (security or Security()).get_connection_args("client")
        comm = await connect(address, timeout=5, **args)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await asyncio.wait_for(comm.read(), 10)
        finally:
            comm.abort()

    return asyncio.run(ask())


def _servers(client) -> dict[str, str]:
    """The comm address of the scheduler, each nanny and each worker of ``client``'s cluster."""
    info = client.scheduler_info()
    out = {"scheduler": client.scheduler.address}
    for i, (address, w) in enumerate(sorted(info["workers"].items())):
        out[f"worker {i}"] = address
        out[f"nanny {i}"] = w["nanny"]
    return out


def _assert_refused(address: str, how: str) -> None:
    protocol, credentials = INTRUDERS[how]
    address = protocol + address.split("://", 1)[1]
    # TypeError: distributed's words for "tls:// without a TLS context"
    with pytest.raises((OSError, TypeError)):
        _identity(address, credentials())
    with pytest.raises((OSError, TypeError)):
        Client(address, security=credentials(), timeout=5)
    gc.collect()  # the half-started Client, before the next one starts (see open_client)


def _http_servers(client) -> list[str]:
    """Where the scheduler and the workers of ``client``'s in-process cluster serve HTTP,
    and the listening sockets of each worker process besides its comm address."""
    scheduler = client.cluster.scheduler
    found = []
    if hasattr(scheduler, "http_server"):
        found.append(f"scheduler {scheduler.http_server.port}")

    def listening(dask_worker):
        port = int(dask_worker.address.rsplit(":", 1)[1])
        sockets = psutil.Process().net_connections("inet")
        extra = [c.laddr.port for c in sockets if c.status == "LISTEN" and c.laddr.port != port]
        return {"http": hasattr(dask_worker, "http_server"), "other ports": extra}

    for address, seen in client.run(listening).items():
        if seen["http"] or seen["other ports"]:
            found.append(f"worker {address}: {seen}")
    return found


def test_the_embedded_cluster_refuses_outsiders_while_dfdl_trains():
    own = embedded_client()
    cluster = own.cluster
    assert cluster.scheduler_address.startswith("tls://")
    servers = _servers(own)
    assert all(a.startswith("tls://") for a in servers.values()), servers
    before = set(cluster.scheduler.clients)
    result = {}
    training = threading.Thread(target=lambda: result.update(r=_train(None)))
    training.start()
    try:
        for where, address in servers.items():
            # dfdl's own credentials are let in: the probe itself works
            assert _identity(address, cluster.security)["type"], where
            for how in INTRUDERS:
                _assert_refused(address, how)
    finally:
        training.join(120)
    assert not training.is_alive()
    assert len(result["r"].history["loss"]) == STEPS
    assert np.isfinite(result["r"].history["loss"]).all()
    assert set(cluster.scheduler.clients) == before  # no client got in
    assert embedded_client() is own  # the run used the embedded cluster


def test_no_http_server_listens_without_a_dashboard():
    client = embedded_client()
    assert _http_servers(client) == []
    assert client.cluster.dashboard_link == ""


def test_a_dashboard_asked_for_is_served_with_dfdls_page():
    with (
        dfdl.LocalCluster(1, threads_per_worker=1, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        assert cluster.scheduler_address.startswith("tls://")
        assert client.security is cluster.security  # Client(cluster) took the credentials
        page = cluster.dashboard_link.replace("/status", "/dfdl/json")
        with urllib.request.urlopen(page, timeout=10) as response:
            assert response.status == 200
            assert json.load(response)["runs"] == []
        assert _http_servers(client) == [f"scheduler {cluster.scheduler.http_server.port}"]


def test_security_false_gives_a_plain_tcp_cluster():
    with dfdl.LocalCluster(1, threads_per_worker=1, security=False) as cluster, Client(cluster):
        assert cluster.scheduler_address.startswith("tcp://")
        assert _identity(cluster.scheduler_address, None)["type"].endswith("Scheduler")
