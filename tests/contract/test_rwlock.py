"""The RWLock conformance suite, run on every backend: readers together, writers alone,
arrival order, no writer starvation, and no deadlock on a reader ahead (kazoo #649)."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

import coord
from coord.testing import drop_key, wait_for_waiters

from ._recorder import Recorder

pytestmark = pytest.mark.anyio


async def test_readers_share_writers_are_alone(clients: list[coord.Client]) -> None:
    readers = writers = 0
    peak_readers = 0

    async def reader(i: int) -> None:
        nonlocal readers, peak_readers
        async with clients[i % 4].rwlock("rw").read:
            readers += 1
            peak_readers = max(peak_readers, readers)
            assert writers == 0, "a reader with a writer inside"
            for _ in range(5):
                await anyio.lowlevel.checkpoint()
            readers -= 1

    async def writer(i: int) -> None:
        nonlocal writers
        async with clients[i % 4].rwlock("rw").write:
            writers += 1
            assert writers == 1, "two writers at once"
            assert readers == 0, "a writer with readers inside"
            await anyio.lowlevel.checkpoint()
            writers -= 1

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for i in range(16):
                tg.start_soon(writer if i % 4 == 3 else reader, i)
    entries = await clients[0].backend.entries("rw/")
    assert entries.entries == ()


async def test_order_and_no_writer_starvation(clients: list[coord.Client]) -> None:
    """R1 holds; W1 queues; R2 comes after W1: R2 waits for W1 although only readers
    hold (a writer is not starved by later readers); W1 waits for R1 only, not for R2
    behind it (kazoo #649 counted writers behind a reader: deadlock)."""
    a, b, c, _ = clients
    events: Recorder[str] = Recorder()
    r1 = a.rwlock("fair").read
    await r1.acquire()
    gates = {"W1": anyio.Event(), "R2": anyio.Event()}

    async def run(side: coord.RWLock, kind: str, label: str) -> None:
        async with getattr(side, kind):
            events.append(label)
            await gates[label].wait()

    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, b.rwlock("fair"), "write", "W1")
            await wait_for_waiters(a, "fair", 2)
            tg.start_soon(run, c.rwlock("fair"), "read", "R2")
            await wait_for_waiters(a, "fair", 3)
            await anyio.sleep(0.2)
            assert events.items == [], "R2 overtook the waiting writer"
            await r1.release()
            await events.wait_for(bool)
            assert events.items == ["W1"]
            gates["W1"].set()
            await events.wait_for(lambda items: len(items) == 2)
            assert events.items == ["W1", "R2"]
            gates["R2"].set()


async def test_readers_arriving_together_hold_together(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    w = a.rwlock("together").write
    await w.acquire()
    inside: Recorder[int] = Recorder()
    leave = anyio.Event()

    async def reader(i: int) -> None:
        async with clients[i % 4].rwlock("together").read:
            inside.append(i)
            await leave.wait()

    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(reader, i)
            await wait_for_waiters(b, "together", 7)
            await w.release()
            await inside.wait_for(lambda items: len(items) == 6)
            leave.set()


async def test_a_task_holding_one_side_cannot_take_the_other(
    clients: list[coord.Client],
) -> None:
    rw = clients[0].rwlock("self")
    async with rw.read:
        with pytest.raises(coord.LockedError, match="wait on itself"):
            await rw.write.acquire()
        with pytest.raises(coord.LockedError, match="wait on itself"):
            await clients[0].rwlock("self").read.acquire()
    async with rw.write:
        with pytest.raises(coord.LockedError, match="wait on itself"):
            await rw.read.acquire()
    assert (await clients[0].backend.entries("self/")).entries == ()


async def test_try_acquire_and_loss(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    async with a.rwlock("try").read:
        other = b.rwlock("try").read
        await other.try_acquire()  # readers share
        await other.release()
        with pytest.raises(coord.LockedError):
            await b.rwlock("try").write.try_acquire()
    with anyio.fail_after(10), pytest.raises(coord.LockLost):
        async with a.rwlock("try").write as hold:
            await drop_key(a, hold.key)
            await anyio.sleep_forever()
    assert (await a.backend.entries("try/")).entries == ()


async def test_a_reader_waits_for_a_mutex_on_the_same_name(clients: list[coord.Client]) -> None:
    """Other recipes' entries count as writers for a reader (readers select writers by
    their id mark, and only readers are marked otherwise): a Mutex and a read lock on
    one name exclude each other instead of both holding."""
    a, b, _, _ = clients
    with anyio.fail_after(10):
        async with a.mutex("mixed"):
            with anyio.move_on_after(0.5) as waited:
                async with b.rwlock("mixed").read:
                    pytest.fail("a reader held while a mutex held the same name")
            assert waited.cancelled_caught
        async with b.rwlock("mixed").read:
            with anyio.move_on_after(0.5) as waited:
                async with a.mutex("mixed"):
                    pytest.fail("a mutex held while a reader held the same name")
            assert waited.cancelled_caught
