"""Backend.guard and the holds that use it, on every backend: stop() racing a call back,
holds released before (or while) their guard is armed or re-checked, sessions closed
with guards armed, ten thousand guards, a key deleted under a hold."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import coord
import coord._locks.hold
from coord.testing import drop_key
from coord.testing.pytest_plugin import fresh_namespace

if TYPE_CHECKING:
    from collections.abc import Callable

    from coord.abc import Backend


def wid() -> str:
    return "@" + fresh_namespace()


class Guards:
    """Wraps ``backend.guard``: which guards are live (armed, neither stopped nor fired);
    :meth:`fire` makes them fire as a backend that lost sight of their keys would."""

    def __init__(self, backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = 0
        self.live: set[int] = set()
        self._fire: dict[int, Callable[[], None]] = {}
        self._next = 0
        real = backend.guard

        def guard(key: str, *, revision: int, on_change: Callable[[], None]) -> Any:
            self._next += 1
            me = self._next
            self.armed += 1
            self.live.add(me)

            def fired() -> None:
                if me in self.live:
                    self.live.discard(me)
                    on_change()

            stop = real(key, revision=revision, on_change=fired)

            def fire() -> None:
                stop()
                fired()

            self._fire[me] = fire

            def stopped() -> None:
                self.live.discard(me)
                stop()

            return stopped

        monkeypatch.setattr(backend, "guard", guard)

    def fire(self) -> None:
        for me in list(self.live):
            self._fire[me]()


async def test_stop_before_the_call_back_of_a_key_gone_already(
    clients: list[coord.Client],
) -> None:
    """A key deleted before guard() is called back "soon, not now"; stop() in between
    must still win: after it, *on_change* is not called (the contract). The memory
    backend scheduled the call and returned a stop that did nothing."""
    backend, other = clients[0].backend, clients[1].backend
    lease = clients[0].session.lease
    calls: list[str] = []
    pos = await backend.register("c/guard-stop/", wid(), lease)
    assert await backend.delete(pos.entry)
    stop = other.guard(pos.entry.key, revision=pos.revision, on_change=lambda: calls.append("x"))
    stop()
    await anyio.sleep(0.5)
    assert calls == []


async def test_a_key_deleted_under_a_hold_cancels_the_body_within_the_guard_delay(
    clients: list[coord.Client],
) -> None:
    """With the real GUARD_DELAY: another client deletes the holder's key; the body is
    cancelled and ``async with`` raises LockLost within GUARD_DELAY plus a round trip,
    whether the key went before or after the guard was armed. Pins a guarantee."""
    a, b, _, _ = clients
    for early in (True, False):
        started = anyio.current_time()
        with anyio.fail_after(coord._locks.hold.GUARD_DELAY + 3), pytest.raises(coord.LockLost):
            async with a.mutex(f"gone-{early}") as hold:
                if not early:
                    await anyio.sleep(coord._locks.hold.GUARD_DELAY + 0.3)  # armed by now
                dropped = anyio.current_time()
                await drop_key(b, hold.key)
                await anyio.sleep(30)
        assert hold.lost
        late = anyio.current_time() - max(dropped, started + coord._locks.hold.GUARD_DELAY)
        assert late < 1.5, f"noticed {late:.2f} s after it could have been"


async def test_a_hold_released_before_its_guard_is_due_arms_none(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Holds released before GUARD_DELAY never call backend.guard, even after the delay
    has passed. Pins a guarantee."""
    a = clients[0]
    guards = Guards(a.backend, monkeypatch)
    monkeypatch.setattr(coord._locks.hold, "GUARD_DELAY", 0.3)
    for i in range(5):
        async with a.mutex(f"brief-{i}"):
            pass
    await anyio.sleep(0.6)
    assert guards.armed == 0


async def test_a_recheck_racing_the_release_leaves_no_guard(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guard fires spuriously (allowed: "may have been deleted") and the hold re-reads
    its key; the release comes while that read is in flight. Whatever the order, once
    released no guard of the hold is left armed (a re-arm after the release would keep a
    server watch for as long as the key lives). Pins a guarantee."""
    a = clients[0]
    guards = Guards(a.backend, monkeypatch)
    monkeypatch.setattr(coord._locks.hold, "GUARD_DELAY", 0.0)
    for delay in (0.0, 0.001, 0.005, 0.02):
        mutex = a.mutex(f"race-{delay}")
        hold = await mutex.acquire()
        with anyio.fail_after(5):
            while not guards.live:  # noqa: ASYNC110  (polled: counts, not events)
                await anyio.sleep(0.01)
        guards.fire()  # as a backend that lost sight of the key would
        await anyio.sleep(delay)
        await mutex.release()
        assert not hold.lost
        await anyio.sleep(0.3)
        assert guards.live == set(), f"a guard left armed after the release ({delay})"


async def test_closing_a_session_with_guards_armed(coord_url: str) -> None:
    """Holds never released, their guards armed, then the session closes (revoking the
    lease deletes every key: every guard fires while the session closes). Nothing
    escapes into the client's task group. Pins a guarantee."""
    async with coord.connect(coord_url, ttl=5) as other:
        async with coord.connect(coord_url, ttl=5) as client:
            client_hold = [await client.mutex(f"closing-{i}").acquire() for i in range(20)]
            await anyio.sleep(coord._locks.hold.GUARD_DELAY + 0.5)
            await drop_key(other, client_hold[0].key)  # one fires before the close
            await anyio.sleep(0.01)
        assert all(hold.lost for hold in client_hold)


async def test_ten_thousand_guards(clients: list[coord.Client], store: tuple[str, str]) -> None:
    """10,000 guards armed at once (ten on each of 1,000 keys), then a tenth of the keys
    deleted (each of their guards fires once) and the others stopped: linear time.
    Over the network 2,000 guards, in a test's time budget. Pins a guarantee."""
    keys, per_key = (1_000, 10) if store[0] == "memory" else (200, 10)
    backend, other = clients[0].backend, clients[1].backend
    lease = clients[0].session.lease
    prefix = f"c/many-{fresh_namespace()}/"
    positions: list[Any] = []
    for i in range(0, keys, 100):
        async with anyio.create_task_group() as tg:

            async def reg(n: int) -> None:
                positions.append(await backend.register(f"{prefix}{n}/", wid(), lease, ahead=0))

            for n in range(i, min(i + 100, keys)):
                tg.start_soon(reg, n)
    revision = max(p.revision for p in positions)
    fired: list[int] = []
    started = anyio.current_time()
    stops = [
        other.guard(p.entry.key, revision=revision, on_change=partial(fired.append, n))
        for n, p in enumerate(positions)
        for _ in range(per_key)
    ]
    armed_in = anyio.current_time() - started
    await anyio.sleep(1.0)  # created on the server meanwhile
    deleted = keys // 10
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            for p in positions[:deleted]:
                tg.start_soon(backend.delete, p.entry)
        while len(fired) < deleted * per_key:  # noqa: ASYNC110  (polled: counts, not events)
            await anyio.sleep(0.05)
    started = anyio.current_time()
    for stop in stops:
        stop()
    stopped_in = anyio.current_time() - started
    await anyio.sleep(0.5)
    assert sorted(fired) == sorted(n for n in range(deleted) for _ in range(per_key))
    assert armed_in < 1.0, armed_in
    assert stopped_in < 1.0, stopped_in
