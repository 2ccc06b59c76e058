"""Hold: what the holder of a lock has — its fencing token and the loss signal."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

import anyio

from ._exceptions import BackendError, ClosedError, EntryGoneError, SessionExpiredError

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import TracebackType

    from ._session import Session
    from .abc import Entry

__all__ = ["Hold"]

# Backoff for re-reading my key when the store fails transiently (not an acquisition
# path: the lock is held, and the session's own deadline bounds how long we may try).
_RETRY_DELAYS = (0.1, 0.2, 0.5, 1.0)


class Hold:
    """A granted lock. Returned by ``acquire`` and by ``async with mutex as hold``.

    :ivar name: the lock's name
    :ivar fence: the fencing token: strictly increasing across successive holders of the
        same lock (the etcd create revision, the ZooKeeper czxid of the waiter key). Send
        it with every write to the protected resource so that it can reject a stale holder.
    """

    def __init__(self, name: str, entry: Entry, *, revision: int = 0) -> None:
        self.name = name
        self.fence = entry.revision
        self._entry = entry
        self._seen_at = max(revision, entry.revision)  # my key existed at this revision
        self._lost = anyio.Event()
        self._is_released = False
        self._body: anyio.CancelScope | None = None
        self._guard_scope = anyio.CancelScope()

    def __repr__(self) -> str:
        state = "lost" if self.lost else "released" if self._is_released else "held"
        return f"<coord.Hold {self.name!r} fence={self.fence} {state}>"

    @property
    def key(self) -> str:
        """The waiter key (relative to the namespace) that holds the lock."""
        return self._entry.key

    @property
    def entry(self) -> Entry:
        return self._entry

    @property
    def lost(self) -> bool:
        """True once the lock is known lost (session lost, or the key deleted)."""
        return self._lost.is_set()

    @property
    def released(self) -> bool:
        return self._is_released

    async def wait_lost(self) -> None:
        """Return when the lock is lost. A checkpoint; never returns if it is not lost."""
        await self._lost.wait()

    # -- used by the recipes --------------------------------------------------------------

    def _mark_lost(self) -> None:
        if self._is_released:
            return
        self._lost.set()
        if self._body is not None:
            self._body.cancel()

    def _release(self) -> None:
        self._is_released = True
        self._guard_scope.cancel()

    @contextmanager
    def _cancelled_on_loss(self) -> Iterator[None]:
        """A scope (used while waiting) that is cancelled if the key or session goes."""
        scope = self._body = anyio.CancelScope()
        try:
            with scope:
                if self.lost:
                    scope.cancel()
                yield
        finally:
            self._body = None

    def _enter_body(self) -> None:
        # The body of ``async with`` runs in this scope; losing the lock cancels it.
        self._body = anyio.CancelScope()
        self._body.__enter__()
        if self.lost:
            self._body.cancel()

    def _exit_body(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool:
        body, self._body = self._body, None
        if body is None:
            return False
        return bool(body.__exit__(exc_type, exc_val, exc_tb))

    async def _guard(self, session: Session) -> None:
        """Watch my own key and the session until released; mark the hold lost if either
        goes. Runs in the session's task group."""
        backend = session.backend
        revision = self._seen_at
        attempt = 0
        with self._guard_scope:
            try:
                with session.guard():
                    while True:
                        try:
                            await backend.wait_deleted([self._entry.key], revision=revision)
                            revision = (await backend.position(self._entry, ahead=0)).revision
                            attempt = 0
                        except BackendError as exc:
                            if isinstance(exc, EntryGoneError):
                                raise
                            await anyio.sleep(_RETRY_DELAYS[min(attempt, len(_RETRY_DELAYS) - 1)])
                            attempt += 1
            except (EntryGoneError, SessionExpiredError, ClosedError):
                self._mark_lost()
