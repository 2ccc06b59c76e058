"""The Mutex conformance suite (trio's generic_lock_test, etcd's mutex tests), run on
every backend. Faults are injected the way they happen in production: the store ends a
session, another client deletes a key."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

import coord
import coord._locks.hold
from coord.testing import (
    drop_key,
    expire_session,
    server_wakeups,
    wait_for_no_waiters,
    wait_for_waiters,
)
from coord.testing._faults import _wait_for_queue as wait_for_queue

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("mutex_mode")]


async def waiter_keys(client: coord.Client, name: str) -> list[str]:
    listing = await client.backend.entries(name + "/")
    return [e.key for e in listing.entries]


async def test_mutual_exclusion_50_tasks_4_clients(clients: list[coord.Client]) -> None:
    inside = 0
    fences: list[int] = []

    async def worker(i: int) -> None:
        nonlocal inside
        async with clients[i % 4].mutex("exclusion") as hold:
            inside += 1
            assert inside == 1, "two holders at once"
            fences.append(hold.fence)
            await anyio.lowlevel.checkpoint()
            await anyio.lowlevel.checkpoint()
            assert inside == 1, "two holders at once"
            inside -= 1

    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(worker, i)
    assert len(fences) == 50
    assert fences == sorted(fences), "fences must increase from holder to holder"
    assert len(set(fences)) == 50, "fences must strictly increase"
    assert await waiter_keys(clients[0], "exclusion") == []


async def test_one_mutex_object_shared_by_many_tasks(clients: list[coord.Client]) -> None:
    # etcd #10756: two acquires on one session must never both own the lock.
    client = clients[0]
    mutex = client.mutex("shared")
    inside = 0

    async def worker() -> None:
        nonlocal inside
        async with mutex:
            inside += 1
            assert mutex.locked()
            await anyio.lowlevel.checkpoint()
            assert inside == 1
            inside -= 1

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(worker)
    assert not mutex.locked()


@pytest.mark.strict_only("cohort mode serves a client's own tasks first, k at a time")
async def test_fifo_order_is_registration_order(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    order: list[int] = []
    first = a.mutex("fifo")
    await first.acquire()

    async def waiter(i: int) -> None:
        async with (a if i % 2 else b).mutex("fifo"):
            order.append(i)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(waiter, i)
                await wait_for_waiters(a, "fifo", i + 2)  # registered before the next starts
            assert order == []
            await first.release()
    assert order == list(range(8))


async def test_fence_increases_between_holders(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    async with a.mutex("fence") as h1:
        pass
    async with b.mutex("fence") as h2:
        pass
    async with a.mutex("fence") as h3:
        pass
    assert isinstance(h1.fence, int)
    assert h1.fence < h2.fence < h3.fence


async def test_cancel_while_waiting_leaves_no_key(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    holder = a.mutex("cancel-wait")
    await holder.acquire()
    with anyio.move_on_after(10) as outer:
        async with anyio.create_task_group() as tg:

            async def wait_forever() -> None:
                await b.mutex("cancel-wait").acquire()
                pytest.fail("acquired a held lock")

            tg.start_soon(wait_forever)
            await wait_for_waiters(a, "cancel-wait", 2)
            tg.cancel_scope.cancel()
    assert not outer.cancel_called
    # A cancel that lands while the registration is in flight leaves the delete to the
    # task that owns the request, a moment later: wait (by watching) for it.
    with anyio.fail_after(5):
        await wait_for_queue(a, "cancel-wait", lambda n: n == 1)
    await holder.release()
    assert await waiter_keys(a, "cancel-wait") == []


async def test_timeout_is_a_cancel_scope(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    async with a.mutex("timeout"):
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.2):
                await b.mutex("timeout").acquire()
        # The timed-out waiter's key is deleted by its session, right away.
        with anyio.fail_after(5):
            await wait_for_queue(a, "timeout", lambda n: n == 1)


async def test_cancelled_before_the_call_registers_nothing(clients: list[coord.Client]) -> None:
    client = clients[0]
    with anyio.CancelScope() as scope:
        scope.cancel()
        await client.mutex("pre-cancelled").acquire()
    assert scope.cancelled_caught
    assert await waiter_keys(client, "pre-cancelled") == []


async def test_cancel_while_registration_is_in_flight_leaves_no_key(
    clients: list[coord.Client],
) -> None:
    # The cancel arrives after the registration request went out: the key may exist on the
    # store, and it must be removed (by the task that owns the request, when it completes).
    a, b, _, _ = clients
    for _ in range(5):
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def acquire(scope: anyio.CancelScope = scope) -> None:
                with scope:
                    await a.mutex("in-flight").acquire()
                    pytest.fail("acquired although cancelled")

            tg.start_soon(acquire)
            await anyio.lowlevel.checkpoint()  # the acquire has started and sent its request
            scope.cancel()
        with anyio.fail_after(5):
            await wait_for_no_waiters(b, "in-flight")
    async with b.mutex("in-flight"):  # nothing stuck in the queue
        pass


async def test_cancel_while_holding_leaves_no_key(clients: list[coord.Client]) -> None:
    client = clients[0]
    with anyio.move_on_after(0.1):
        async with client.mutex("cancel-hold"):
            await anyio.sleep_forever()
    assert await waiter_keys(client, "cancel-hold") == []
    async with client.mutex("cancel-hold"):  # and it can be taken again at once
        pass


async def test_cancelled_release_still_releases(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    mutex = a.mutex("cancel-release")
    await mutex.acquire()
    with anyio.CancelScope() as scope:
        scope.cancel()
        await mutex.release()  # shielded: the release happens, then the cancel is seen
    assert not mutex.locked()
    assert await waiter_keys(a, "cancel-release") == []
    with anyio.fail_after(5):
        async with b.mutex("cancel-release"):
            pass


async def test_try_acquire(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    mutex = a.mutex("try")
    hold = await mutex.try_acquire()
    assert mutex.locked()
    with pytest.raises(coord.LockedError):
        await b.mutex("try").try_acquire()
    assert await waiter_keys(a, "try") == [hold.key]
    await mutex.release()
    hold2 = await b.mutex("try").try_acquire()
    assert hold2.fence > hold.fence


async def test_waiter_ahead_leaving_out_of_order(clients: list[coord.Client]) -> None:
    a, b, c, _ = clients
    holder = a.mutex("leave")
    await holder.acquire()
    acquired = anyio.Event()

    async def last_waiter() -> None:
        async with c.mutex("leave"):
            acquired.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            middle = anyio.CancelScope()

            async def middle_waiter() -> None:
                with middle:
                    await b.mutex("leave").acquire()

            tg.start_soon(middle_waiter)
            await wait_for_waiters(a, "leave", 2)
            tg.start_soon(last_waiter)
            await wait_for_waiters(a, "leave", 3)
            middle.cancel()  # the waiter that the last one watches leaves early
            with anyio.move_on_after(0.3):
                await acquired.wait()
            assert not acquired.is_set(), "acquired while the holder still holds"
            await wait_for_queue(a, "leave", lambda n: n == 2)
            await holder.release()
    assert acquired.is_set()


async def test_session_lost_while_holding(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    body_cancelled = False
    got_it = anyio.Event()
    first_session = a.session

    async def next_waiter() -> None:
        async with b.mutex("lost") as hold:
            assert hold.fence > 0
            got_it.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            with pytest.raises(coord.LockLost):
                async with a.mutex("lost") as hold:
                    tg.start_soon(next_waiter)
                    await wait_for_waiters(a, "lost", 2)
                    try:
                        await expire_session(a)
                        await anyio.sleep_forever()
                    except anyio.get_cancelled_exc_class():
                        body_cancelled = True
                        raise
            assert hold.lost
            assert body_cancelled
            await got_it.wait()
        await first_session.wait_lost()  # the keepalive learns it at its next refresh
    # The client outlives its session: the next acquire runs on a new one.
    with anyio.fail_after(10):
        async with a.mutex("lost") as again:
            assert again.fence > hold.fence
            assert again.session is a.session is not first_session
    stats = a.statistics()
    assert (stats.sessions_opened, stats.sessions_lost) == (2, 1)
    assert stats.session_id == a.session.id != first_session.id


async def test_loss_then_exit_without_checkpoint_is_lock_lost(clients: list[coord.Client]) -> None:
    """The body learns nothing (no checkpoint after the loss) and exits normally: the
    exit must still raise LockLost, not return as if the lock had been held throughout
    (and on ZooKeeper not a plain SessionExpiredError from the release's delete)."""
    a, b, _, _ = clients
    with anyio.fail_after(15):
        with pytest.raises(coord.LockLost):
            async with a.mutex("silent") as hold:
                await expire_session(a)  # the store ends the session; we run on at once
        assert hold.lost
        async with b.mutex("silent") as next_hold:  # nothing stuck
            assert next_hold.fence > hold.fence


async def test_key_deleted_then_exit_without_checkpoint_is_lock_lost(
    clients: list[coord.Client],
) -> None:
    a, b, _, _ = clients
    with anyio.fail_after(10):
        with pytest.raises(coord.LockLost, match=r"gone|deleted"):
            async with a.mutex("silent-key") as hold:
                await drop_key(b, hold.key)
        assert hold.lost
        assert not a.session.lost  # only that lock was lost
        async with a.mutex("silent-key") as again:
            assert again.fence > hold.fence


async def test_closing_the_client_tells_its_holder_first(coord_url: str) -> None:
    """A task that holds a lock through a client that is being closed (the task runs in a
    task group outside the client's ``async with``) must be cancelled and see hold.lost
    before the lease is revoked: by the time another client holds the lock, it knows."""
    outcome: list[BaseException] = []
    seen_by_next: list[bool] = []
    holding = anyio.Event()

    async def holder(client: coord.Client) -> None:
        try:
            async with client.mutex("close") as hold:
                holding.set()
                await anyio.sleep_forever()
        except coord.LockLost as exc:
            assert hold.lost
            outcome.append(exc)

    async with coord.connect(coord_url, ttl=5) as b:

        async def next_holder() -> None:
            async with b.mutex("close"):
                seen_by_next.append(bool(outcome))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                async with coord.connect(coord_url, ttl=5) as a:
                    tg.start_soon(holder, a)
                    await holding.wait()
                    tg.start_soon(next_holder)
                    await wait_for_waiters(b, "close", 2)
                # `a` is closed here, while its task still holds the lock
    assert len(outcome) == 1, "the holder was not told that closing its client lost the lock"
    assert seen_by_next == [True]


async def test_waiter_survives_session_loss_and_registers_again(
    clients: list[coord.Client],
) -> None:
    """A waiter held nothing: when its session is lost it registers again on the next
    session and keeps waiting (at the end of the queue), instead of failing."""
    a, b, _, _ = clients
    holder = a.mutex("renew-wait")
    first = await holder.acquire()
    got: list[coord.Hold] = []
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:

            async def waiter() -> None:
                async with b.mutex("renew-wait") as hold:
                    got.append(hold)

            tg.start_soon(waiter)
            await wait_for_waiters(a, "renew-wait", 2)
            first_since = (await holder.waiters())[1].since
            old = b.session
            await expire_session(b)
            await old.wait_lost()
            # registered again, on the new session: still waiting, not granted
            await wait_for_queue(a, "renew-wait", lambda n: n == 2)
            assert got == []
            again = (await holder.waiters())[1]
            assert again.since is not None
            assert first_since is not None
            assert again.since > first_since, "the new key records the new registration"
            assert b.session is not old
            await holder.release()
    assert len(got) == 1
    assert got[0].fence > first.fence


async def test_lock_lost_is_not_an_exception_group(clients: list[coord.Client]) -> None:
    client = clients[0]
    with anyio.fail_after(10), pytest.raises(coord.LockLost) as info:
        async with client.mutex("plain") as hold:
            await drop_key(client, hold.key)
            await anyio.sleep_forever()
    assert type(info.value) is coord.LockLost


async def test_key_deleted_by_another_client_while_holding(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    with anyio.fail_after(10):
        with pytest.raises(coord.LockLost):
            async with a.mutex("stolen") as hold:
                await drop_key(b, hold.key)
                await hold.wait_lost()
                await anyio.sleep_forever()
        assert not a.session.lost  # only that lock is lost, not the session
        async with a.mutex("stolen") as again:
            assert again.fence > hold.fence


@pytest.mark.parametrize("fault", ["key deleted", "session expired"])
@pytest.mark.parametrize("renew", [True, False], ids=["renew", "no-renew"])
async def test_waiter_whose_key_goes(coord_url: str, fault: str, renew: bool) -> None:
    # etcd #19597 / #11456: a waiter whose key vanishes (its session expired, or someone
    # deleted the key) must neither hang nor be granted the lock. A client that renews
    # its sessions registers again and waits on; with renew=False the acquire fails.
    async with (
        coord.connect(coord_url, ttl=5) as a,
        coord.connect(coord_url, ttl=5, renew=renew) as b,
    ):
        holder = a.mutex("gone")
        await holder.acquire()
        granted = anyio.Event()
        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:

                async def waiter() -> None:
                    if renew:
                        async with b.mutex("gone"):
                            granted.set()
                    else:
                        with pytest.raises(coord.SessionExpiredError):
                            await b.mutex("gone").acquire()

                tg.start_soon(waiter)
                await wait_for_waiters(a, "gone", 2)
                old_key = (await waiter_keys(a, "gone"))[1]
                if fault == "key deleted":
                    await drop_key(a, old_key)
                else:
                    await expire_session(b)
                if renew:
                    await wait_for_queue(a, "gone", lambda n: n == 2)  # again, at the end
                    keys = await waiter_keys(a, "gone")
                    assert old_key not in keys
                    assert not granted.is_set()
                    await holder.release()
        if not renew:
            assert len(await waiter_keys(a, "gone")) == 1
            await holder.release()
            if fault == "session expired":  # the first loss is final
                with pytest.raises(coord.SessionExpiredError):
                    await b.mutex("other").acquire()


async def test_renew_false_makes_the_first_loss_final(coord_url: str) -> None:
    async with coord.connect(coord_url, ttl=5, renew=False) as client:
        await expire_session(client)
        with anyio.fail_after(10):
            await client.session.wait_lost()
        with pytest.raises(coord.SessionExpiredError, match="renew=False"):
            await client.mutex("final").acquire()
        sessions = [s async for s in client.sessions()]
        assert sessions == [client.session]
        assert client.statistics().sessions_opened == 1


@pytest.mark.no_mutex
async def test_sessions_can_be_followed(clients: list[coord.Client]) -> None:
    client = clients[0]
    seen: list[coord.Session] = []
    with anyio.fail_after(15):
        async for session in client.sessions():
            seen.append(session)
            if len(seen) == 3:
                break
            await expire_session(client)
            await session.wait_lost()
    assert len({s.id for s in seen}) == 3
    assert seen[0].lost
    assert seen[1].lost
    assert not seen[2].lost
    assert client.statistics().sessions_lost == 2


async def test_release_when_not_held(clients: list[coord.Client]) -> None:
    client = clients[0]
    mutex = client.mutex("not-held")
    with pytest.raises(coord.NotOwnerError):
        await mutex.release()
    with pytest.raises(RuntimeError):  # NotOwnerError is a RuntimeError too
        await mutex.release()
    async with mutex:
        pass
    with pytest.raises(coord.NotOwnerError):
        await mutex.release()


async def test_release_from_another_task_is_refused(clients: list[coord.Client]) -> None:
    client = clients[0]
    mutex = client.mutex("other-task")
    await mutex.acquire()
    async with anyio.create_task_group() as tg:

        async def intruder() -> None:
            with pytest.raises(coord.NotOwnerError):
                await mutex.release()

        tg.start_soon(intruder)
    assert mutex.locked()
    await mutex.release()


async def test_not_reentrant(clients: list[coord.Client]) -> None:
    client = clients[0]
    mutex = client.mutex("reentry")
    async with mutex:
        with pytest.raises(coord.LockedError, match="wait on itself"):
            await mutex.acquire()
        # Another object of the same client for the same name: the task would wait on
        # itself just the same (it used to, silently, forever).
        with pytest.raises(coord.LockedError, match="wait on itself"):
            await client.mutex("reentry").acquire()
        with pytest.raises(coord.LockedError, match="wait on itself"):
            await client.mutex("reentry").try_acquire()
        assert len(await waiter_keys(client, "reentry")) == 1, "a refused acquire left a key"
    assert await waiter_keys(client, "reentry") == []


async def test_reentrant_mutex(clients: list[coord.Client], mutex_mode: str) -> None:
    a = clients[0]
    mutex = a.mutex("reentrant", reentrant=True)
    other = a.mutex("reentrant", reentrant=True)
    order: list[str] = []
    keys = 1 if mutex_mode == "cohort" else 2  # in cohort mode the other one waits locally

    async def other_task_of_the_same_client() -> None:
        async with other:
            order.append("other")

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            async with mutex as outer:
                tg.start_soon(other_task_of_the_same_client)
                await wait_for_waiters(a, "reentrant", keys)
                while other.statistics().tasks_waiting == 0:  # it queues, it does not enter
                    await anyio.lowlevel.checkpoint()
                async with mutex as inner:
                    assert inner is outer
                    async with a.mutex("reentrant", reentrant=True) as third:
                        assert third is outer
                    assert not outer.released
                assert not outer.released, "an inner exit released the lock"
                assert len(await waiter_keys(a, "reentrant")) == keys
                order.append("outer")
            assert outer.released
    assert order == ["outer", "other"]
    assert await waiter_keys(a, "reentrant") == []


async def test_reentrant_mutex_lost_while_nested(clients: list[coord.Client]) -> None:
    a = clients[0]
    mutex = a.mutex("reentrant-lost", reentrant=True)
    reached = False
    with anyio.fail_after(10), pytest.raises(coord.LockLost):
        async with mutex as hold:
            async with mutex:
                await drop_key(a, hold.key)
                await anyio.sleep_forever()
            reached = True
    assert not reached, "the outer body ran on after the loss"
    assert await waiter_keys(a, "reentrant-lost") == []


async def test_invalid_names(clients: list[coord.Client]) -> None:
    client = clients[0]
    for bad in ["", "/a", "a/", "a//b", "a b", "@x", ".hidden", "a/../b", "x" * 600, "zookeeper"]:
        with pytest.raises(coord.ConfigurationError):
            client.mutex(bad)
    with pytest.raises(TypeError, match="must be a str"):
        client.mutex(42)  # type: ignore[arg-type]


async def test_nested_names_do_not_share_a_queue(clients: list[coord.Client]) -> None:
    client = clients[0]
    parent, child = client.mutex("nest"), client.mutex("nest/child")
    async with child:
        with anyio.fail_after(5):
            async with parent:  # would deadlock if "nest/child/..." were in nest's queue
                pass


async def test_an_uncontended_lock_costs_no_watch(clients: list[coord.Client]) -> None:
    """Acquire and release with nobody waiting: no watch is armed, none fires. (The
    holder's guard watch starts only if the holder does not release first: its task,
    scheduled at the grant, used to arm a watch on the key being deleted.)"""
    client = clients[0]
    mutex = client.mutex("uncontended")
    async with mutex:  # parents and connections exist from here on
        pass
    await anyio.sleep(0.2)
    before = await server_wakeups(client)
    for _ in range(10):
        await mutex.acquire()
        await mutex.release()
    await anyio.sleep(0.2)  # anything a release would wake has arrived by now
    assert await server_wakeups(client) - before == 0


@pytest.mark.strict_only("a client's own waiters wait locally: test_cohort.py counts them")
@pytest.mark.usefixtures("guard_at_once")
async def test_release_wakes_exactly_one_waiter(clients: list[coord.Client]) -> None:
    """A release costs the same number of watch notifications with 2 or 12 waiters."""
    a = clients[0]
    costs = []
    for waiters in (2, 12):
        name = f"herd{waiters}"
        holder = a.mutex(name)
        await holder.acquire()
        woken = 0
        first = anyio.Event()
        async with anyio.create_task_group() as tg:

            async def waiter() -> None:
                nonlocal woken
                async with a.mutex(name):  # noqa: B023
                    woken += 1
                    first.set()  # noqa: B023
                    await anyio.sleep_forever()

            for _ in range(waiters):
                tg.start_soon(waiter)
            await wait_for_waiters(a, name, waiters + 1)
            await anyio.sleep(0.2)  # let every watch be established on the store
            before = await server_wakeups(a)
            await holder.release()
            with anyio.fail_after(5):
                await first.wait()
            await anyio.sleep(0.2)  # anything else a release would wake has arrived by now
            costs.append(await server_wakeups(a) - before)
            assert woken == 1
            tg.cancel_scope.cancel()
    # etcd: the waiter's event, its two watch cancels, the old holder's guard-watch cancel,
    # the new holder's guard watch: 5 messages, whatever the number of waiters; 6 when the
    # old holder's delete overtakes its guard-watch cancel (another stream) on the server.
    assert abs(costs[1] - costs[0]) <= 1, f"notifications per release grew with waiters: {costs}"
    assert max(costs) <= 6, costs


@pytest.mark.strict_only("a client's own waiters wait locally: test_cohort.py counts them")
async def test_brief_holds_arm_no_guard_watch(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hold that ends before GUARD_DELAY never arms the watch on its own key: a chain of
    brief holds costs one predecessor wake-up per handoff (etcd: its event and its
    cancel), not also a guard watch created, fired by the holder's own delete, cancelled.
    (The delay is raised so that a slow machine cannot arm one; the key-deleted tests
    check that the guard still comes.)"""
    monkeypatch.setattr(coord._locks.hold, "GUARD_DELAY", 60.0)
    a, b, _, _ = clients
    holder = a.mutex("brief")
    await holder.acquire()
    handoffs = 6
    held: list[int] = []
    async with anyio.create_task_group() as tg:

        async def waiter(client: coord.Client) -> None:
            async with client.mutex("brief") as hold:
                held.append(hold.fence)

        for i in range(handoffs):
            tg.start_soon(waiter, (a, b)[i % 2])
            await wait_for_waiters(a, "brief", i + 2)  # queued in this order
        await anyio.sleep(0.2)  # let every predecessor watch be established on the store
        before = await server_wakeups(a)
        with anyio.fail_after(10):
            await holder.release()
    await anyio.sleep(0.2)  # anything else a release would wake has arrived by now
    cost = await server_wakeups(a) - before
    assert held == sorted(held)
    assert len(held) == handoffs
    per_handoff = 2 if type(a.backend).__name__ == "EtcdBackend" else 1
    # (+1: on ZooKeeper, the children watch of the last wait_for_waiters stays armed on
    # the server until the first change, and fires then.)
    assert cost <= per_handoff * handoffs + 1, f"{cost} wake-ups for {handoffs} handoffs"


async def test_reentrant_acquire_inside_a_block_released_after_it(
    clients: list[coord.Client],
) -> None:
    """RLock style: acquired once more inside ``async with``, released after the block.
    The block that opened the body's cancel scope closes it (it used to be closed only at
    depth 1, corrupting the task's scope stack)."""
    a, b, _, _ = clients
    mutex = a.mutex("re-unnested", reentrant=True)
    async with mutex:
        await mutex.acquire()
    assert mutex.locked()
    await mutex.release()
    assert not mutex.locked()
    await anyio.sleep(0.05)  # a later checkpoint in this task: the scope stack is sound
    with anyio.fail_after(10):
        await wait_for_no_waiters(b, "re-unnested")


async def test_reentrant_hold_lost_with_an_acquire_unreleased(
    clients: list[coord.Client],
) -> None:
    """Lost while an inner acquire() has no release yet: the block still ends the hold
    and raises LockLost (not a bare cancellation), and nothing stays held."""
    a, b, _, _ = clients
    mutex = a.mutex("re-lost", reentrant=True)
    with anyio.fail_after(10):
        with pytest.raises(coord.LockLost):
            async with mutex as hold:
                await mutex.acquire()
                await drop_key(a, hold.key)
                await anyio.sleep(5)  # cancelled by the loss
        assert not mutex.locked()
        async with b.mutex("re-lost"):
            pass


async def test_a_release_whose_delete_answer_was_lost_is_a_release(
    clients: list[coord.Client],
) -> None:
    """The release's delete reaches the store, but no answer comes back (the store's
    call gives up, BackendUnavailable); the session tries again and finds the key gone.
    Gone after an attempt whose outcome is unknown is that attempt's doing: the release
    worked, and the block does not raise LockLost."""
    a, _, _, _ = clients
    backend = a.backend
    real = backend.delete
    lost: list[str] = []

    async def answer_lost(entry: coord.abc.Entry) -> bool:
        deleted = await real(entry)
        if entry.key.startswith("lost-answer/") and not lost:
            lost.append(entry.key)
            raise coord.BackendUnavailable("no answer")
        return deleted

    backend.delete = answer_lost  # type: ignore[method-assign]
    with anyio.fail_after(10):
        async with a.mutex("lost-answer") as hold:
            pass
    assert lost == [hold.key]
    assert not hold.lost
    assert [w.key for w in await a.mutex("lost-answer").waiters()] == []
