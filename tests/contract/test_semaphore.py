"""The Semaphore conformance suite, run on every backend: the limit, FIFO order, a free
slot never left empty (Curator's maxLeases rule leaves one), one wake per release, and
clients that disagree on the limit."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

import coord
from coord.testing import drop_key, server_wakeups, wait_for_waiters

from ._recorder import Recorder

pytestmark = pytest.mark.anyio


async def waiter_keys(client: coord.Client, name: str) -> list[str]:
    return [e.key for e in (await client.backend.entries(name + "/")).entries]


async def test_at_most_limit_holders(clients: list[coord.Client]) -> None:
    inside = peak = done = 0
    fences: list[int] = []
    full = anyio.Event()

    async def worker(i: int) -> None:
        nonlocal inside, peak, done, full
        async with clients[i % 4].semaphore("limit", 3) as hold:
            inside += 1
            peak = max(peak, inside)
            assert inside <= 3, "more holders than the limit"
            fences.append(hold.fence)
            if inside == 3 or done + inside == 12:
                full.set()
            await full.wait()  # every slot is taken before anyone leaves
            await anyio.lowlevel.checkpoint()
            inside -= 1
            done += 1
            if inside == 0:
                full = anyio.Event()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(worker, i)
    assert peak == 3
    assert len(set(fences)) == 12
    assert await waiter_keys(clients[0], "limit") == []


async def test_fifo_and_a_free_slot_is_never_left_empty(clients: list[coord.Client]) -> None:
    """Holders A and B (limit 2), waiters C, D. B leaves first: C must get in at once.
    Curator's rule (C watches only A, the entry two places ahead) would leave the slot
    empty until A left too."""
    a, b, c, d = clients
    sem = [client.semaphore("slots", 2) for client in clients]
    entered: Recorder[str] = Recorder()
    hold_a = await sem[0].acquire()
    hold_b = await sem[1].acquire()
    assert hold_a.fence < hold_b.fence

    async def waiter(i: int, label: str) -> None:
        async with sem[i]:
            entered.append(label)
            await anyio.sleep_forever()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter, 2, "C")
            await wait_for_waiters(a, "slots", 3)
            tg.start_soon(waiter, 3, "D")
            await wait_for_waiters(a, "slots", 4)
            assert entered.items == []
            await sem[1].release()  # B leaves, out of order
            await entered.wait_for(bool)
            assert entered.items == ["C"]
            await anyio.sleep(0.1)
            assert entered.items == ["C"], "two entered for one free slot"
            await sem[0].release()  # A leaves: D gets in
            await entered.wait_for(lambda items: len(items) == 2)
            assert entered.items == ["C", "D"]
            tg.cancel_scope.cancel()
    assert await waiter_keys(b, "slots") == []
    assert await waiter_keys(c, "slots") == [] or await waiter_keys(d, "slots") == []


@pytest.mark.usefixtures("guard_at_once")
async def test_release_wakes_one_waiter(clients: list[coord.Client]) -> None:
    """Releases in arrival order cost the same store notifications with 2 or 12 waiters."""
    a = clients[0]
    costs = []
    for waiters in (2, 12):
        name = f"semherd{waiters}"
        first = a.semaphore(name, 2)
        second = clients[1].semaphore(name, 2)
        await first.acquire()
        await second.acquire()
        entered = 0
        came = anyio.Event()
        async with anyio.create_task_group() as tg:

            async def waiter(name: str, came: anyio.Event) -> None:
                nonlocal entered
                async with a.semaphore(name, 2):
                    entered += 1
                    came.set()
                    await anyio.sleep_forever()

            for _ in range(waiters):
                tg.start_soon(waiter, name, came)
            await wait_for_waiters(a, name, waiters + 2)
            await anyio.sleep(0.2)  # let every watch be established on the store
            before = await server_wakeups(a)
            await first.release()
            with anyio.fail_after(5):
                await came.wait()
            await anyio.sleep(0.2)
            costs.append(await server_wakeups(a) - before)
            assert entered == 1
            tg.cancel_scope.cancel()
        await second.release()
    assert abs(costs[1] - costs[0]) <= 1, f"notifications per release grew with waiters: {costs}"


async def test_clients_that_disagree_on_the_limit(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    async with a.semaphore("disagree", 1):
        with anyio.fail_after(10), pytest.raises(coord.ConfigurationError, match="limit=1"):
            await b.semaphore("disagree", 2).acquire()
        with pytest.raises(coord.ConfigurationError, match="another kind"):
            async with a.mutex("disagree-kind"):
                await b.semaphore("disagree-kind", 2).try_acquire()
        assert len(await waiter_keys(a, "disagree")) == 1, "the refused waiter left its key"


async def test_holder_loss_is_lock_lost(clients: list[coord.Client]) -> None:
    a = clients[0]
    with anyio.fail_after(10), pytest.raises(coord.LockLost):
        async with a.semaphore("semloss", 2) as hold:
            await drop_key(a, hold.key)
            await anyio.sleep_forever()


async def test_bad_limits_are_refused_at_the_call(clients: list[coord.Client]) -> None:
    for bad in (0, -1, 10_000):
        with pytest.raises(coord.ConfigurationError):
            clients[0].semaphore("bad", bad)
    for wrong in (1.5, True, "2"):
        with pytest.raises(TypeError, match="limit"):
            clients[0].semaphore("bad", wrong)  # type: ignore[arg-type]
    sem = clients[0].semaphore("one", 2)
    async with sem:
        with pytest.raises(coord.LockedError):
            await sem.acquire()
