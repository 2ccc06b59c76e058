"""NoSessions: where the recipes of a client that only reads get their session: nowhere.

``coord.connect(url, sessions=False)`` makes a client that opens no session: no lease is
granted and nothing is kept alive, so it costs the store nothing while it watches, and a
store that does not answer is reported as a connection failure, not as a lease grant
that timed out. Its recipes read and watch (``waiters()``, ``holders()``, ``leader()``,
``observe()``, ``stats()``, ``dead_letters()``) straight from the backend, as they
always do; whatever needs a session (acquiring, campaigning, putting a job) is refused
at the call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from .._core.exceptions import ClosedError, ConfigurationError
from .readers import Readers
from .session import NOT_OPEN, SessionSource

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from .._core.stats import Counters
    from ..abc import Backend
    from .session import Session

__all__ = ["NoSessions"]


class NoSessions(SessionSource):
    """The session source of a client opened with ``sessions=False``.

    :param backend: the client's backend
    :param identity: the client's identity
    :param counters: the client's counters (they stay at zero: nothing is acquired)
    """

    renews = False

    def __init__(self, backend: Backend, identity: dict[str, Any], counters: Counters) -> None:
        self._backend = backend
        self.identity = identity
        self.counters = counters
        self._state = "new"  # then "open", then "closed"
        self._readers = Readers(self.check_open)

    def open(self) -> None:
        """The client is entered: reads may begin."""
        self._state = "open"

    def close(self) -> None:
        """The client is closed: reads are refused, and those waiting end."""
        self._state = "closed"
        self._readers.end()

    def reading(self) -> AbstractContextManager[object]:
        """Ends with ClosedError when the client closes (there is no session to lose)."""
        return self._readers.reading()

    def check_open(self) -> None:
        """Raise :exc:`ClosedError` if the client is not open yet or closed. Not a
        checkpoint."""
        if self._state == "closed":
            raise ClosedError("the client is closed")
        if self._state == "new":
            raise ClosedError(NOT_OPEN)

    @property
    def backend(self) -> Backend:
        return self._backend

    async def live(self) -> Session:
        """Never a session: raises at once.

        :raises ConfigurationError: always
        """
        self.refuse()

    def refuse(self) -> NoReturn:
        raise ConfigurationError(
            "this client opens no session (coord.connect(..., sessions=False)): it reads "
            "and watches, but cannot acquire, campaign or put a job"
        )
