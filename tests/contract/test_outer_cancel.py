"""An outer cancellation never ends the session under a running body, on every backend.

A service cancels the scope around its client (shutting down), and a body inside a hold
shields its clean-up::

    with anyio.CancelScope() as outer:
        async with coord.connect(url) as client:
            async with client.mutex("x") as hold:
                outer.cancel()
                with anyio.CancelScope(shield=True):
                    await cleanup()        # still inside the block: still the holder

The client's own tasks (keepalive, watches, the session's renewal) must live until the
client's ``__aexit__``, which comes after every block inside it: no other client may take
what this one holds while the clean-up runs. Each kind of hold is tried with a contender
on another client, waiting all along; it gets its turn once the block has been left.
"""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import pytest

import coord
from coord.testing import wait_for_no_waiters

from .conftest import ASYNCIO_STORES

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Coroutine
    from contextlib import AbstractAsyncContextManager

    Hold = Callable[[coord.Client], AbstractAsyncContextManager[Any]]
    Contend = Callable[[coord.Client, anyio.Event], Coroutine[Any, Any, None]]

pytestmark = pytest.mark.anyio

#: How long the shielded clean-up runs: long against the contender's handoff (a few ms
#: once the holder's lease is revoked), short against the TTL (no keepalive is needed).
CLEANUP = 0.6
NAME = "outer-cancel"


def _lock(make: Callable[[coord.Client], AbstractAsyncContextManager[Any]]) -> Hold:
    """A hold that is one ``async with`` of a lock-like recipe object."""

    @asynccontextmanager
    async def hold(client: coord.Client) -> AsyncIterator[Any]:
        async with make(client) as held:
            yield held

    return hold


def _getting(make: Callable[[coord.Client], AbstractAsyncContextManager[Any]]) -> Contend:
    """A contender that gets ``async with make(other)`` once the hold is left."""

    async def contend(other: coord.Client, got: anyio.Event) -> None:
        async with make(other):
            got.set()

    return contend


_mutex = _lock(lambda c: c.mutex(NAME))
_contend_mutex = _getting(lambda c: c.mutex(NAME))


def _queue(client: coord.Client) -> coord.Queue:
    return client.queue(NAME, retry_delay=0.01)


@asynccontextmanager
async def _claim(client: coord.Client) -> AsyncIterator[Any]:
    # Two jobs of one key: the second is claimable once the first is acked (or, were
    # its claim lost, the first again after its 10 ms backoff).
    await _queue(client).put(b"first", key="k")
    await _queue(client).put(b"second", key="k")
    async with _queue(client).claim() as job:
        assert job.payload == b"first"
        yield job


async def _contend_claim(other: coord.Client, got: anyio.Event) -> None:
    async with _queue(other).claim() as job:
        assert job.payload == b"second"  # the first was acked: its body ran to its end
        got.set()


@asynccontextmanager
async def _membership(client: coord.Client) -> AsyncIterator[Any]:
    async with client.group(NAME).join(b"first") as membership:
        yield membership


async def _contend_membership(other: coord.Client, got: anyio.Event) -> None:
    """'Gets' the group's only place: sees the first member gone."""
    async for members in other.group(NAME).watch():
        if not members:
            got.set()
            return


@asynccontextmanager
async def _partition(client: coord.Client) -> AsyncIterator[Any]:
    async with client.partitioner(NAME, partitions=1).join(b"first") as owner:
        async for assignment in owner.assignments():
            if assignment.owned:
                break
        async with owner.partition(0) as hold:
            yield hold


async def _contend_partition(other: coord.Client, got: anyio.Event) -> None:
    async with other.partitioner(NAME, partitions=1).join(b"second") as owner:
        async for assignment in owner.assignments():
            if assignment.owned:
                got.set()
                await anyio.sleep_forever()  # keep it until the test ends


HOLDS = [
    pytest.param(_mutex, _contend_mutex, id="mutex"),
    pytest.param(
        _lock(lambda c: c.semaphore(NAME, 1)),
        _getting(lambda c: c.semaphore(NAME, 1)),
        id="semaphore",
    ),
    pytest.param(
        _lock(lambda c: c.rwlock(NAME).write),
        _getting(lambda c: c.rwlock(NAME).read),
        id="rwlock-write",
    ),
    pytest.param(
        _lock(lambda c: c.rwlock(NAME).read),
        _getting(lambda c: c.rwlock(NAME).write),
        id="rwlock-read",
    ),
    pytest.param(
        _lock(lambda c: c.election(NAME).campaign(b"first")),
        _getting(lambda c: c.election(NAME).campaign(b"second")),
        id="election",
    ),
    pytest.param(_claim, _contend_claim, id="claim"),
    pytest.param(_membership, _contend_membership, id="membership"),
    pytest.param(_partition, _contend_partition, id="partition"),
]


async def _shielded_cleanup(held: Any, got: anyio.Event) -> list[str]:
    """The body's clean-up, shielded: the hold must stay this client's all along. Returns
    what went wrong (asserted by the caller, after the block: an exception raised here
    could be lost on the way out, which is another test's subject)."""
    wrong = []
    with anyio.CancelScope(shield=True):
        with anyio.move_on_after(CLEANUP):
            await got.wait()
        if got.is_set():
            wrong.append("another client got the hold while its body still ran")
        if held.lost:
            wrong.append("the hold was lost")
    return wrong


@pytest.mark.parametrize(("hold", "contend"), HOLDS)
async def test_an_outer_cancellation_leaves_the_hold_to_its_body(
    coord_url: str, hold: Hold, contend: Contend
) -> None:
    got = anyio.Event()
    wrong = ["the clean-up did not run"]
    async with (
        coord.connect(coord_url, ttl=5.0) as other,
        anyio.create_task_group() as contenders,
    ):
        with anyio.CancelScope() as outer:
            async with coord.connect(coord_url, ttl=5.0) as client, hold(client) as held:
                contenders.start_soon(contend, other, got)
                await anyio.sleep(0.2)  # the contender waits behind the hold
                outer.cancel()
                wrong = await _shielded_cleanup(held, got)
        assert wrong == []
        with anyio.fail_after(10):
            await got.wait()  # its turn came once the block was left
        contenders.cancel_scope.cancel()


@pytest.mark.parametrize("store", ASYNCIO_STORES, indirect=True)
async def test_a_native_cancellation_leaves_the_hold_to_its_body(coord_url: str) -> None:
    """``asyncio.timeout`` around the client: the same, where an anyio shield does not
    stop the cancellation (the clean-up catches it)."""
    got = anyio.Event()
    wrong = ["the clean-up did not run"]
    async with (
        coord.connect(coord_url, ttl=5.0) as other,
        anyio.create_task_group() as contenders,
    ):
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.3), coord.connect(coord_url, ttl=5.0) as client:
                async with client.mutex(NAME) as held:
                    contenders.start_soon(_contend_mutex, other, got)
                    try:
                        await anyio.sleep(5)
                    except asyncio.CancelledError:
                        wrong = await _shielded_cleanup(held, got)
                        raise
        assert wrong == []
        with anyio.fail_after(10):
            await got.wait()


async def test_the_blocks_error_is_raised_through_an_outer_cancellation(coord_url: str) -> None:
    """The close of a client in a cancelled scope ends with that cancellation; the
    error of the block inside must come out, not be swallowed by the scope."""
    with anyio.CancelScope() as outer, pytest.raises(LookupError, match="the body's"):
        async with coord.connect(coord_url, ttl=5.0) as client, client.mutex(NAME):
            outer.cancel()
            with anyio.CancelScope(shield=True):
                await anyio.sleep(0.05)
            raise LookupError("the body's own error")


async def test_a_watch_of_a_client_without_sessions_outlives_an_outer_cancellation(
    coord_url: str,
) -> None:
    """A ``sessions=False`` client's watches run in its backend's tasks: a clean-up
    inside it still sees the changes."""
    async with coord.connect(coord_url, ttl=5.0) as other:
        seen: list[bytes] = []
        with anyio.CancelScope() as outer:
            async with coord.connect(coord_url, sessions=False) as watcher:
                leaders = watcher.election(NAME).observe()
                assert await anext(leaders) is None
                outer.cancel()
                with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                    async with other.election(NAME).campaign(b"leader"):
                        leader = await anext(leaders)
                        seen.append(b"" if leader is None else leader.value)
        assert seen == [b"leader"]


async def test_a_session_used_alone_outlives_an_outer_cancellation(coord_url: str) -> None:
    """A :class:`coord.Session` injected into a recipe (no client around it) keeps its
    lease for a shielded clean-up as a client does."""
    backend = coord.connect(coord_url).backend  # unopened: opened here, by the test
    got = anyio.Event()
    wrong = ["the clean-up did not run"]
    async with (
        coord.connect(coord_url, ttl=5.0) as other,
        anyio.create_task_group() as contenders,
    ):
        with anyio.CancelScope() as outer:
            async with (
                backend,
                coord.Session(backend, ttl=5.0) as session,
                coord.Mutex(session, NAME) as held,
            ):
                contenders.start_soon(_contend_mutex, other, got)
                await anyio.sleep(0.2)
                outer.cancel()
                wrong = await _shielded_cleanup(held, got)
        assert wrong == []
        with anyio.fail_after(10):
            await got.wait()


async def test_a_client_cancelled_at_any_step_of_its_life_ends_and_leaves_nothing(
    coord_url: str,
) -> None:
    """Cancelled at its n-th checkpoint, for n across a whole life (open, acquire, hold,
    release, close): the client ends (a cancelled start of its shielded tasks once waited
    for them forever) and leaves no key behind."""
    name = "any-step"
    cut, whole = 0, False
    async with coord.connect(coord_url, ttl=5.0) as other:
        for n in range(0, 2000, 7):
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    with anyio.CancelScope() as life:
                        tg.start_soon(_cancel_after, n, life)
                        async with coord.connect(coord_url, ttl=5.0) as client:
                            async with client.mutex(name):
                                await anyio.lowlevel.checkpoint()
                        whole = True
                    tg.cancel_scope.cancel()
            cut += life.cancelled_caught
            if whole:
                break
        with anyio.fail_after(10):
            await wait_for_no_waiters(other, name)
    assert cut > 0
    assert whole, "no n let a whole life run: raise the range"


async def _cancel_after(n: int, scope: anyio.CancelScope) -> None:
    for _ in range(n):
        await anyio.lowlevel.checkpoint()
    scope.cancel()


@pytest.mark.parametrize("store", ASYNCIO_STORES, indirect=True)
async def test_a_native_cancel_during_the_close_after_an_error_is_not_lost(
    coord_url: str,
) -> None:
    """``task.cancel()`` is delivered once: a close that swallowed it, for the block's
    error to go on, left a cancelled worker running (found by review)."""

    async def worker() -> None:
        try:
            async with coord.connect(coord_url, ttl=5.0):
                asyncio.get_running_loop().call_soon(asyncio.current_task().cancel)  # type: ignore[union-attr]
                raise ValueError("bad input")
        except ValueError:
            await asyncio.sleep(30)  # a worker that lost its cancellation goes on here

    task = asyncio.ensure_future(worker())
    done, _ = await asyncio.wait([task], timeout=10)
    assert done, "the cancellation was lost"
    assert task.cancelled()
