"""Values between worker processes on dfdl's own sockets (``dfdl.taskgraph.wire``): they
arrive with their bits over each kind of connection, a lost peer fails the send, and a
training on two worker processes passes its values over the wire with the same losses
as over Dask's messages."""

from __future__ import annotations

import os
import socket
import stat
import time
from types import SimpleNamespace

import numpy as np
import pytest

import dfdl
import dfdl.models
from dfdl.taskgraph import exchange, wire
from dfdl.taskgraph.tile_exec import Outputs


def _tls_pair():
    from distributed import Security

    sec = Security.temporary()
    return (
        sec.get_listen_args("worker")["ssl_context"],
        sec.get_connection_args("worker")["ssl_context"],
    )


@pytest.fixture(params=["unix", "tcp", "tls"])
def linked(request):
    """A wire and a link to it, over a Unix socket, plain TCP or TCP with TLS."""
    server = client = None
    if request.param == "tls":
        server, client = _tls_pair()
    w = wire.Wire("127.0.0.1", exchange.deliver, server, client)
    link = wire.connect(w.endpoints(), client, unix=request.param == "unix")
    yield w, link, request.param
    link.close()
    w.close()


def _same(a, b):
    if isinstance(a, tuple):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()
        assert b.flags.writeable and b.flags.aligned
    else:
        assert a == b


def test_values_arrive_with_their_bits_over_each_connection(linked):
    w, link, kind = linked
    rng = np.random.default_rng(0)
    big = rng.standard_normal((256, 1024), dtype=np.float32)  # 1 MiB: many reads
    values = {
        "big": big,
        "strided": big[::3, 1::2],  # not contiguous: pickled with its header
        "packed": Outputs((None, big[:4], np.float64(2.5), np.arange(3, dtype=np.int64))),
        "scalar": np.array(np.float32(1.5)),
        "none": None,
        "text": "a value",
    }
    futures = [link.send(f"{kind}-{k}", v) for k, v in values.items()]
    for f in futures:
        assert f.result(timeout=10) is None
    for k, v in values.items():
        _same(v, exchange.receive(f"{kind}-{k}", timeout=10))
    assert link.sent == len(values)
    assert link.sock.family == (socket.AF_UNIX if kind == "unix" else socket.AF_INET)


def test_a_failure_sent_raises_at_its_reader(linked):
    _, link, kind = linked
    link.send(f"{kind}-f", exchange._Failed("its task broke", lost=True)).result(timeout=10)
    with pytest.raises(exchange.PeerLostError, match="its task broke"):
        exchange.receive(f"{kind}-f", timeout=10)


def test_a_peer_on_this_host_opens_no_tcp_port():
    w = wire.Wire("127.0.0.1", exchange.deliver)
    try:
        assert "tcp" not in w.endpoints(wire._node()) and w.port is None
        assert w.endpoints("another-host/boot")["tcp"] == w.port > 0
    finally:
        w.close()


def test_the_unix_socket_is_in_a_directory_only_its_user_enters():
    w = wire.Wire("127.0.0.1", exchange.deliver)
    try:
        mode = os.stat(os.path.dirname(w.unix_path)).st_mode
        assert stat.S_IMODE(mode) == 0o700
        assert stat.S_ISSOCK(os.stat(w.unix_path).st_mode)
    finally:
        w.close()
    assert not os.path.exists(os.path.dirname(w.unix_path))


def test_a_connection_that_does_not_speak_the_wire_is_dropped():
    w = wire.Wire("127.0.0.1", exchange.deliver)
    try:
        stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stranger.connect(w.unix_path)
        stranger.sendall(b"GET / HTTP/1.0\r\n\r\n")
        try:
            assert stranger.recv(1) == b""  # closed by the wire without reading on
        except ConnectionResetError:  # closed with the rest unread
            pass
        stranger.close()
        link = wire.connect(w.endpoints())
        link.send("after-stranger", 7).result(timeout=10)
        assert exchange.receive("after-stranger", timeout=10) == 7
        link.close()
    finally:
        w.close()


def test_a_tls_wire_refuses_a_link_without_a_certificate():
    server, _ = _tls_pair()
    w = wire.Wire("127.0.0.1", exchange.deliver, server, None)
    try:
        with pytest.raises(OSError, match="requires TLS"):
            wire.connect(w.endpoints(), None, unix=False)
    finally:
        w.close()


def _until_broken(link, n=200):
    """Sends until a send fails (a lost peer's connection accepts a few writes into
    the kernel's buffers first); the error."""
    for i in range(n):
        try:
            link.send(f"gone-{i}", np.zeros(1 << 16, np.float32)).result(timeout=10)
        except OSError as e:
            return e
        time.sleep(0.01)
    return None


def test_a_lost_peer_fails_the_send_and_the_outbox_says_so(monkeypatch):
    w = wire.Wire("127.0.0.1", exchange.deliver)
    link = wire.connect(w.endpoints())
    link.send("before", 1).result(timeout=10)
    assert exchange.receive("before", timeout=10) == 1  # the peer reads the connection
    w.close()  # the peer's process is gone: its listener and connections closed
    assert isinstance(_until_broken(link), OSError)
    assert link.broken is not None
    # the share's outbox turns it into PeerLostError, which the trainer replays from
    monkeypatch.setattr(wire, "link_to", lambda worker, address: link)
    box = exchange.Outbox()
    box.worker = SimpleNamespace(address="tcp://here:1")
    box.send("tcp://there:2", ("k", 0), np.ones(3))
    with pytest.raises(exchange.PeerLostError, match="could not send a value to the worker"):
        box.close()
    link.close()


def _as_another_host() -> None:
    """On a worker: this process believes it runs on a host of its own (its wire then
    gives its peers, and asks them for, the TCP endpoint, as between nodes)."""
    import os

    from dfdl.taskgraph import wire as w

    w._node = lambda: f"host-of-{os.getpid()}"


def _wire_use() -> tuple | None:
    """On a worker: its wire's count of values read, and whether it opened a TCP port
    (None: it has no wire)."""
    from dfdl.taskgraph import wire as w

    return None if w._wire is None else (w._wire.received, w._wire.port is not None)


def _train_two_workers(model, config: dict | None = None, hosts: bool = False):
    """Three steps on a fresh 2-process embedded cluster (``config``: Dask config its
    workers start with; ``hosts``: each worker as if on a host of its own): the result
    and each worker's :func:`_wire_use`."""
    import dask
    from distributed import Client

    with dask.config.set(config or {}):
        cluster = dfdl.LocalCluster(2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 2, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, size=16)
    with cluster, Client(cluster) as client:
        if hosts:
            client.run(_as_another_host)
        res = dfdl.train(
            model, (x, y), optimizer=dfdl.optim.SGD(lr=0.1, momentum=0.9), batch_size=8,
            steps=3, shuffle=False, client=client, progress=False,
            tiles={"batch": 2, "model": 1, "split_norms": 1},
        )  # fmt: skip
        used = client.run(_wire_use)
    return res, sorted(used.values(), key=str)


def test_two_workers_pass_values_on_the_wire_with_the_losses_of_dask_messages():
    model = dfdl.models.resnet(
        in_channels=2, image_size=8, stem=4, stages=(4, 8), blocks_per_stage=1, num_classes=3
    )
    on_wire, used = _train_two_workers(model)
    # both workers read values off the wire, over its Unix socket (no TCP port opened)
    assert all(n > 0 and not tcp for n, tcp in used), used
    by_dask, none = _train_two_workers(model, {"dfdl.exchange.transport": "dask"})
    assert none == [None, None]  # no wire: the values went as Dask messages
    # as between hosts: TCP with the embedded cluster's TLS certificates
    between_hosts, used = _train_two_workers(model, hosts=True)
    assert all(n > 0 and tcp for n, tcp in used), used
    for run in (on_wire, between_hosts):
        assert run.history["loss"] == by_dask.history["loss"]
        for k, v in by_dask.params.items():
            np.testing.assert_array_equal(run.params[k], v, err_msg=k)


def test_a_tls_wire_reads_nothing_from_a_peer_without_the_cluster_s_certificate():
    import ssl

    server, _ = _tls_pair()
    w = wire.Wire("127.0.0.1", exchange.deliver, server, None)
    try:
        anyone = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        anyone.check_hostname = False
        anyone.verify_mode = ssl.CERT_NONE
        try:
            raw = socket.create_connection(("127.0.0.1", w.port), timeout=5)
            sock = anyone.wrap_socket(raw)
            sock.sendall(wire.MAGIC)
            wire.write_message(sock, "intruder", 1)
        except OSError:
            pass  # refused during the handshake
        with pytest.raises(exchange.ExchangeError, match="no value"):
            exchange.receive("intruder", timeout=1)
        assert w.received == 0
    finally:
        w.close()


def _worker_like(tmp_path, address="tcp://127.0.0.1:1"):
    from distributed import Security

    return SimpleNamespace(
        address=address, security=Security(), local_directory=str(tmp_path), handlers={}
    )


def test_install_opens_one_wire_per_process_and_answers_peers(tmp_path, monkeypatch):
    monkeypatch.setattr(wire, "_wire", None)
    first, second = _worker_like(tmp_path), _worker_like(tmp_path, "tcp://127.0.0.1:2")
    wire.install(first, exchange.deliver)
    opened = wire._wire
    try:
        # a second worker of this process shares it (and the mailbox)
        wire.install(second, exchange.deliver)
        assert wire._wire is opened
        assert opened.unix_path.startswith(str(tmp_path))
        here = first.handlers[wire.HANDLER](node=wire._node())
        assert (
            here
            == second.handlers[wire.HANDLER](node=wire._node())
            == {
                "node": wire._node(),
                "unix": opened.unix_path,
            }
        )
    finally:
        opened.close()


@pytest.mark.parametrize("transport", ["dask", "pigeons"])
def test_install_leaves_values_to_dask_when_told_or_told_nonsense(
    transport, tmp_path, monkeypatch, caplog
):
    import dask

    monkeypatch.setattr(wire, "_wire", None)
    worker = _worker_like(tmp_path)
    with dask.config.set({"dfdl.exchange.transport": transport}):
        wire.install(worker, exchange.deliver)
    assert wire._wire is None and wire.HANDLER not in worker.handlers
    assert ("not one of sockets, dask" in caplog.text) == (transport == "pigeons")


def test_a_wire_that_cannot_open_leaves_values_to_dask(tmp_path, monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise OSError("no Unix sockets here")

    monkeypatch.setattr(wire, "_wire", None)
    monkeypatch.setattr(wire, "Wire", refuse)
    worker = _worker_like(tmp_path)
    wire.install(worker, exchange.deliver)
    assert wire._wire is None and wire.HANDLER not in worker.handlers
    assert "no Unix sockets here" in caplog.text


def test_a_value_that_cannot_be_pickled_fails_alone_and_is_no_lost_peer(monkeypatch):
    import threading

    w = wire.Wire("127.0.0.1", exchange.deliver)
    link = wire.connect(w.endpoints())
    try:
        with pytest.raises(TypeError, match="pickle"):
            link.send("lock", threading.Lock()).result(timeout=10)
        link.send("after-lock", 5).result(timeout=10)  # the link still works
        assert exchange.receive("after-lock", timeout=10) == 5 and link.broken is None
        monkeypatch.setattr(wire, "link_to", lambda worker, address: link)
        box = exchange.Outbox()
        box.worker = SimpleNamespace(address="tcp://here:1")
        box.send("tcp://there:2", ("k", 1), threading.Lock())
        with pytest.raises(exchange.ExchangeError, match="TypeError") as got:
            box.close()
        assert not isinstance(got.value, exchange.PeerLostError)  # no replay for it
    finally:
        link.close()
        w.close()
