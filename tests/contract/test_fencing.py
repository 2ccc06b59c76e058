"""coord.fenced_put on every store: a write guarded by the holder's key succeeds only
while the lock is held, and never after the hold was lost, released or taken over."""

from __future__ import annotations

import anyio
import pytest

import coord
from coord.testing import drop_key, expire_session

pytestmark = pytest.mark.anyio


async def value_of(client: coord.Client, key: str) -> bytes | None:
    entry = await client.backend.get(key)
    return None if entry is None else entry.value


async def test_fenced_put_writes_while_held_and_refuses_once_released(
    clients: list[coord.Client],
) -> None:
    a, b = clients[0], clients[1]
    async with a.mutex("f/lock") as hold:
        await coord.fenced_put(hold, "f/data", b"first")
        await coord.fenced_put(hold, "f/data", b"again")  # the same holder, many writes
    assert await value_of(b, "f/data") == b"again"
    with pytest.raises(coord.LockLost, match="no longer held"):
        await coord.fenced_put(hold, "f/data", b"stale")
    async with b.mutex("f/lock") as newer:
        await coord.fenced_put(newer, "f/data", b"newer")
    assert await value_of(a, "f/data") == b"newer"


async def test_fenced_put_is_refused_by_the_store_once_the_key_is_gone(
    clients: list[coord.Client],
) -> None:
    a, b = clients[0], clients[1]
    with pytest.raises(coord.LockLost):
        async with a.mutex("f/lock") as hold:
            await drop_key(a, hold.key)  # another client deletes it: the lock is free
            # Our hold has not noticed yet (its guard watch starts after a second), so
            # the write is sent: the store refuses it.
            with pytest.raises(coord.LockLost, match="refused"):
                await coord.fenced_put(hold, "f/data", b"stale")
            async with b.mutex("f/lock") as successor:
                await coord.fenced_put(successor, "f/data", b"successor")
            await anyio.sleep_forever()  # cancelled: the loss is noticed
    assert await value_of(b, "f/data") == b"successor"


async def test_fenced_put_after_the_session_expired(clients: list[coord.Client]) -> None:
    a, b = clients[0], clients[1]
    with pytest.raises(coord.LockLost):
        async with a.mutex("f/lock") as hold:
            await coord.fenced_put(hold, "f/data", b"mine")
            await expire_session(a)
            with anyio.fail_after(30):
                await hold.wait_lost()
    with pytest.raises(coord.LockLost):
        await coord.fenced_put(hold, "f/data", b"stale")
    assert await value_of(b, "f/data") == b"mine"


async def test_fenced_put_with_a_term_raises_leadership_lost(
    clients: list[coord.Client],
) -> None:
    a = clients[0]
    async with a.election("f/leader").campaign(b"a") as term:
        await term.proclaim(b"a, busy")  # a new version of the key: still the same entry
        await coord.fenced_put(term, "f/config", b"from the leader")
    with pytest.raises(coord.LeadershipLost):
        await coord.fenced_put(term, "f/config", b"stale")
    assert await value_of(a, "f/config") == b"from the leader"


@pytest.mark.parametrize("key", ["", "f//data", "f/lock", "f", "f/@w1"])
async def test_fenced_put_refuses_bad_keys_and_the_locks_own_node(
    clients: list[coord.Client], key: str
) -> None:
    """Found by review: on ZooKeeper the lock's own node (and its parents) is a container
    that the server deletes once the lock is idle, and the value with it; an empty key
    wrote the namespace's root. Refused at the call, on every store, writing nothing."""
    a = clients[0]
    async with a.mutex("f/lock") as hold:
        with pytest.raises(coord.ConfigurationError):
            await coord.fenced_put(hold, key, b"x")
    if key:
        written = await a.backend.get(key)  # (on ZooKeeper a lock's parents are nodes)
        assert written is None or written.value != b"x"
