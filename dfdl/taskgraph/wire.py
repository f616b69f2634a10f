"""Values passed between worker processes over sockets of dfdl's own, off the event loop.

The values one worker's share of a step sends another (:mod:`dfdl.taskgraph.exchange`)
went as Dask messages (a request and a reply through both workers' event loops, each
value framed, serialized, encrypted and copied by Dask's comm layer): on 2 cores the two
event loops took 0.2 s of CPU a ResNet step from the kernels, 0.5 s an MLP step
(``docs/design/worker-shares.md``, "Sockets of its own"). A :class:`Wire` instead gives
each worker a listener of its own; a value goes as one message on a connection kept
open per pair of workers, written by a thread of the sender (the pickled header and the
arrays' own memory, no copy) and read by a thread of the receiver straight into fresh
arrays, which it puts in the mailbox (:func:`dfdl.taskgraph.exchange.deliver`).

Which socket: workers on one host connect over a Unix socket in a directory only the
workers' user may enter (mode 0700; that user can already read the workers' memory, so
nothing is exposed that was not); workers on other hosts over TCP, with the cluster's
own TLS certificates where the cluster uses TLS (both sides authenticated, as Dask's own
connections are), plain TCP where Dask's are plain. A peer that has no wire, or cannot
be reached on it, is sent values as Dask messages, as before.

Contract: :meth:`Link.send` returns a future that is done once the message is written to
the connection (its error, when the peer is gone, is ``OSError``); a message is read
whole and delivered, or, when its connection breaks first, not at all (the reader then
waits for it and learns from :func:`dfdl.taskgraph.exchange.answers` that the sender is
gone).

Example:
    >>> from dfdl.taskgraph import exchange
    >>> w = Wire("127.0.0.1", exchange.deliver)
    >>> link = connect(w.endpoints())
    >>> link.send("k", 3).result(timeout=5)
    >>> exchange.receive("k", timeout=5)
    3
    >>> link.close(); w.close()
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import pickle
import queue
import shutil
import socket
import ssl
import struct
import tempfile
import threading
from collections.abc import Callable, Mapping

import numpy as np

logger = logging.getLogger(__name__)

#: the values of ``dfdl.exchange.transport``: this module's sockets, or Dask's messages
TRANSPORTS = ("sockets", "dask")
#: the worker handler that tells a peer this worker's endpoints (:func:`install`)
HANDLER = "dfdl_wire"
#: seconds to connect to a peer's listener (and to finish a TLS handshake)
CONNECT_TIMEOUT = 10.0
#: the first bytes of a connection: a wire of this format
MAGIC = b"dfdlw\x01"

_COUNT = struct.Struct("!I")
_LENGTH = struct.Struct("!Q")


class Wire:
    """One process's listeners (a Unix socket and a TCP socket on ``host``) and the
    threads that read what peers send to them into the mailbox.

    Args:
        host: the address the TCP listener binds (the worker's own).
        deliver: called with ``(key, value)`` for each value read (the mailbox's
            :func:`dfdl.taskgraph.exchange.deliver`).
        server_tls: the TLS context of the listener (None: plain TCP).
        client_tls: the TLS context of this process's connections to peers.
        directory: where to make the Unix socket's private directory (default: the
            system's temporary directory).
        unix: whether links to peers on this host use their Unix socket (else TCP, as
            between hosts).

    Example:
        >>> w = Wire("127.0.0.1", print)
        >>> sorted(w.endpoints(_node())), w.port
        (['node', 'unix'], None)
        >>> sorted(w.endpoints())
        ['host', 'node', 'tcp', 'tls', 'unix']
        >>> w.close()
    """

    def __init__(
        self,
        host: str,
        deliver: Callable[[str, object], None],
        server_tls: ssl.SSLContext | None = None,
        client_tls: ssl.SSLContext | None = None,
        directory: str | None = None,
        unix: bool = True,
    ):
        self.host, self.deliver, self.unix = host, deliver, unix
        self.server_tls, self.client_tls = server_tls, client_tls
        self.links: dict[str, Link | None] = {}
        self.lock = threading.Lock()
        self.received = 0
        self._closed = False
        self._conns: set = set()
        self._dir = tempfile.mkdtemp(prefix="dfdl-wire-", dir=directory)  # mode 0700
        self.unix_path = os.path.join(self._dir, "s")
        self._unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._unix.bind(self.unix_path)
        self._unix.listen(64)
        self._listen(self._unix, None)
        self._tcp: socket.socket | None = None
        self.port: int | None = None

    def _listen(self, sock: socket.socket, tls: ssl.SSLContext | None) -> None:
        threading.Thread(
            target=self._accept, args=(sock, tls), name="dfdl-wire-accept", daemon=True
        ).start()

    def endpoints(self, node: str | None = None) -> dict:
        """Where a peer on ``node`` (:func:`_node`; None: anywhere) reaches this process:
        ``{"node", "unix"}`` for a peer on this host; for one elsewhere also ``"host"``,
        ``"tcp"`` (the port) and ``"tls"``, the TCP listener opened on the first such
        request (a worker whose peers all share its host listens on no port)."""
        out = {"node": _node(), "unix": self.unix_path}
        if node == out["node"]:
            return out
        with self.lock:
            if self._tcp is None and not self._closed:
                tcp = socket.socket(_family(self.host), socket.SOCK_STREAM)
                tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                tcp.bind((self.host, 0))
                tcp.listen(64)
                self._tcp, self.port = tcp, tcp.getsockname()[1]
                self._listen(tcp, self.server_tls)
        return {**out, "host": self.host, "tcp": self.port, "tls": self.server_tls is not None}

    def _accept(self, sock: socket.socket, tls: ssl.SSLContext | None) -> None:
        while not self._closed:
            try:
                conn, _ = sock.accept()
            except OSError:  # closed
                return
            threading.Thread(
                target=self._read, args=(conn, tls), name="dfdl-wire-read", daemon=True
            ).start()

    def _read(self, conn: socket.socket, tls: ssl.SSLContext | None) -> None:
        self._conns.add(conn)
        try:
            if self._closed:
                return
            if tls is not None:
                conn.settimeout(CONNECT_TIMEOUT)
                self._conns.discard(conn)
                conn = tls.wrap_socket(conn, server_side=True)  # the plain one is detached
                self._conns.add(conn)
                conn.settimeout(None)
            elif conn.family != socket.AF_UNIX:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if _exactly(conn, len(MAGIC)) != MAGIC:
                return  # not a dfdl wire: nothing it sends is read
            while True:
                key, value = read_message(conn)
                self.deliver(key, value)
                self.received += 1
        except (EOFError, OSError, pickle.UnpicklingError, struct.error):
            return  # the peer closed or was lost: its readers learn it by polling
        finally:
            self._conns.discard(conn)
            conn.close()

    def link(self, address: str, endpoints: Mapping | None) -> Link | None:
        """This process's connection to the peer at ``address`` (made on first use from
        its ``endpoints``, then kept); None where it has no wire or cannot be reached
        on it (values then go as Dask messages)."""
        with self.lock:
            found = self.links.get(address, False)
            if found is None or (found and found.broken is None):
                return found
        made = None
        if endpoints is not None:  # connected outside the lock: it may take seconds
            with contextlib.suppress(OSError):
                made = connect(endpoints, self.client_tls, self.unix)
        with self.lock:
            found = self.links.get(address, False)
            if found and found.broken is None:  # another thread made one meanwhile
                if made is not None:
                    made.close()
                return found
            self.links[address] = made
            return made

    def close(self) -> None:
        """Closes the listeners, the connections peers made and the links, removes the
        Unix socket's directory."""
        self._closed = True
        with self.lock:
            listeners = [s for s in (self._unix, self._tcp) if s is not None]
        for sock in (*listeners, *list(self._conns)):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self.lock:
            for link in self.links.values():
                if link is not None:
                    link.close()
            self.links.clear()
        shutil.rmtree(self._dir, ignore_errors=True)


class Link:
    """A connection to one peer's :class:`Wire` and the thread that writes to it, one
    message after another, in the order sent."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.broken: BaseException | None = None
        self.sent = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._write, name="dfdl-wire-send", daemon=True).start()

    def send(self, key: str, value: object) -> concurrent.futures.Future:
        """Queue ``value`` for the peer's mailbox under ``key``; the future is done once
        it is written, or holds the ``OSError`` of a broken connection (this message's
        and every later one's), or the error that kept ``value`` from being pickled
        (this message's only: nothing of it was written)."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        if self.broken is not None:
            done.set_exception(OSError(f"the connection to this peer broke: {self.broken}"))
        else:
            self._queue.put((key, value, done))
        return done

    def _write(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            key, value, done = item
            if self.broken is not None:
                done.set_exception(OSError(f"the connection to this peer broke: {self.broken}"))
                continue
            try:
                head, raws = pack_message(key, value)
            except Exception as e:  # noqa: BLE001 - not picklable: this value fails, not the link
                done.set_exception(e)
                continue
            try:
                write_packed(self.sock, head, raws)
            except OSError as e:
                self.broken = e
                done.set_exception(OSError(f"the connection to this peer broke: {e}"))
                continue
            self.sent += 1
            done.set_result(None)

    def close(self) -> None:
        """Ends the writing thread after what was queued, then closes the connection."""
        self._queue.put(None)
        self.broken = self.broken or EOFError("closed")
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def connect(endpoints: Mapping, tls: ssl.SSLContext | None = None, unix: bool = True) -> Link:
    """A :class:`Link` to the wire at ``endpoints``: its Unix socket where it is on
    this host (and ``unix``), else its TCP port (TLS with ``tls`` where the wire
    requires it).

    Raises:
        OSError: the wire cannot be reached (or requires TLS and ``tls`` is None).

    Example:
        >>> w = Wire("127.0.0.1", print)
        >>> connect(w.endpoints()).close(); w.close()
    """
    sock = None
    if unix and endpoints["node"] == _node() and os.path.exists(endpoints["unix"]):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(endpoints["unix"])
        except OSError:  # another host's path after all, or its worker is gone: TCP
            sock.close()
            sock = None
    if sock is None:
        if "tcp" not in endpoints:
            raise OSError("the peer's wire has no TCP endpoint for this host")
        if endpoints["tls"] and tls is None:
            raise OSError("the peer's wire requires TLS and this process has no certificate")
        sock = socket.create_connection(
            (endpoints["host"], endpoints["tcp"]), timeout=CONNECT_TIMEOUT
        )
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if endpoints["tls"]:
            hostname = endpoints["host"] if tls.check_hostname else None
            sock = tls.wrap_socket(sock, server_hostname=hostname)
    sock.settimeout(None)
    sock.sendall(MAGIC)
    return Link(sock)


def write_message(sock: socket.socket, key: str, value: object) -> None:
    """Writes ``(key, value)`` to ``sock``: the number of parts, their lengths, the
    pickled header and the out-of-band buffers of its arrays (their own memory)."""
    write_packed(sock, *pack_message(key, value))


def pack_message(key: str, value: object) -> tuple[bytes, list]:
    """``(key, value)`` pickled: the header and the raw buffers of its arrays."""
    buffers: list = []
    head = pickle.dumps((key, value), protocol=5, buffer_callback=buffers.append)
    return head, [b.raw() for b in buffers]


def write_packed(sock: socket.socket, head: bytes, raws: list) -> None:
    """Writes a message of :func:`pack_message` to ``sock``."""
    lengths = [len(head), *(r.nbytes for r in raws)]
    prefix = _COUNT.pack(len(lengths)) + b"".join(_LENGTH.pack(n) for n in lengths)
    sock.sendall(prefix + head)
    for r in raws:
        sock.sendall(r)


def read_message(sock: socket.socket) -> tuple[str, object]:
    """Reads one message of :func:`write_message`: ``(key, value)``, the arrays in
    fresh memory of their own.

    Raises:
        EOFError: the connection closed before the message was whole.
    """
    (n,) = _COUNT.unpack(_exactly(sock, _COUNT.size))
    lengths = [_LENGTH.unpack(_exactly(sock, _LENGTH.size))[0] for _ in range(n)]
    head = _exactly(sock, lengths[0])
    buffers = []
    for size in lengths[1:]:
        buf = np.empty(size, np.uint8)
        _fill(sock, memoryview(buf))
        buffers.append(buf)
    return pickle.loads(head, buffers=buffers)


def _exactly(sock: socket.socket, size: int) -> bytes:
    buf = bytearray(size)
    _fill(sock, memoryview(buf))
    return bytes(buf)


def _fill(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            raise EOFError("the connection closed inside a message")
        got += n


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _node() -> str:
    """This host's identity: its name and boot id (two containers of one name on
    different hosts differ by boot id)."""
    boot = ""
    with contextlib.suppress(OSError):
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    return f"{socket.gethostname()}/{boot}"


_wire: Wire | None = None


def install(worker, deliver: Callable[[str, object], None]) -> None:
    """Starts this process's :class:`Wire` (with the cluster's TLS certificates where it
    uses TLS; once per process, which workers of one process share, as they share the
    mailbox) and the handler that tells peers its endpoints; done by dfdl's worker
    setup, on the worker's event loop (so the wire's threads run at its priority, not
    at the tile threads' lower one). ``dfdl.exchange.transport: dask`` in Dask's config
    leaves values to Dask's messages, as does a wire that cannot be opened here (logged).
    ``deliver`` takes each value read (:func:`dfdl.taskgraph.exchange.deliver`).

    Example:
        >>> install(get_worker(), exchange.deliver)  # doctest: +SKIP
    """
    global _wire
    import dask

    transport = dask.config.get("dfdl.exchange.transport", "sockets")
    if transport not in TRANSPORTS:
        logger.warning(
            "dfdl.exchange.transport is %r, not one of %s: values between workers go as"
            " Dask messages",
            transport,
            ", ".join(TRANSPORTS),
        )
    if transport != "sockets":
        return
    if _wire is None:
        from urllib.parse import urlsplit

        address = urlsplit(worker.address)
        server_tls = client_tls = None
        if address.scheme == "tls":
            server_tls = worker.security.get_listen_args("worker")["ssl_context"]
            client_tls = worker.security.get_connection_args("worker")["ssl_context"]
        directory = worker.local_directory
        if len(os.path.join(directory, "dfdl-wire-xxxxxxxx", "s")) > 100:  # sun_path's limit
            directory = None
        try:
            _wire = Wire(address.hostname, deliver, server_tls, client_tls, directory)
        except (OSError, AttributeError) as e:  # no Unix sockets, a path too long, ...
            logger.warning(
                "dfdl's wire could not be opened (%s: %s): values between workers go as"
                " Dask messages",
                type(e).__name__,
                e,
            )
            return
    wire = _wire
    worker.handlers[HANDLER] = lambda comm=None, node=None: wire.endpoints(node)


def link_to(worker, address: str) -> Link | None:
    """This worker's link to the worker at ``address`` (made the first time, and again
    after it broke, on the worker's event loop: asking the peer for its endpoints
    through Dask, and so that the link's thread runs at the loop's priority); None
    without a wire here or there.

    Example:
        >>> link_to(get_worker(), "tls://10.0.0.2:40111")  # doctest: +SKIP
    """
    wire = _wire
    if wire is None:
        return None
    found = wire.links.get(address, False)
    if found is None or (found and found.broken is None):
        return found
    from distributed.utils import sync

    return sync(worker.loop, _made, worker, wire, address)


async def _made(worker, wire: Wire, address: str) -> Link | None:
    import asyncio

    try:
        endpoints = await getattr(worker.rpc(address), HANDLER)(node=_node())
    except Exception:  # noqa: BLE001 - no such handler (no wire there) or no answer
        endpoints = None
    return await asyncio.get_running_loop().run_in_executor(None, wire.link, address, endpoints)
