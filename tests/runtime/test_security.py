"""Training over a TLS-secured cluster; clients without the cluster's credentials refused.

The cluster is a real LocalCluster with ``Security.temporary()`` credentials (a fresh CA,
certificate and key; scheduler, workers and client all speak ``tls://``). The command
line case runs ``python -m dfdl train --scheduler tls://...`` as a subprocess against it.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from distributed import Client
from distributed.security import Security

import dfdl
import dfdl.models
from dfdl.errors import ConfigError
from dfdl.runtime.cluster import open_client
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
    with pytest.raises(ConfigError, match="cannot connect to the scheduler"):
        open_client(address, security, timeout=5)
    assert set(cluster.scheduler.clients) == before  # no client got in


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
