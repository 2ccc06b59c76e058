"""The etcd layout keeps coord's guarantees where it can: local FIFO in front of the
session's one key, cancellation leaves no key, a loss cancels the body, the client
outlives its sessions; and what it cannot do is refused at the call."""

from __future__ import annotations

import asyncio

import anyio
import pytest

import coord
from coord.testing import drop_key, expire_session

pytestmark = [pytest.mark.etcd]


def connect(url: str, ttl: float = 5) -> coord.Client:
    return coord.connect(url, ttl=ttl, layout="etcd")


async def keys(client: coord.Client, name: str) -> list[str]:
    return [e.key for e in (await client.backend.keys_by_creation(name + "/")).entries]


async def until_count(client: coord.Client, name: str, count: int) -> None:
    """Until *name* has exactly *count* keys (by watch, no polling)."""
    while True:
        listing = await client.backend.keys_by_creation(name + "/")
        if len(listing.entries) == count:
            return
        await client.backend.wait_keys_changed(name + "/", revision=listing.revision)


async def test_tasks_of_one_client_queue_locally_behind_one_key(etcd_url: str) -> None:
    order: list[int] = []
    with anyio.fail_after(10):
        async with connect(etcd_url) as client:
            mutex = client.mutex("m")
            first = await mutex.acquire()

            async def take(i: int) -> None:
                async with mutex as hold:
                    order.append(i)
                    assert await keys(client, "m") == [hold.key]  # one key per session

            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(take, i)
                    await anyio.wait_all_tasks_blocked()
                assert await keys(client, "m") == [first.key]
                assert mutex.statistics().tasks_waiting == 3
                await mutex.release()
            assert order == [0, 1, 2]
            assert await keys(client, "m") == []


@pytest.mark.parametrize("native", [False, True])
async def test_cancelled_wait_leaves_no_key(etcd_url: str, native: bool) -> None:
    with anyio.fail_after(10):
        async with connect(etcd_url) as holder, connect(etcd_url) as waiter:
            async with holder.mutex("c"):
                task = None

                async def wait() -> None:
                    nonlocal task
                    task = asyncio.current_task() if native else None
                    await waiter.mutex("c").acquire()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait)
                    await until_count(holder, "c", 2)
                    if native:
                        assert task is not None
                        task.cancel()
                    else:
                        tg.cancel_scope.cancel()
                with anyio.fail_after(3):
                    await until_count(holder, "c", 1)
                assert await keys(holder, "c") == [f"c/{holder.session.id:x}"]
            # and the waiter's client can take it at once afterwards
            async with waiter.mutex("c") as hold:
                assert hold.key == f"c/{waiter.session.id:x}"


async def test_deleted_key_cancels_the_body(etcd_url: str) -> None:
    with anyio.fail_after(10):
        async with connect(etcd_url) as client:
            with pytest.raises(coord.LockLost):
                async with client.mutex("l") as hold:
                    await drop_key(client, hold.key)
                    await anyio.sleep(8)  # cancelled by the loss, never slept out
            assert await keys(client, "l") == []


async def test_client_outlives_its_session(etcd_url: str) -> None:
    with anyio.fail_after(10):
        async with connect(etcd_url, ttl=2) as client:
            with pytest.raises(coord.LockLost):
                async with client.mutex("s"):
                    await expire_session(client)
                    await anyio.sleep(8)
            async with client.mutex("s") as hold:  # on the next session, a new key
                assert hold.key == f"s/{client.session.id:x}"


async def test_try_acquire(etcd_url: str) -> None:
    with anyio.fail_after(10):
        async with connect(etcd_url) as a, connect(etcd_url) as b:
            mutex = a.mutex("t")
            hold = await mutex.try_acquire()
            assert hold.fence == (await a.backend.get(hold.key)).revision  # type: ignore[union-attr]
            with pytest.raises(coord.LockedError):
                await b.mutex("t").try_acquire()
            assert await keys(a, "t") == [hold.key]  # b's key was removed again
            await mutex.release()
            assert await keys(a, "t") == []


async def test_refused_at_the_call(etcd_url: str) -> None:
    async with coord.connect("memory://layout") as memory:
        with pytest.raises(coord.ConfigurationError, match="does not speak"):
            memory.mutex("x", layout="etcd")
        with pytest.raises(coord.ConfigurationError, match="does not speak"):
            memory.election("x", layout="etcd")
    with pytest.raises(coord.ConfigurationError, match="does not speak"):
        coord.connect("memory://layout", layout="etcd")
    with pytest.raises(coord.ConfigurationError, match="layout must be one of"):
        coord.connect(etcd_url, layout="cura")
    with pytest.raises(coord.ConfigurationError, match=r"Curator.*does not speak it"):
        coord.connect(etcd_url, layout="curator")
    async with connect(etcd_url) as client:
        with pytest.raises(coord.ConfigurationError, match="cohort"):
            client.mutex("x", local_handoff=4)
        assert client.mutex("x").layout == "etcd"
        assert client.mutex("x", layout="coord").layout == "coord"


async def test_a_key_deleted_and_made_again_after_the_read_counts_as_deleted(
    etcd_url: str,
) -> None:
    """The etcd layout's key is one per session (``NAME/<lease hex>``): released, then
    taken again by the next task of the same client, the name is deleted and made anew.
    A waiter that read the old key and waits for its deletion must return, although a
    key of that name exists when its watch begins: the new one was created after the
    waiter's own key, and waits behind it (waiting for that one deadlocked the two
    clients; the fault suite caught it once, in a run's first seconds)."""
    async with connect(etcd_url) as a, connect(etcd_url) as b:
        lease = await a.backend.grant(5)
        key = "again/k"
        first = await a.backend.compare_and_set(key, b"1", version=None, lease=lease)
        assert first is not None
        listing = await b.backend.keys_by_creation("again/", limit=1)
        assert [e.key for e in listing.entries] == [key]
        assert await a.backend.delete(first)
        again = await a.backend.compare_and_set(key, b"2", version=None, lease=lease)
        assert again is not None
        assert again.revision > listing.revision
        with anyio.fail_after(3):
            await b.backend.wait_deleted([key], revision=listing.revision)
