"""Fault injection and server statistics for coord.testing.

* :func:`expire_session` ends a session for real, the way kazoo's and ZooKeeper's own
  test harnesses do: a second client attaches to the session (same id and password),
  which takes it over, then closes it. The server deletes the session's ephemeral nodes
  and the first client learns it the way it would in production.
* :func:`server_counters` reads the ``mntr`` four-letter word of every member (it must
  be allowed by ``4lw.commands.whitelist``).

Both block: the backend's hooks (:class:`FaultHooks`) run them in a worker thread.
"""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from ._kazoo import CONNECTION_DROP, queue_request

if TYPE_CHECKING:
    from ._bridge import Bridge
    from ._connection import Connection
    from ._lease import SessionPolicy
    from ._options import Options
    from ._paths import Paths
    from ._queue import Queues

__all__ = ["FaultHooks", "expire_session", "notifications_sent", "server_counters"]

_EXPIRE_WITHIN = 20.0

_WATCH_COUNTERS = tuple(
    f"zk_sum_node_{kind}_watch_count" for kind in ("created", "deleted", "changed", "children")
)


def expire_session(
    hosts: str, session_id: int, password: bytes, auth_data: list[tuple[str, str]]
) -> None:
    """End session *session_id* on the server now. Blocks; call it in a thread.

    The owner reconnects within milliseconds and takes its session back from the
    intruder; whoever holds it last, the close is retried until the server no longer
    knows the session (an intruder attaching to it then gets a new one).
    """
    deadline = time.monotonic() + _EXPIRE_WITHIN
    while time.monotonic() < deadline:
        intruder = KazooClient(
            hosts=hosts,
            client_id=(session_id, password),
            auth_data=auth_data or None,
            connection_retry=KazooRetry(max_tries=-1, delay=0.02, max_delay=0.2),
        )
        try:
            intruder.start(timeout=2)
        except KazooTimeoutError:
            continue  # the owner took the session back first: try again
        try:
            client_id = intruder.client_id
            taken_over = client_id is not None and client_id[0] == session_id
        finally:
            intruder.stop()  # closes whichever session it holds: ours, or a fresh one
            intruder.close()
        if not taken_over:
            return  # the server no longer knew the session: it is over
    raise RuntimeError(f"session {session_id:#x} could not be expired in {_EXPIRE_WITHIN}s")


def _four_letter(host: str, port: int, command: bytes) -> str:
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(command)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def server_counters(hosts: list[tuple[str, int]]) -> list[dict[str, int]]:
    """The numeric ``mntr`` counters of every reachable member."""
    members = []
    for host, port in hosts:
        try:
            text = _four_letter(host, port, b"mntr")
        except OSError:
            continue
        counters = {}
        for line in text.splitlines():
            name, _, value = line.partition("\t")
            if value.strip().lstrip("-").isdigit():
                counters[name] = int(value)
        members.append(counters)
    return members


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
    _bridge: Bridge
    _conn: Connection
    _queues: Queues
    _policy: SessionPolicy

    def _check_open(self) -> None:
        raise NotImplementedError

    async def _fault_expire_lease(self, lease_id: int) -> None:
        """End session *lease_id* on the server now (a second client takes it over and
        closes it). The client learns it the way it would in production."""
        self._check_open()
        password = self._conn.password if lease_id == self._conn.session_id else b""
        auth = list(self._options.auth_data)
        await anyio.to_thread.run_sync(expire_session, self._conn.hosts, lease_id, password, auth)

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
        return await anyio.to_thread.run_sync(notifications_sent, self._hosts)

    async def drop_connection(self) -> None:
        """Break the TCP connection now, as a network failure would (for tests).

        kazoo reconnects by itself, to the same session if it is still alive; requests
        in flight fail with a connection loss. A checkpoint: returns once the connection
        is suspended.
        """
        self._check_open()
        client = await self._conn.current(self._conn.timeout)
        suspended = self._policy.suspended
        assert suspended is not None
        self._bridge.submit(lambda: queue_request(client, CONNECTION_DROP, None))
        await suspended.wait()
