"""The kazoo internals coord relies on (coord/backends/zookeeper/_kazoo.py), tested
against the installed kazoo and a real server, so that an upgrade that breaks one fails
here instead of silently in production."""

from __future__ import annotations

import threading
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest
from kazoo.exceptions import NoNodeError
from packaging.version import Version

import coord

from ._support import backend_of, raw_client, stop

if TYPE_CHECKING:
    from coord.testing import ZooKeeperServer

pytestmark = [pytest.mark.anyio, pytest.mark.zookeeper]


def test_kazoo_is_a_checked_version() -> None:
    assert Version("2.10") <= Version(version("kazoo")) < Version("2.12")


async def test_the_negotiated_session_timeout_is_the_leases_ttl(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    """The server clamps the timeout asked for to its bounds (here at most 120 s): the
    lease's TTL, and so its deadline, must be the one granted."""
    assert zookeeper_server.max_session_timeout_ms == 120_000
    async with coord.connect(zookeeper_url, ttl=1.5) as client:
        assert client.session.lease.ttl == 1.5
    async with coord.connect(zookeeper_url, ttl=600) as client:
        assert client.session.lease.ttl == 120.0
        lease = client.session.lease
        assert lease.deadline - anyio.current_time() <= 120.0


async def test_no_node_answers_register_no_watcher(zookeeper_server: ZooKeeperServer) -> None:
    """kazoo adds a watcher to its tables only for a successful read: waiting on a key
    that is already gone leaves nothing behind (so coord never has to touch the tables,
    which kazoo mutates on its connection thread)."""
    observer = await raw_client(zookeeper_server.endpoint)
    try:

        def watched_get() -> None:
            with pytest.raises(NoNodeError):
                observer.get("/coord-no-such-node", watch=lambda event: None)

        await anyio.to_thread.run_sync(watched_get)
        assert "/coord-no-such-node" not in observer._data_watchers
    finally:
        await stop(observer)


async def test_wait_on_a_deleted_key_leaves_no_watcher(zookeeper_url: str) -> None:
    async with coord.connect(zookeeper_url, ttl=5) as client:
        backend = backend_of(client)
        async with client.mutex("gone") as hold:
            key = hold.key
        with anyio.fail_after(5):
            await backend.wait_deleted([key], revision=0)  # returns at once: no node
        kazoo = backend._conn.client
        assert not [p for p in kazoo._data_watchers if p.endswith(key.rpartition("/")[2])]


class _RecordingWatchers(dict):  # type: ignore[type-arg]
    """kazoo's watcher table (path -> set of watchers), recording the thread of every
    change made to it or to its sets."""

    def __init__(self, threads: set[str]) -> None:
        super().__init__()
        self.threads = threads

    def _note(self) -> None:
        self.threads.add(threading.current_thread().name)

    def __missing__(self, key: str) -> set[object]:
        value = _RecordingSet(self)
        self[key] = value
        return value

    def __setitem__(self, key: str, value: object) -> None:
        self._note()
        super().__setitem__(key, value)

    def pop(self, *args: object) -> object:
        self._note()
        return super().pop(*args)


class _RecordingSet(set):  # type: ignore[type-arg]
    def __init__(self, table: _RecordingWatchers) -> None:
        super().__init__()
        self.table = table

    def add(self, item: object) -> None:
        self.table._note()
        super().add(item)

    def discard(self, item: object) -> None:
        self.table._note()
        super().discard(item)


async def test_kazoo_watcher_tables_change_only_on_kazoos_own_thread(zookeeper_url: str) -> None:
    """kazoo changes its watcher tables on its connection thread (and iterates them there
    when it reconnects): coord must never touch them from another thread. Waiters whose
    predecessors leave before they can be watched used to make coord's submitter thread
    remove entries."""
    threads: set[str] = set()
    async with coord.connect(zookeeper_url, ttl=5) as client:
        kazoo = backend_of(client)._conn.client
        kazoo._data_watchers = _RecordingWatchers(threads)
        kazoo._child_watchers = _RecordingWatchers(threads)
        holder = client.mutex("threads")
        await holder.acquire()
        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:
                for _ in range(20):  # waiters that leave, so that successors re-watch
                    scope = anyio.CancelScope()

                    async def wait(scope: anyio.CancelScope = scope) -> None:
                        with scope:
                            await client.mutex("threads").acquire()

                    tg.start_soon(wait)
                    await anyio.sleep(0.01)
                    scope.cancel()
                await holder.release()
    assert threads, "no watcher was registered: the test did not exercise anything"
    # kazoo's connection thread runs its zk_loop; every change must come from there.
    assert all(name.endswith("(zk_loop)") for name in threads), threads


def test_coord_never_references_kazoos_watcher_tables() -> None:
    """The static half of the test above: kazoo's watcher tables belong to its
    connection thread, and no coord module names them (they used to be pruned from
    coord's submitter thread, racing kazoo's iteration of them on a reconnect)."""
    package = Path(coord.__file__).parent
    offenders = [
        f"{path.relative_to(package)}:{number}"
        for path in package.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if ("_data_watchers" in line or "_child_watchers" in line)
        and not line.lstrip().startswith("#")
    ]
    assert offenders == []
