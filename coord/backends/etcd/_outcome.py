"""The outcome of a piece of work that a task of the backend does for callers who may
stop waiting: a value, an error, or dropped (never done); set once, read any number of
times.

The registrar's requests are answered so (``_register.py``): the caller waits for its
registration's outcome, and a caller cancelled meanwhile leaves the outcome for a repeat
to take over, or for the abandonment that undoes what it made. A waiter's cancellation
takes its waiting away and leaves the outcome as it was (as ``asyncio.shield`` of a
future did), on every event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

from ..._core.exceptions import BackendUnavailable

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._grpc._pipe import Event

__all__ = ["Outcome"]

T = TypeVar("T")


class Outcome(Generic[T]):
    """One outcome. *event* makes the event its waiters wait on (the transport's kind)."""

    __slots__ = ("_dropped", "_error", "_event", "_make", "_set", "_value")

    def __init__(self, event: Callable[[], Event]) -> None:
        self._make = event
        self._event: Event | None = None  # made by the first waiter
        self._set = False
        self._dropped = False
        self._value: T | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._set

    def dropped(self) -> bool:
        """Whether it was dropped, never done (nobody waited for it any more)."""
        return self._dropped

    def failed(self) -> bool:
        """Whether it ended with an error."""
        return self._error is not None

    def set_result(self, value: T) -> None:
        if not self._set:
            self._value = value
            self._finish()

    def set_exception(self, error: BaseException) -> None:
        if not self._set:
            self._error = error
            self._finish()

    def drop(self) -> None:
        if not self._set:
            self._dropped = True
            self._finish()

    def _finish(self) -> None:
        self._set = True
        if self._event is not None:
            self._event.set()

    async def wait(self) -> None:
        """Wait until it is done (a checkpoint unless it is). Cancelled, the outcome
        stays as it was."""
        if not self._set:
            if self._event is None:
                self._event = self._make()
            await self._event.wait()

    def result(self) -> T:
        """The value, once done.

        :raises BaseException: its error
        :raises BackendUnavailable: if it was dropped
        """
        assert self._set, "not done yet"
        if self._error is not None:
            raise self._error
        if self._dropped:
            raise BackendUnavailable("the request was dropped before it was sent")
        return self._value  # type: ignore[return-value]
