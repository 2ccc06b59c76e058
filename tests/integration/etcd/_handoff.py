"""Helpers of the etcd tests: clients, fresh waiter ids, counting requests, a handoff."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import anyio

from coord.backends.etcd import EtcdBackend

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from contextlib import AsyncExitStack

    import pytest

    import coord


def wid() -> str:
    return "@" + uuid.uuid4().hex


def etcd_of(client: coord.Client) -> EtcdBackend:
    backend = client.backend
    assert isinstance(backend, EtcdBackend)
    return backend


async def clients(stack: AsyncExitStack, url: str, n: int) -> list[coord.Client]:
    import coord

    return [await stack.enter_async_context(coord.connect(url, ttl=30)) for _ in range(n)]


def requests_of(client: coord.Client, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What each request *client*'s backend sends from now on is for, in order."""
    requests: list[str] = []
    conn = etcd_of(client)._conn
    real = conn.call_answer

    async def counting(what: str, *args: Any, **kwargs: Any) -> Any:
        requests.append(what)
        return await real(what, *args, **kwargs)

    monkeypatch.setattr(conn, "call_answer", counting)
    return requests


async def waiting(client: coord.Client) -> None:
    """Until *client* has a watch created on the server (its waiter waits)."""
    stream = etcd_of(client)._watches
    with anyio.fail_after(5):
        while not any(w.id is not None and w.next_revision for w in stream._active):  # noqa: ASYNC110
            await anyio.sleep(0.005)


async def handoff(
    a: coord.Client,
    b: coord.Client,
    name: str,
    while_waiting: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """*a* holds the mutex *name* while *b* waits for it (then *while_waiting* runs),
    releases it, and *b* acquires it (within 5 s), never while *a* holds it."""
    acquired = anyio.Event()
    a_holds = True

    async def wait() -> None:
        async with b.mutex(name):
            assert not a_holds, "b acquired the mutex while a held it"
            acquired.set()

    async with anyio.create_task_group() as tg:
        async with a.mutex(name):
            tg.start_soon(wait)
            await waiting(b)
            if while_waiting is not None:
                await while_waiting()
            a_holds = False
        with anyio.fail_after(5):
            await acquired.wait()
