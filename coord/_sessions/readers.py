"""Readers: the waits of a client that need no session (``observe``), ended together.

Reads and watches run on the backend, not on a session, so no session's loss ends them,
and a watch on etcd or the memory store waits on whether or not its client is still
open. Their owner (the client's session source) ends them all at once: when the client
closes, and, with ``renew=False``, when its only session is lost. Each then raises what
the owner's check says (:exc:`coord.ClosedError`, :exc:`coord.SessionExpiredError`), so
that no wait outlives its client in silence.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

import anyio

from .._core.exceptions import ClosedError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = ["Readers"]


class Readers:
    """The scopes of the waits that need no session.

    :param check: raises why reads are over (ClosedError, SessionExpiredError); returns
        while they may go on
    """

    def __init__(self, check: Callable[[], None]) -> None:
        self._check = check
        self._scopes: set[anyio.CancelScope] = set()

    def end(self) -> None:
        """Cancel every wait: each raises what the check says. Not a checkpoint."""
        for scope in list(self._scopes):
            scope.cancel()

    @contextmanager
    def reading(self) -> Iterator[None]:
        """A scope around one wait, ended by :meth:`end`. Raises at once if reads are
        over already."""
        self._check()
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        try:
            with scope:
                yield
        finally:
            self._scopes.discard(scope)
        if scope.cancelled_caught:
            self._check()
            raise ClosedError("the reads of this client were ended")  # pragma: no cover
