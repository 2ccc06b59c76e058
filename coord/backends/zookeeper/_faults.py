"""Fault injection and server statistics for coord.testing.

* :func:`expire_session` ends a session for real, the way kazoo's and ZooKeeper's own
  test harnesses do: a second client attaches to the session (same id and password),
  which takes it over, then closes it. The server deletes the session's ephemeral nodes
  and the first client learns it the way it would in production.
* :func:`server_counters` reads the ``mntr`` four-letter word of every member (it must
  be allowed by ``4lw.commands.whitelist``); it blocks (for benchmarks), and
  :func:`notifications_sent_async` is its use on the event loop.

The backend's hooks (:class:`FaultHooks`) run on the event loop, with no thread.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
from kazoo import exceptions as kz

from ._wire import WireClient

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._connection import Connection
    from ._lease import SessionPolicy
    from ._options import Options
    from ._paths import Paths
    from ._waitqueue import WaitQueues

__all__ = [
    "FaultHooks",
    "expire_session",
    "notifications_sent",
    "notifications_sent_async",
    "server_counters",
]

_EXPIRE_WITHIN = 20.0

_WATCH_COUNTERS = tuple(
    f"zk_sum_node_{kind}_watch_count" for kind in ("created", "deleted", "changed", "children")
)


async def expire_session(
    hosts: Sequence[tuple[str, int]],
    session_id: int,
    password: bytes,
    auth: Sequence[tuple[str, str]],
) -> None:
    """End session *session_id* on the server now. A checkpoint.

    The owner reconnects within milliseconds and takes its session back from the
    intruder; whoever holds it last, the close is retried until the server no longer
    knows the session (an intruder attaching to it is then told it expired).
    """
    with anyio.fail_after(_EXPIRE_WITHIN):
        while True:
            session = (session_id, password)
            intruder = WireClient(
                hosts, session_timeout=10, connect_timeout=2, auth=auth, resume=session
            )
            try:
                async with intruder:  # leaving it closes the session it holds
                    taken_over = intruder.session_id == session_id
            except kz.SessionExpiredError:
                return  # the server no longer knows the session: it is over
            except kz.ConnectionLoss:
                continue  # the owner took the session back first: try again
            if not taken_over:
                return


def _four_letter(host: str, port: int, command: bytes) -> str:
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(command)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


async def _four_letter_async(host: str, port: int, command: bytes) -> str:
    chunks = []
    with anyio.fail_after(5):
        async with await anyio.connect_tcp(host, port) as stream:
            await stream.send(command)
            try:
                while True:
                    chunks.append(await stream.receive())
            except anyio.EndOfStream:
                pass
    return b"".join(chunks).decode(errors="replace")


def _counters(text: str) -> dict[str, int]:
    counters = {}
    for line in text.splitlines():
        name, _, value = line.partition("\t")
        if value.strip().lstrip("-").isdigit():
            counters[name] = int(value)
    return counters


def server_counters(hosts: list[tuple[str, int]]) -> list[dict[str, int]]:
    """The numeric ``mntr`` counters of every reachable member. Blocks."""
    members = []
    for host, port in hosts:
        try:
            members.append(_counters(_four_letter(host, port, b"mntr")))
        except OSError:
            continue
    return members


async def notifications_sent_async(hosts: list[tuple[str, int]]) -> int:
    """:func:`notifications_sent`, on the event loop. A checkpoint."""
    total = 0
    for host, port in hosts:
        try:
            counters = _counters(await _four_letter_async(host, port, b"mntr"))
        except (OSError, TimeoutError):
            continue
        total += sum(counters.get(name, 0) for name in _WATCH_COUNTERS)
    return total


def notifications_sent(hosts: list[tuple[str, int]]) -> int:
    """Watch notifications sent by the whole ensemble so far (every kind of event).

    Counted with ZooKeeper's own per-event watcher counters rather than
    ``zk_packets_sent``, which also counts replies, pings and these very ``mntr``
    requests.
    """
    return sum(m.get(name, 0) for m in server_counters(hosts) for name in _WATCH_COUNTERS)


class FaultHooks:
    """The backend's ``_fault_*`` hooks (see :mod:`coord.testing`) and
    :meth:`drop_connection`. A mixin of :class:`~._backend.ZooKeeperBackend`."""

    _hosts: list[tuple[str, int]]
    _options: Options
    _paths: Paths
    _conn: Connection
    _queues: WaitQueues
    _policy: SessionPolicy

    def _check_open(self) -> None:
        raise NotImplementedError

    async def _fault_expire_lease(self, lease_id: int) -> None:
        """End session *lease_id* on the server now (a second client takes it over and
        closes it). The client learns it the way it would in production. Shielded (the
        caller's holds may be cancelled by the session's suspension meanwhile)."""
        self._check_open()
        client = self._conn.client
        auth = self._options.auth_data
        with anyio.CancelScope(shield=True):
            if client is None or client.session_id != lease_id:
                await expire_session(self._hosts, lease_id, b"\x00" * 16, auth)
                return
            # The owner would take its session back from the intruder within
            # milliseconds, before the intruder closes it: it waits until it is over.
            with client.reconnection_held():
                await expire_session(self._hosts, lease_id, client.password, auth)

    async def _fault_delete_key(self, key: str) -> None:
        """Delete *key* as another client would."""
        self._check_open()
        await self._queues.delete_path(self._paths.path(key))

    async def _fault_compact(self) -> None:
        """Nothing to do: ZooKeeper keeps no history of changes to begin with."""
        self._check_open()
        await anyio.lowlevel.checkpoint()

    async def _fault_wakeups(self) -> int:
        """Watch notifications sent by the ensemble so far (``mntr``)."""
        return await notifications_sent_async(self._hosts)

    async def drop_connection(self) -> None:
        """Break the TCP connection now, as a network failure would (for tests).

        The wire client reconnects by itself, to the same session if it is still alive;
        requests in flight fail with a connection loss. A checkpoint: returns once the
        connection is suspended.
        """
        self._check_open()
        client = await self._conn.ready(self._conn.timeout)
        suspended = self._policy.suspended
        assert suspended is not None
        client.drop_connection()
        await suspended.wait()
