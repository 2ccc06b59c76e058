"""Native asyncio cancellation of cleanups, against a store that hangs (memory's hang()
hook: requests get no answer until it ends, like a SIGSTOPped server).

An anyio shield does not stop ``task.cancel()`` / ``asyncio.timeout``: a cleanup awaited
by its caller would be cut short, and since its request never failed, nothing would
retry it: the key would stay, bound to a live lease, and block everyone. The cleanup
runs in a task of the session instead, which carries on.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import coord
from coord.backends.memory import MemoryBackend, MemoryStore
from coord.testing import wait_for_no_waiters, wait_for_waiters

if TYPE_CHECKING:
    from collections.abc import Coroutine

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_release_cut_short_by_asyncio_timeout_still_deletes() -> None:
    store = MemoryStore()
    backend = MemoryBackend(store)
    async with coord.Client(backend, ttl=5) as a, coord.Client(MemoryBackend(store), ttl=5) as b:
        mutex = a.mutex("hung-release")
        await mutex.acquire()
        with backend.hang():
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await mutex.release()
            await anyio.sleep(0.5)
        with anyio.fail_after(5):  # served once the store answers again
            await wait_for_no_waiters(b, "hung-release")
            async with b.mutex("hung-release"):
                pass


async def test_cancelled_waiter_whose_cleanup_hangs_leaves_no_key() -> None:
    store = MemoryStore()
    backend = MemoryBackend(store)
    async with coord.Client(MemoryBackend(store), ttl=5) as a, coord.Client(backend, ttl=5) as b:
        holder = a.mutex("hung-wait")
        await holder.acquire()
        waiter = asyncio.create_task(b.mutex("hung-wait").acquire())
        with anyio.fail_after(5):
            await wait_for_waiters(a, "hung-wait", 2)
        with backend.hang():
            waiter.cancel()  # its cleanup (delete) hangs ...
            await asyncio.sleep(0.1)
            waiter.cancel()  # ... and is cancelled again, natively
            with pytest.raises(asyncio.CancelledError):
                await waiter
        await holder.release()
        with anyio.fail_after(5):
            await wait_for_no_waiters(a, "hung-wait")


async def _cancel_while_closing(life: Coroutine[Any, Any, None], closing: anyio.Event) -> None:
    """Run *life* in a task of its own; once it sets *closing* (and its close has begun
    to wait for its endings), cancel that task natively (``task.cancel()``, which no
    anyio shield stops): it must end at once, cancelled."""
    task = asyncio.create_task(life)
    await closing.wait()
    await asyncio.sleep(0.1)
    task.cancel()
    with anyio.fail_after(2), pytest.raises(asyncio.CancelledError):
        await task


async def test_a_session_closed_natively_cancelled_while_draining_still_closes() -> None:
    """``task.cancel()`` of a session's close while it waits for its endings (an anyio
    shield does not stop it): the session is closed all the same, its lease revoked and
    its tasks stopped; not left open with a keepalive running forever."""
    store = MemoryStore()
    backend = MemoryBackend(store)
    sessions: list[coord.Session] = []
    closing = anyio.Event()

    async def life() -> None:
        async with coord.Session(backend, ttl=5) as session:
            sessions.append(session)
            await session.register("drain/", value=b"x")  # a key on its lease
            session.start_ending(lambda: anyio.sleep(3))
            closing.set()
        # (the close: its drain waits for the ending)

    async with backend:
        await _cancel_while_closing(life(), closing)
        (session,) = sessions
        assert session.lost
        assert not session.running
        assert store.keys() == []


async def test_a_client_closed_natively_cancelled_while_draining_says_so() -> None:
    """``task.cancel()`` of a client's close while it waits for its endings: the
    session is still declared lost by the client's close (SessionExpiredError for its
    holders, "the client was closed"), not closed later as if by its owner while live."""
    backend = MemoryBackend(MemoryStore())
    sessions: list[coord.Session] = []
    closing = anyio.Event()

    async def life() -> None:
        async with coord.Client(backend, ttl=5) as client:
            sessions.append(client.session)
            client.session.start_ending(lambda: anyio.sleep(3))
            closing.set()

    await _cancel_while_closing(life(), closing)
    (session,) = sessions
    assert not session.running
    assert session.reason == "the client was closed"
    with pytest.raises(coord.SessionExpiredError):
        session.check()


async def test_a_client_closed_natively_cancelled_while_its_puts_are_out_closes() -> None:
    """``task.cancel()`` of a client's close while it waits for its own endings (a put
    out: ``spawn(..., ending=True)``): the session is declared lost by the close and the
    client's tasks are stopped; the ending too, not left running."""
    backend = MemoryBackend(MemoryStore())
    sessions: list[coord.Session] = []
    closing = anyio.Event()
    ended: list[str] = []

    async def ending() -> None:
        try:
            await anyio.sleep(3)
        finally:
            ended.append("ended")

    async def life() -> None:
        async with coord.Client(backend, ttl=5) as client:
            sessions.append(client.session)
            client._keeper.spawn(ending, ending=True)
            closing.set()

    await _cancel_while_closing(life(), closing)
    (session,) = sessions
    assert not session.running
    assert session.reason == "the client was closed"
    assert ended == ["ended"]
