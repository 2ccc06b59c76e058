"""Cohort mode (``client.mutex(name, local_handoff=k)``) on every backend: what it adds
to a strict mutex — local handoffs without round trips, at most k in a row, fences that
keep increasing and compare with strict ones — and what it must not lose: exclusion
across clients and modes, loss (a lost key is never handed on), cancellation at every
point of a local wait. (The whole mutex conformance suite also runs in cohort mode: see
the ``mutex_mode`` fixture; the fault suite has a ``cohort`` recipe; native asyncio
cancellation of a task just handed the lock is in ``test_native_cancel.py``.)"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

import coord
from coord._core.keys import FENCE_SHIFT
from coord.testing import drop_key, expire_session, server_wakeups, wait_for_waiters

from ._local import queue_locally

pytestmark = pytest.mark.anyio


async def keys(client: coord.Client, name: str) -> list[str]:
    return [e.key for e in (await client.backend.entries(name + "/")).entries]


@pytest.mark.usefixtures("guard_at_once")
async def test_local_handoffs_cost_no_round_trip(clients: list[coord.Client]) -> None:
    """Local waiters behind a holder: each gets the lock handed on, in order, through
    one key, with fences key<<16 | 1, 2, ...; no watch fires for those handoffs, and one
    key is all the store sees until the last one releases."""
    a = clients[0]
    mutex = a.mutex("handoff", local_handoff=8)
    order: list[int] = []
    first = await mutex.acquire()
    assert first.fence & 0xFFFF == 0
    done = anyio.Event()

    async def last() -> None:  # holds on until the count is taken
        async with mutex as hold:
            order.append(hold.fence)
            await done.wait()

    async with anyio.create_task_group() as tg:
        await queue_locally(tg, mutex, 5, order)
        tg.start_soon(last)
        while mutex.statistics().tasks_waiting < 6:
            await anyio.lowlevel.checkpoint()
        assert len(await keys(a, "handoff")) == 1, "local waiters register nothing"
        await anyio.sleep(0.2)  # the holder's own watches are settled
        before = await server_wakeups(a)
        await mutex.release()
        with anyio.fail_after(5):
            while len(order) < 6:  # six handoffs
                await anyio.lowlevel.checkpoint()
        await anyio.sleep(0.2)  # anything they would wake has arrived by now
        assert await server_wakeups(a) - before == 0
        assert len(await keys(a, "handoff")) == 1
        done.set()
    assert order == [first.fence + i for i in range(1, 7)]
    assert await keys(a, "handoff") == []


async def served(
    a: coord.Client, b: coord.Client, mutex: coord.Mutex, local: int, *, before_release: Any = None
) -> list[tuple[str, int]]:
    """*mutex* (of client *a*) is held, *local* tasks of *a* queue behind it, and then a
    task of *b* registers in the store's queue; the holder releases. Who held, in fence
    order, with the fences."""
    name = mutex.name
    order: list[tuple[str, int]] = []
    await mutex.acquire()
    async with anyio.create_task_group() as tg:
        fences: list[int] = []
        await queue_locally(tg, mutex, local, fences)

        async def other() -> None:
            async with b.mutex(name) as h:
                order.append(("b", h.fence))

        tg.start_soon(other)
        await wait_for_waiters(a, name, 2)
        if before_release is not None:
            await before_release()
        await mutex.release()
    return sorted([("a", f) for f in fences] + order, key=lambda x: x[1])


async def test_at_most_k_handoffs_then_the_other_client(clients: list[coord.Client]) -> None:
    """With a waiter of another client in the store's queue, a key serves at most k + 1
    local holders; then the other client's turn comes, and this client's next local
    waiter registers behind it."""
    a, b = clients[0], clients[1]
    fences = await served(a, b, a.mutex("fair", local_handoff=2), 5)
    assert [who for who, _ in fences] == ["a", "a", "b", "a", "a", "a"]
    assert [f & 0xFFFF for _, f in fences] == [1, 2, 0, 0, 1, 2]
    assert len({f >> FENCE_SHIFT for _, f in fences}) == 3  # a's first key, b's, a's second


async def test_exclusion_and_fences_across_modes_and_clients(
    clients: list[coord.Client],
) -> None:
    """Tasks of four clients, some strict and some in cohort mode on the same name:
    never two holders at once, and fences increase in the order of the holds."""
    holding = 0
    fences: list[int] = []

    async def worker(i: int) -> None:
        nonlocal holding
        client = clients[i % 4]
        mutex = client.mutex("mixed", local_handoff=3) if i % 3 else client.mutex("mixed")
        for _ in range(3):
            async with mutex as hold:
                holding += 1
                assert holding == 1
                fences.append(hold.fence)
                await anyio.sleep(0.001)
                holding -= 1

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(16):
                tg.start_soon(worker, i)
    assert len(fences) == 48
    assert fences == sorted(fences)
    assert len(set(fences)) == 48, "fences must strictly increase"
    assert await keys(clients[0], "mixed") == []


async def test_a_lost_key_is_never_handed_on(clients: list[coord.Client]) -> None:
    """The key is deleted under a holder while local tasks wait: the holder's body is
    cancelled (LockLost), and the next local waiter registers a new key instead of
    being handed the lost one."""
    a, b = clients[0], clients[1]
    mutex = a.mutex("lost-key", local_handoff=5)
    order: list[int] = []
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            with pytest.raises(coord.LockLost):
                async with mutex as hold:
                    await queue_locally(tg, mutex, 2, order)
                    await drop_key(b, hold.key)
                    await anyio.sleep_forever()
    assert len(order) == 2
    assert order[0] >> FENCE_SHIFT > hold.fence >> FENCE_SHIFT
    assert order[1] == order[0] + 1
    assert await keys(a, "lost-key") == []


async def test_session_loss_cancels_the_holder_and_local_waiters_go_on(
    clients: list[coord.Client],
) -> None:
    a = clients[0]
    mutex = a.mutex("lost-session", local_handoff=5)
    order: list[int] = []
    old = a.session
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            with pytest.raises(coord.LockLost):
                async with mutex as hold:
                    await queue_locally(tg, mutex, 2, order)
                    await expire_session(a)
                    await anyio.sleep_forever()
    assert hold.lost
    assert len(order) == 2
    assert a.session is not old
    assert order[0] >> FENCE_SHIFT > hold.fence >> FENCE_SHIFT


async def test_cancelled_local_waiters_leave_the_line(clients: list[coord.Client]) -> None:
    """Local waiters cancelled while they wait (a timeout) leave no trace: the next one
    in line is served, and a release with no one left deletes the key."""
    a = clients[0]
    mutex = a.mutex("cancel-local", local_handoff=5)
    got: list[int] = []
    hold = await mutex.acquire()
    async with anyio.create_task_group() as tg:

        async def impatient() -> None:
            with anyio.move_on_after(0.05):
                await mutex.acquire()
                got.append(-1)

        tg.start_soon(impatient)
        tg.start_soon(impatient)
        await anyio.sleep(0.2)  # both gave up
        await queue_locally(tg, mutex, 1, got)
        await mutex.release()
    assert got == [hold.fence + 1]
    assert mutex.statistics().tasks_waiting == 0
    assert await keys(a, "cancel-local") == []


async def test_try_acquire_in_cohort_mode(clients: list[coord.Client]) -> None:
    a, b = clients[0], clients[1]
    mutex = a.mutex("try-cohort", local_handoff=3)
    async with mutex:
        async with anyio.create_task_group() as tg:

            async def other_task() -> None:
                with pytest.raises(coord.LockedError, match="this client"):
                    await mutex.try_acquire()

            tg.start_soon(other_task)
        with pytest.raises(coord.LockedError):
            await b.mutex("try-cohort", local_handoff=3).try_acquire()
        assert len(await keys(a, "try-cohort")) == 1
    hold = await mutex.try_acquire()
    await mutex.release()
    assert hold.released
    assert not hold.lost
    assert await keys(a, "try-cohort") == []


async def test_bad_local_handoff(clients: list[coord.Client]) -> None:
    client = clients[0]
    for bad in (0, -1, 65536):
        with pytest.raises(coord.ConfigurationError, match="local_handoff"):
            client.mutex("bad", local_handoff=bad)
    for wrong in (True, 1.5, "2"):
        with pytest.raises(TypeError, match="local_handoff"):
            client.mutex("bad", local_handoff=wrong)  # type: ignore[arg-type]
    mutex = client.mutex("ok", local_handoff=65535)
    assert mutex.local_handoff == 65535
    assert "local_handoff=65535" in repr(mutex)


async def test_the_limit_is_the_registrants(clients: list[coord.Client]) -> None:
    """The key's registrant sets its handoff limit: another Mutex object of the same
    name with a larger local_handoff (here only a failed try_acquire) cannot stretch it,
    and another client's waiter is served after at most k + 1 holds."""
    a, b = clients[0], clients[1]

    async def probe() -> None:
        with pytest.raises(coord.LockedError):
            await a.mutex("limit", local_handoff=1000).try_acquire()

    fences = await served(a, b, a.mutex("limit", local_handoff=1), 4, before_release=probe)
    assert [who for who, _ in fences][:2] == ["a", "b"]


async def test_a_holder_that_never_releases_does_not_block_after_a_loss(
    clients: list[coord.Client],
) -> None:
    """A task that holds and never releases (a caller's bug): once the session is lost,
    the next local waiter registers on the next session, as a strict waiter would."""
    a = clients[0]
    mutex = a.mutex("leak", local_handoff=3)
    got = anyio.Event()
    async with anyio.create_task_group() as tg:

        async def leaky() -> None:
            await mutex.acquire()
            await anyio.sleep_forever()

        async def other() -> None:
            async with mutex:
                got.set()

        tg.start_soon(leaky)
        await wait_for_waiters(a, "leak", 1)
        tg.start_soon(other)
        while mutex.statistics().tasks_waiting == 0:
            await anyio.lowlevel.checkpoint()
        await expire_session(a)
        with anyio.fail_after(20):
            await got.wait()
        tg.cancel_scope.cancel()
