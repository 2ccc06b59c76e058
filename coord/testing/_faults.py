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

    async def entries(failed: BackendUnavailable | None = None) -> Listing:
        # Listed again after a backoff while the store does not answer and the session
        # lives (a listing of thousands of waiters on a loaded machine can take longer
        # than the session timeout that bounds each read: seen on ZooKeeper, with 6 test
        # workers on 2 cores, in tests/contract/test_burst.py); SessionExpiredError once
        # it is lost. *failed*: the watch got no answer (its changes since the listing
        # are unknown), and is made again after this listing.
        listing: Listing = await session.retry(partial(backend.entries, prefix), failed=failed)
        return listing

    listing = await entries()
    while not done(len(listing.entries)):
        try:
            await _watch_until(backend, prefix, listing.revision, entries, done)
            return
        except ResyncNeeded:
            listing = await entries()  # the store could not say what changed: list again
        except BackendUnavailable as exc:
            listing = await entries(failed=exc)


async def _watch_until(
    backend: Backend,
    prefix: str,
    revision: int,
    entries: Callable[[], Awaitable[Listing]],
    done: Callable[[int], bool],
) -> None:
    """Watch from *revision* and list again at each change until ``done``; raises what
    ended the watch (ResyncNeeded, BackendUnavailable) or the listing, as itself (not in
    a group of the task group's)."""
    changed = anyio.Event()
    ended: Exception | None = None

    async def follow(changes: AsyncIterator[Change]) -> None:
        nonlocal ended
        try:
            async for _ in changes:
                changed.set()
        except (ResyncNeeded, BackendUnavailable) as exc:
            ended = exc
            changed.set()

    async with backend.watch(prefix, revision=revision) as changes:
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow, changes)
            while ended is None:
                await changed.wait()
                changed = anyio.Event()
                if ended is not None:
                    break
                try:
                    if done(len((await entries()).entries)):
                        break
                except Exception as exc:  # (SessionExpiredError: the session was lost)
                    ended = exc
            tg.cancel_scope.cancel()
    if ended is not None:
        raise ended
