"""Fault hooks that work on every backend (each backend implements ``_fault_*`` methods)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _keys
from ..abc import ChangeKind

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._client import Client

__all__ = [
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


async def server_wakeups(client: Client) -> int:
    """A server-side count of watch notifications sent so far (all clients).

    etcd: ``grpc_server_msg_sent_total`` for the Watch method, read from ``/metrics``;
    memory: deletions delivered to waiters. Compare differences, never absolute values.
    """
    return int(await _hooks(client)._fault_wakeups())


async def wait_for_waiters(client: Client, name: str, count: int) -> None:
    """Return once the lock *name* has at least *count* registered entries (holder
    included). Watches the prefix; never polls."""
    await _wait_for_queue(client, name, lambda n: n >= count)


async def wait_for_no_waiters(client: Client, name: str) -> None:
    """Return once the lock *name* has no entry at all (nobody holds or waits)."""
    await _wait_for_queue(client, name, lambda n: n == 0)


async def _wait_for_queue(client: Client, name: str, done: Callable[[int], bool]) -> None:
    """Wait until ``done(number of entries)``: one listing, then the watch's changes,
    counted as they come (re-listing after each change would cost O(n) reads per change,
    enough to starve the client's keepalive under a burst of thousands of waiters)."""
    backend = client.backend
    prefix = _keys.prefix_of(name)
    listing = await backend.entries(prefix)
    keys = {entry.key for entry in listing.entries}
    if done(len(keys)):
        return
    async with backend.watch(prefix, revision=listing.revision) as changes:
        async for change in changes:
            key = change.entry.key
            if key == prefix:  # deletions whose names the store could not tell
                keys = {entry.key for entry in (await backend.entries(prefix)).entries}
            elif not _is_waiter(prefix, key):
                continue  # a key of a nested name
            elif change.kind is ChangeKind.PUT:
                keys.add(key)
            else:
                keys.discard(key)
            if done(len(keys)):
                return


def _is_waiter(prefix: str, key: str) -> bool:
    rest = key[len(prefix) :]
    return key.startswith(prefix) and rest.startswith(_keys.WAITER_MARK) and "/" not in rest
