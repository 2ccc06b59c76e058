"""Native asyncio cancellation (``task.cancel()``, ``asyncio.timeout``, ``wait_for``),
which an anyio shield does not stop: whatever it interrupts, no key may stay behind.

The cleanup that must happen (deleting a waiter key, a released key) runs in a task the
session owns, so cancelling the caller stops only its wait. Run on the stores that run on
asyncio.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import anyio
import pytest

from coord.testing import wait_for_no_waiters, wait_for_waiters

from .conftest import ASYNCIO_STORES

if TYPE_CHECKING:
    import coord

pytestmark = pytest.mark.anyio


@pytest.fixture(params=ASYNCIO_STORES)
def store(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


async def _no_keys_then_acquire(client: coord.Client, name: str) -> None:
    with anyio.fail_after(10):
        await wait_for_no_waiters(client, name)
        async with client.mutex(name):
            pass


async def test_timeout_around_release_still_releases(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    mutex = a.mutex("native-release")
    await mutex.acquire()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0):  # fires at the release's first await
            await mutex.release()
    assert not mutex.locked()
    await _no_keys_then_acquire(b, "native-release")


async def test_task_cancel_while_waiting_leaves_no_key(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    holder = a.mutex("native-wait")
    await holder.acquire()
    waiter = asyncio.create_task(b.mutex("native-wait").acquire())
    with anyio.fail_after(10):
        await wait_for_waiters(a, "native-wait", 2)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await holder.release()
    await _no_keys_then_acquire(a, "native-wait")


async def test_task_cancel_while_registering_leaves_no_key(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients

    async def take_and_release() -> None:
        async with a.mutex("native-register"):
            pass

    for _ in range(5):
        task = asyncio.create_task(take_and_release())
        await asyncio.sleep(0)  # the registration request is on its way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await _no_keys_then_acquire(b, "native-register")


async def test_wait_for_around_the_body_releases(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients

    async def hold_forever() -> None:
        async with a.mutex("native-body"):
            await asyncio.sleep(3600)

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(hold_forever(), 0.2)
    await _no_keys_then_acquire(b, "native-body")
