"""Leases and sessions on the memory backend, with trio's MockClock for the TTLs."""

from __future__ import annotations

import logging

import anyio
import pytest
import trio
from trio.testing import MockClock

import coord
from coord._sessions.session import CLOSE_MARGIN
from coord.backends._common.keepalive import KeptAliveLease
from coord.backends.memory import MemoryBackend, MemoryStore
from coord.testing import wait_for_waiters

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("trio", {"clock": MockClock(autojump_threshold=0)})


async def test_stalled_holder_loses_lock_at_ttl_and_next_waiter_gets_it() -> None:
    store = MemoryStore()
    stalled, healthy = MemoryBackend(store), MemoryBackend(store)
    async with coord.Client(stalled, ttl=10) as a, coord.Client(healthy, ttl=10) as b:
        granted_at = None

        async def waiter() -> None:
            nonlocal granted_at
            async with b.mutex("job"):
                granted_at = anyio.current_time()

        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            with pytest.raises(coord.LockLost):
                async with a.mutex("job"):
                    tg.start_soon(waiter)
                    with stalled.stall():  # a paused process: no keepalive reaches the store
                        await anyio.sleep(3600)
            lost_after = anyio.current_time() - start
        assert 9 <= lost_after <= 10.5, lost_after
        assert granted_at is not None
        assert granted_at - start <= 10.5
        assert a.session.lost
        assert not b.session.lost


async def test_partition_longer_than_ttl_loses_session_shorter_does_not() -> None:
    async with coord.Client(MemoryBackend(), ttl=6) as client:
        with client.backend.partition():  # type: ignore[attr-defined]
            await anyio.sleep(4)
        await anyio.sleep(30)
        assert not client.session.lost
        with client.backend.partition():  # type: ignore[attr-defined]
            await anyio.sleep(7)
        assert client.session.lost


class SlowRepliesLease(KeptAliveLease):
    """A lease whose keepalive replies take `delay` seconds to come back."""

    delay = 2.0

    async def _refresh(self) -> float:
        await anyio.sleep(self.delay)
        return self.ttl

    async def _revoke(self) -> None:
        pass


async def test_deadline_is_measured_from_the_send_time() -> None:
    lease = SlowRepliesLease(1, 9.0, sent_at=anyio.current_time())
    async with anyio.create_task_group() as tg:
        await tg.start(lease.run)
        sent = anyio.current_time() + 3.0  # the first keepalive goes out at ttl / 3
        await anyio.sleep(3.0 + lease.delay + 0.1)  # ... and its reply is back
        assert lease.deadline == pytest.approx(sent + 9.0)  # not receipt + 9
        tg.cancel_scope.cancel()


async def test_lease_lost_when_store_says_it_is_gone() -> None:
    async with coord.Client(MemoryBackend(), ttl=9) as client:
        client.backend.store.expire_lease(client.session.lease.id)  # type: ignore[attr-defined]
        with anyio.fail_after(3.5):  # noticed at the next keepalive, ttl / 3 later
            await client.session.wait_lost()


@pytest.mark.parametrize("renew", [True, False])
async def test_stalled_waiter_is_woken_by_its_session_loss(renew: bool) -> None:
    # etcd #19597: a waiter must not sleep on after its session died. With renew=False
    # the acquire fails; a client that renews registers again once it can, and gets the
    # lock when the holder releases.
    store = MemoryStore()
    async with coord.Client(MemoryBackend(store), ttl=9) as a:
        async with coord.Client(MemoryBackend(store), ttl=9, renew=renew) as b:
            holder = a.mutex("m")
            await holder.acquire()
            async with anyio.create_task_group() as tg:

                async def waiter() -> None:
                    async with b.mutex("m"):
                        pass

                if not renew:
                    with pytest.raises(coord.SessionExpiredError), anyio.fail_after(60):
                        with b.backend.stall():  # type: ignore[attr-defined]
                            await b.mutex("m").acquire()
                else:
                    with b.backend.stall():  # type: ignore[attr-defined]
                        tg.start_soon(waiter)
                        await anyio.sleep(30)  # past the TTL: b's session is lost
                        assert b.statistics().sessions_lost >= 1
                    with anyio.fail_after(5):  # renewed, registered again
                        await wait_for_waiters(a, "m", 2)
                    await holder.release()
            if not renew:
                assert len(store.keys()) == 1  # the holder's: the waiter left nothing
                await holder.release()
            assert store.keys() == []


async def test_hold_is_lost_at_the_deadline_without_a_checkpoint() -> None:
    """A holder stalled past its lease deadline (a long blocking call, a GC pause) must
    see hold.lost right away, before any task has run, and its exit raises LockLost."""
    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, MockClock)
    async with coord.Client(MemoryBackend(), ttl=6) as client:
        with pytest.raises(coord.LockLost, match=r"deadline|lost"):
            async with client.mutex("pause") as hold:
                assert not hold.lost
                clock.jump(6.5)  # the process was stopped: no task ran meanwhile
                assert hold.lost
                assert client.session.lost
        assert hold.lost


async def test_client_renews_after_a_partition_longer_than_the_ttl() -> None:
    async with coord.Client(MemoryBackend(), ttl=6) as client:
        first = client.session
        with client.backend.partition():  # type: ignore[attr-defined]
            await anyio.sleep(20)  # lost at 6 s; renewing fails meanwhile (backing off)
            assert first.lost
            assert client.statistics().renew_failures > 0
        with anyio.fail_after(5):
            async with client.mutex("after") as hold:
                assert hold.session is client.session is not first
        stats = client.statistics()
        assert stats.sessions_lost == 1
        assert stats.sessions_opened == 2


async def test_closing_the_session_revokes_its_keys() -> None:
    store = MemoryStore()
    async with coord.Client(MemoryBackend(store)) as client:
        await client.mutex("x").acquire()
        assert len(store.keys()) == 1
    assert store.keys() == []


@pytest.mark.parametrize("through", ["client", "session"])
async def test_closing_waits_for_the_endings_up_to_the_ttl(through: str) -> None:
    """Work of ``start_ending`` (a claimed job given back) ends before the close tells
    the holders and revokes the lease; one that takes longer than the TTL is waited for
    up to the TTL only; none is waited for once the session is lost."""
    store = MemoryStore()
    events: list[tuple[str, float]] = []

    async def ending(delay: float) -> None:
        await anyio.sleep(delay)
        events.append(("ended", anyio.current_time()))

    async def closed(delay: float, lose: bool = False) -> float:
        """How long the close took."""
        backend = MemoryBackend(store)
        if through == "client":
            async with coord.Client(backend, ttl=6, renew=False) as client:
                session = client.session
                session.start_ending(lambda: ending(delay))
                if lose:
                    store.expire_lease(session.id)
                    await session.wait_lost()
                started = anyio.current_time()
        else:
            async with backend, coord.Session(backend, ttl=6) as session:
                session.start_ending(lambda: ending(delay))
                if lose:
                    store.expire_lease(session.id)
                    await session.wait_lost()
                started = anyio.current_time()
        return anyio.current_time() - started

    assert await closed(1) == pytest.approx(1, abs=0.1)
    assert [e for e, _ in events] == ["ended"]
    assert await closed(60) == pytest.approx(6, abs=0.1)  # the TTL, then cancelled
    assert len(events) == 1
    assert await closed(60, lose=True) < 0.1
    assert len(events) == 1


async def test_a_session_injected_by_hand_is_one_lease() -> None:
    """House style: recipes take their session explicitly. A bare Session is one lease:
    once it is lost, acquires raise instead of waiting for another."""
    async with MemoryBackend() as backend, coord.Session(backend, ttl=6) as session:
        mutex = coord.Mutex(session, "by-hand")
        async with mutex as hold:
            assert hold.session is session
        backend.store.expire_lease(session.id)
        with anyio.fail_after(5):
            await session.wait_lost()
        with pytest.raises(coord.SessionExpiredError):
            await mutex.acquire()


async def test_loss_and_renewal_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="coord")
    async with coord.Client(MemoryBackend(), ttl=6) as client:
        first = client.session
        client.backend.store.expire_lease(first.id)  # type: ignore[attr-defined]
        with anyio.fail_after(5):
            async for session in client.sessions():
                if session is not first:
                    break
    lost = [r for r in caplog.records if r.levelno == logging.WARNING]
    opened = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(lost) == 1
    assert f"{first.id:#x} on memory:// lost" in lost[0].getMessage()
    assert "opening a new one" in lost[0].getMessage()
    assert len(opened) == 2  # the first session, then its replacement
    assert f"{first.id:#x} opened on memory:// (ttl 6s)" in opened[0].getMessage()
    assert f"{session.id:#x} opened" in opened[1].getMessage()
    assert f"replacing {first.id:#x}" in opened[1].getMessage()


async def test_concurrent_drains_each_return_when_the_endings_end() -> None:
    """Two drains at once (a keeper's, and its session's close): each returns when the
    endings have ended, not the first one after the whole TTL (the second replaced the
    event the first waits on)."""
    backend = MemoryBackend(MemoryStore())
    took: list[float] = []
    async with backend, coord.Session(backend, ttl=6) as session:
        session.start_ending(lambda: anyio.sleep(1))

        async def drain() -> None:
            started = anyio.current_time()
            await session.drain()
            took.append(anyio.current_time() - started)

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            tg.start_soon(drain)
    assert took == [pytest.approx(1, abs=0.1)] * 2


async def test_an_ending_started_while_the_close_drains_is_waited_for() -> None:
    """An ending that start_ending accepted (the session was not closed yet) is waited
    for, even when it starts during the drain's own checkpoint; one that comes after the
    drain's last look is refused (trio orders the tasks of a batch at random: either)."""
    backend = MemoryBackend(MemoryStore())
    outcomes: list[str] = []

    async def ending() -> None:
        await anyio.sleep(1)
        outcomes.append("ended")

    async def start() -> None:
        try:
            session.start_ending(ending)
        except (coord.ClosedError, coord.SessionExpiredError):
            outcomes.append("refused")
        else:
            outcomes.append("accepted")

    for _ in range(10):
        async with backend, coord.Session(backend, ttl=6) as session:
            outcomes.clear()
            session.start_soon(start)  # runs at the close's first checkpoint, or after
            await session.aclose()
        assert outcomes in (["accepted", "ended"], ["refused"])
        backend = MemoryBackend(MemoryStore())


@pytest.mark.parametrize("through", ["client", "session"])
async def test_a_close_with_the_store_silent_takes_the_ttl_and_a_second(
    through: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store answers nothing: an ending out is waited for up to the TTL, and the
    revoke has what is left of the TTL and a second (the store expires the lease anyway),
    not a TTL of its own after the endings' (2 x TTL + 1 in all before)."""
    store = MemoryStore()
    ttl = 2.0

    async def silent() -> None:
        await anyio.sleep_forever()

    async def close() -> float:
        if through == "client":
            async with coord.Client(MemoryBackend(store), ttl=ttl, renew=False) as client:
                client.session.start_ending(anyio.sleep_forever)
                monkeypatch.setattr(client.backend, "_enter", silent)
                started = anyio.current_time()
        else:
            async with MemoryBackend(store) as alone, coord.Session(alone, ttl=ttl) as session:
                session.start_ending(anyio.sleep_forever)
                monkeypatch.setattr(alone, "_enter", silent)
                started = anyio.current_time()
        return anyio.current_time() - started

    took = await close()
    assert took == pytest.approx(ttl + CLOSE_MARGIN, abs=0.3)
