"""Values passed directly between the per-worker tasks of one training step.

On several worker processes each worker runs its share of a step as one task
(:func:`dfdl.taskgraph.step_tasks.group_steps` with ``direct``). What one worker's tiles
need from another's in the same step (a BatchNormalization's partial moments, a weight
gradient's partial sum, an activation slab) is sent by the producing task straight to
the reading worker's mailbox as soon as it is computed (:func:`send`, one message over
the workers' own connections), and the reading task takes it from there
(:func:`receive`), instead of ending a task there, telling the scheduler and starting
another: a step costs one task per worker, however many exchanges it has.

Contract: a value is received exactly once, under the key of the task that made it
(keys carry the run token and the step, so no two runs or steps share one). A task that
fails sends a failure in place of every value it still owed, so its readers raise
(:class:`ExchangeError`; :class:`PeerLostError` when its worker was lost) instead of
waiting; a reader that gets nothing within
:data:`TIMEOUT` seconds (the sender's worker died) raises too, naming the key. A task
waiting for a value leaves its worker's thread to other tasks (``distributed.secede``),
so trainings sharing workers cannot wait for each other forever.

Example:
    >>> deliver("k", 3)
    >>> receive("k", timeout=1)
    3
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Hashable, Iterable

#: the worker handler that takes a value into the mailbox (:func:`install`)
HANDLER = "dfdl_exchange"
#: seconds a task waits for a value before it gives up on the sender
TIMEOUT = 300.0

_box: dict[str, object] = {}
_arrived = threading.Condition()


class ExchangeError(RuntimeError):
    """A value another worker's task owed never came (its task failed, or its worker
    was lost)."""


class PeerLostError(ExchangeError):
    """The worker a value was to come from is gone (the trainer replays the steps since
    its last anchor on the workers left, as for any lost worker)."""


#: seconds between checks, while waiting, that the senders' workers still answer
POLL = 2.0


class _Failed:
    """Sent in place of a value its task could not compute (``lost``: because its worker
    was lost, so the reader's error is a :class:`PeerLostError` too)."""

    def __init__(self, message: str, lost: bool = False):
        self.message = message
        self.lost = lost


def name(key: Hashable) -> str:
    """The mailbox name of a task key: text, since messages would turn a tuple into a
    list (a string is its own name).

    Example:
        >>> name(("conv-fwd-ab12cd34", 3, 0))
        "('conv-fwd-ab12cd34', 3, 0)"
    """
    return key if isinstance(key, str) else repr(key)


def deliver(key: Hashable, value: object) -> None:
    """Put ``value`` into this process's mailbox under ``key``.

    Example:
        >>> deliver(("x", 0), 1.5)
        >>> receive(("x", 0), timeout=1)
        1.5
    """
    with _arrived:
        _box[name(key)] = value
        _arrived.notify_all()


async def _handle(comm=None, key: str = "", value: object = None) -> None:
    with _arrived:
        _box[key] = value
        _arrived.notify_all()


def install(worker) -> None:
    """Let ``worker`` take values sent to it (:func:`send`); done by dfdl's worker setup.

    Example:
        >>> install(get_worker())  # doctest: +SKIP
    """
    worker.handlers[HANDLER] = _handle


def receive(key: Hashable, timeout: float | None = None, sender: str | None = None) -> object:
    """The value sent under ``key``, waiting for it (with the worker's thread seceded:
    other tasks may run meanwhile; see :func:`wait_any`); taken out of the mailbox.

    Raises:
        PeerLostError: the worker at ``sender`` stopped answering.
        ExchangeError: the sender failed, or nothing came within ``timeout`` seconds
            (default :data:`TIMEOUT`).
    """
    names = {0: name(key)}
    wait_any(names, [sender] if sender else (), timeout)
    ((_, value),) = take(names)
    return value


def take(names: dict[int, str]) -> list[tuple[int, object]]:
    """The values of ``names`` (``{index: name}``) that have arrived, taken out of the
    mailbox and of ``names``; does not wait.

    Raises:
        PeerLostError: one of them is the failure of a sender whose worker was lost.
        ExchangeError: one of them is a sender's failure.

    Example:
        >>> deliver("t", 1)
        >>> names = {4: "t", 5: "u"}
        >>> take(names), names
        ([(4, 1)], {5: 'u'})
    """
    got = []
    with _arrived:
        for i, label in list(names.items()):
            if label in _box:
                got.append((i, _box.pop(label)))
                del names[i]
    for _, value in got:
        if isinstance(value, _Failed):
            raise (PeerLostError if value.lost else ExchangeError)(value.message)
    return got


def wait_any(
    names: dict[int, str], senders: Iterable[str] = (), timeout: float | None = None
) -> None:
    """Wait (the worker's thread seceded) until one of ``names`` has arrived, checking
    every :data:`POLL` seconds that the workers at ``senders`` still answer.

    Raises:
        PeerLostError: a sender's worker no longer answers.
        ExchangeError: none came within ``timeout`` seconds (default :data:`TIMEOUT`).
    """
    timeout = TIMEOUT if timeout is None else timeout
    with _arrived:
        if any(label in _box for label in names.values()):
            return
    _secede()
    deadline = time.monotonic() + timeout
    while True:
        with _arrived:
            if any(label in _box for label in names.values()):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                waited = ", ".join(sorted(names.values())[:3])
                raise ExchangeError(
                    f"no value for {waited} from another worker within {timeout:.0f} s: its"
                    " worker stalled (see the cluster's logs)"
                )
            _arrived.wait(min(left, POLL))
            if any(label in _box for label in names.values()):
                return
        if _cancelled():
            raise ExchangeError(
                f"stopped waiting for {', '.join(sorted(names.values())[:2])}: this step was"
                " cancelled (the training was interrupted or replays)"
            )
        for address in senders:
            if not answers(address):
                raise PeerLostError(
                    f"the worker at {address} was lost while this worker waited for its"
                    f" values ({', '.join(sorted(names.values())[:2])})"
                )


def address() -> str | None:
    """The address of the worker this thread runs a task for (None outside a worker).

    Example:
        >>> address() is None
        True
    """
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return None


def _cancelled() -> bool:
    """Whether the task this thread runs was cancelled by the scheduler (False outside
    a worker): a share waiting for values that will not come then ends at once."""
    try:
        from distributed import get_worker
        from distributed.worker import thread_state

        worker = get_worker()
    except (ImportError, ValueError):
        return False
    key = getattr(thread_state, "key", None)
    if key is None:
        return False
    ts = worker.state.tasks.get(key)
    return ts is None or ts.state in ("cancelled", "released", "forgotten")


def answers(address: str) -> bool:
    """Whether the worker at ``address`` answers (True outside a worker).

    Example:
        >>> answers("tcp://127.0.0.1:9")  # outside a worker: nothing to ask with
        True
    """
    try:
        from distributed import get_worker
        from distributed.utils import sync

        worker = get_worker()
    except (ImportError, ValueError):
        return True
    if address == worker.address:
        return True
    try:
        sync(worker.loop, worker.rpc(address).identity, callback_timeout=10)
    except Exception:  # noqa: BLE001 - refused, closed or timed out: gone
        return False
    return True


#: seconds a share moved off its worker waits before it asks to go back (while its
#: worker is paused for memory, Dask may keep placing it elsewhere)
RESCHEDULE_DELAY_S = 0.2


def reschedule(home: str) -> None:
    """Hand the running task back to the scheduler, to run on its worker at ``home``
    (``distributed.Reschedule``; its restrictions send it there while that worker runs).

    Raises:
        distributed.Reschedule: always.
    """
    from distributed import Reschedule

    time.sleep(RESCHEDULE_DELAY_S)
    raise Reschedule(f"this share of a step runs on its own worker, {home}")


def begin() -> None:
    """Mark the start of a task that may wait for values (:func:`receive` secedes once
    per task)."""
    try:
        from distributed.worker import thread_state
    except ImportError:  # pragma: no cover - dask without distributed
        return
    thread_state.dfdl_seceded = False


def _secede() -> None:
    """Leave this worker thread's slot to other tasks while this one waits (once)."""
    try:
        from distributed import secede
        from distributed.worker import thread_state
    except ImportError:  # pragma: no cover - dask without distributed
        return
    if getattr(thread_state, "key", None) is not None and not getattr(
        thread_state, "dfdl_seceded", False
    ):
        secede()
        thread_state.dfdl_seceded = True


def _failed_future(error: BaseException):
    import concurrent.futures

    f = concurrent.futures.Future()
    f.set_exception(error)
    return f


class Outbox:
    """The values one task sends, in flight on the sockets of :mod:`dfdl.taskgraph.wire`
    (or, to a worker without one, on the worker's event loop as Dask messages);
    :meth:`close` waits until all of them are written (so a task ends only once what it
    owed has left it)."""

    def __init__(self):
        self.pending: list = []
        self.worker = None

    def send(self, address: str, key: Hashable, value: object) -> None:
        """Send ``value`` under ``key`` to the worker at ``address`` (this process's own
        mailbox when that is this worker)."""
        worker = self._worker()
        if worker is None or address == worker.address:
            deliver(key, value)
            return
        from dfdl.taskgraph import wire

        try:
            link = wire.link_to(worker, address)
        except Exception as e:  # noqa: BLE001 - its worker did not answer: lost
            self.pending.append((address, _failed_future(e)))
            return
        if link is not None:  # a socket of dfdl's own (dfdl.taskgraph.wire)
            self.pending.append((address, link.send(name(key), value)))
            return
        from distributed.protocol import to_serialize

        call = worker.rpc(address).dfdl_exchange(key=name(key), value=to_serialize(value))
        self.pending.append(
            (address, asyncio.run_coroutine_threadsafe(call, worker.loop.asyncio_loop))
        )

    def fail(self, address: str, key: Hashable, message: str, lost: bool = False) -> None:
        """Send a failure under ``key``: its reader raises ``message`` (as a
        :class:`PeerLostError` when ``lost``: the sender's worker was lost)."""
        self.send(address, key, _Failed(message, lost))

    def close(self) -> None:
        """Wait until every value sent was written to its connection (a Dask message:
        delivered).

        Raises:
            PeerLostError: a value could not be sent (its worker is gone).
            ExchangeError: a value could not be sent for itself (it cannot be pickled).
        """
        pending, self.pending = self.pending, []
        for address, f in pending:
            try:
                f.result()
            except OSError as e:  # refused, closed, timed out: the reader is gone
                raise PeerLostError(
                    f"could not send a value to the worker at {address}: {type(e).__name__}: {e}"
                ) from e
            except Exception as e:  # noqa: BLE001 - the value itself (it cannot be pickled)
                raise ExchangeError(
                    f"could not send a value to the worker at {address}: {type(e).__name__}: {e}"
                ) from e

    def _worker(self):
        if self.worker is None:
            try:
                from distributed import get_worker

                self.worker = get_worker()
            except (ImportError, ValueError):
                return None
        return self.worker
