"""The kazoo internals coord relies on (coord/backends/zookeeper/_kazoo.py), tested
against the installed kazoo and a real server, so that an upgrade that breaks one fails
here instead of silently in production."""

from __future__ import annotations

from importlib.metadata import version
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
