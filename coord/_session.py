"""Session: one lease with the store, shared by every recipe object of a client.

Like etcd's ``concurrency.Session``: many tasks and many mutexes share one session, each
acquire registering its own key. The session knows when its lease is lost and cancels
every scope that depends on it, so that no waiter or holder carries on unaware.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import AsyncResource, TaskGroup

from ._exceptions import BackendError, ClosedError, ConfigurationError, SessionExpiredError

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Iterator
    from types import TracebackType

    from .abc import Backend, Entry, Lease

__all__ = ["Session"]

# Retry delays for the "guaranteed delete" of a waiter key whose delete failed.
_DISCARD_BACKOFF = (0.1, 0.2, 0.5, 1.0, 2.0)


class Session(AsyncResource):
    """A lease with the store, kept alive while the session is open.

    Example::

        async with MemoryBackend() as backend, Session(backend, ttl=10) as session:
            async with Mutex(session, "jobs/lock") as hold:
                ...

    :param backend: an open backend
    :param ttl: seconds the store keeps our entries after our last acknowledged keepalive.
        A holder that stalls longer than this loses its locks.
    """

    def __init__(self, backend: Backend, *, ttl: float = 10.0) -> None:
        if isinstance(ttl, bool) or not isinstance(ttl, int | float):
            raise ConfigurationError(f"ttl must be a number of seconds, not {ttl!r}")
        if not math.isfinite(ttl) or ttl <= 0:
            raise ConfigurationError(f"ttl must be a positive number of seconds, not {ttl!r}")
        self._backend = backend
        self._ttl = float(ttl)
        self._lease: Lease | None = None
        self._tg: TaskGroup | None = None
        self._closed = False
        self._scopes: set[anyio.CancelScope] = set()

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def ttl(self) -> float:
        return self._ttl

    @property
    def lease(self) -> Lease:
        """The lease, once the session is open.

        :raises ClosedError: before ``__aenter__`` or after close
        """
        if self._lease is None or self._closed:
            raise ClosedError("the session is not open")
        return self._lease

    @property
    def lost(self) -> bool:
        """True once the lease is lost (expired, revoked, or presumed so)."""
        return self._lease is not None and self._lease.lost

    async def wait_lost(self) -> None:
        """Return when the lease is lost. A checkpoint."""
        await self.lease.wait_lost()

    async def __aenter__(self) -> Session:
        # Granted before the task group exists, so that a failure (store unreachable)
        # is raised as itself, not wrapped in an ExceptionGroup.
        self._lease = await self._backend.grant(self._ttl)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._cancel_on_loss, self._lease)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Revoke the lease (deleting our entries) and stop. Bounded by the TTL.

        Cancelling this call still closes the session (shielded).
        """
        if self._closed or self._tg is None:
            self._closed = True
            return
        self._closed = True
        try:
            with anyio.move_on_after(self._ttl, shield=True):
                if self._lease is not None and not self._lease.lost:
                    try:
                        await self._lease.revoke()
                    except BackendError:
                        pass  # the store expires the lease after its TTL anyway
        finally:
            # Exited outside the shield scope: scopes must nest, and the task group was
            # entered in __aenter__.
            self._tg.cancel_scope.cancel()
            await self._tg.__aexit__(None, None, None)

    def check(self) -> Lease:
        """Return the lease if the session can be used, else raise.

        :raises ClosedError: if the session is closed
        :raises SessionExpiredError: if the lease is lost
        """
        lease = self.lease
        if lease.lost:
            raise SessionExpiredError(f"the session's lease {lease.id:x} is lost")
        return lease

    @contextmanager
    def guard(self) -> Iterator[anyio.CancelScope]:
        """A scope cancelled when the lease is lost; then SessionExpiredError is raised.

        Used around waiting, so that a waiter whose session dies is woken (etcd #19597).
        """
        self.check()
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._scopes.discard(scope)
        if scope.cancelled_caught and self.lost:
            raise SessionExpiredError("the session was lost while waiting")

    def start_soon(self, func: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run *func* in the session's task group (cancelled when the session closes)."""
        if self._tg is None or self._closed:
            raise ClosedError("the session is not open")
        self._tg.start_soon(func)

    async def discard(self, entry: Entry) -> None:
        """Delete a waiter entry: shielded, bounded by the TTL, and guaranteed.

        If the delete fails, it is retried in the background while the session lives, so
        that a failed delete never leaves a stuck lock behind (CURATOR-678). Cancelling
        this call does not stop the delete.
        """
        with anyio.move_on_after(self._ttl, shield=True):
            try:
                await self._backend.delete(entry)
                return
            except BackendError:
                pass
        if not self._closed and not self.lost and self._tg is not None:
            self._tg.start_soon(self._discard_in_background, entry)

    async def _discard_in_background(self, entry: Entry) -> None:
        attempt = 0
        while not self.lost:
            await anyio.sleep(_DISCARD_BACKOFF[min(attempt, len(_DISCARD_BACKOFF) - 1)])
            attempt += 1
            try:
                await self._backend.delete(entry)
                return
            except BackendError:
                continue

    async def _cancel_on_loss(self, lease: Lease) -> None:
        await lease.wait_lost()
        for scope in list(self._scopes):
            scope.cancel()
