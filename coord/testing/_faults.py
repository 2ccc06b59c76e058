"""Fault hooks that work on every backend (each backend implements ``_fault_*`` methods)."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import anyio

from .._core import keys as _keys
from .._core.exceptions import BackendUnavailable, ResyncNeeded

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from .._client import Client
    from ..abc import Backend, Change, Listing

__all__ = [
    "compact",
    "drop_key",
    "expire_session",
    "server_wakeups",
    "wait_for_no_waiters",
    "wait_for_waiters",
]


def _hooks(client: Client) -> Any:
    backend = client.backend
    if not hasattr(backend, "_fault_expire_lease"):
        raise TypeError(f"{type(backend).__name__} offers no fault hooks")
    return backend


async def expire_session(client: Client) -> None:
    """Make the store end *client*'s session now, as if its TTL had run out.

    On etcd the lease is revoked (by a separate connection); on memory the store expires
    it. Every key bound to the session is deleted by the store; the client learns of it
    the way it would in production (watches, keepalive replies).
    """
    await _hooks(client)._fault_expire_lease(client.session.lease.id)


async def drop_key(client: Client, key: str) -> None:
    """Delete *key* (relative to the client's namespace) as another client would."""
    await _hooks(client)._fault_delete_key(key)


async def compact(client: Client) -> None:
    """Make the store forget the history of changes so far (etcd: compact at the current
    revision; memory: drop its kept changes; ZooKeeper keeps none anyway). A watch from
    an older revision then raises :exc:`coord.ResyncNeeded`."""
    await _hooks(client)._fault_compact()


async def server_wakeups(client: Client) -> int:
    """A server-side count of watch notifications sent so far (all clients).

    etcd: ``grpc_server_msg_sent_total`` for the Watch method, read from ``/metrics``;
    memory: deletions delivered to waiters. Compare differences, never absolute values.
    """
    return int(await _hooks(client)._fault_wakeups())


async def wait_for_waiters(client: Client, name: str, count: int) -> None:
    """Return once the lock *name* has at least *count* registered entries (holder
    included). Watches the prefix; never polls. A listing or a watch the store does not
    answer (:exc:`coord.BackendUnavailable`: a store slowed by a burst, or restarting)
    is made again after a backoff while the client's session lives: bound the wait with
    a timeout of your own."""
    await _wait_for_queue(client, name, lambda n: n >= count)


async def wait_for_no_waiters(client: Client, name: str) -> None:
    """Return once the lock *name* has no entry at all (nobody holds or waits); as
    :func:`wait_for_waiters` does."""
    await _wait_for_queue(client, name, lambda n: n == 0)


async def _wait_for_queue(client: Client, name: str, done: Callable[[int], bool]) -> None:
    """Wait until ``done(number of entries)``. The prefix's watch is only a trigger: each
    time it reports changes the queue is listed again, but changes that arrive while a
    listing runs are folded into the next one. So a burst of thousands of registrations
    costs a few dozen listings, not one per change (enough, on ZooKeeper, to starve the
    client's own keepalive), and the count is always a real listing, never a tally that a
    store without history (ZooKeeper cannot name deleted children) could get wrong."""
    backend, session = client.backend, client.session
    prefix = _keys.check_name(name, internal=True) + "/"  # a recipe's own lock too

    async def entries() -> Listing:
        # Listed again after a backoff while the store does not answer and the session
        # lives (a listing of thousands of waiters on a loaded machine can take longer
        # than the session timeout that bounds each read: seen on ZooKeeper, with 6 test
        # workers on 2 cores, in tests/contract/test_burst.py).
        listing: Listing = await session.retry(partial(backend.entries, prefix))
        return listing

    listing = await entries()
    while not done(len(listing.entries)):
        try:
            await _watch_until(backend, prefix, listing.revision, entries, done)
            return
        except ResyncNeeded:
            listing = await entries()  # the store could not say what changed: list again
        except BackendUnavailable as exc:
            # The watch got no answer (its changes since the listing are unknown): list
            # again after a backoff, as a listing that got none is, while the session
            # lives (SessionExpiredError once it is lost).
            listing = await session.retry(partial(backend.entries, prefix), failed=exc)


async def _watch_until(
    backend: Backend,
    prefix: str,
    revision: int,
    entries: Callable[[], Awaitable[Listing]],
    done: Callable[[int], bool],
) -> None:
    changed = anyio.Event()
    resync: ResyncNeeded | BackendUnavailable | None = None

    async def follow(changes: AsyncIterator[Change]) -> None:
        nonlocal resync
        try:
            async for _ in changes:
                changed.set()
        except (ResyncNeeded, BackendUnavailable) as exc:  # (raised as itself, below)
            resync = exc
            changed.set()

    async with backend.watch(prefix, revision=revision) as changes:
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow, changes)
            while True:
                await changed.wait()
                changed = anyio.Event()
                if resync is not None or done(len((await entries()).entries)):
                    tg.cancel_scope.cancel()
                    break
    if resync is not None:
        raise resync
