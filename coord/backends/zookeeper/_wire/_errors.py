"""The errors of the wire client: kazoo's own classes, plus two of ours.

Answers from the server are raised as kazoo's exception for their error code
(``kazoo.exceptions.EXCEPTIONS``), so that code written against kazoo, and the backend's
:func:`~.._errors.translate`, keep working. A request caught by a connection drop raises
:class:`kazoo.exceptions.ConnectionLoss` (its outcome is unknown); once the session is
over, :class:`kazoo.exceptions.SessionExpiredError`; after ``aclose()``,
:class:`kazoo.exceptions.ConnectionClosedError`.

Ours:

* :class:`MultiFailed` (a ``ZookeeperError``): a multi request was refused as a whole;
  it names the operation that failed and carries every operation's result;
* :class:`ProtocolError`: the server sent what the protocol does not allow (a reply out
  of order, a frame too long, a body that does not decode). It never reaches a caller:
  the connection is dropped, and requests in flight fail with ``ConnectionLoss``.
"""

from __future__ import annotations

from typing import Any

from kazoo import exceptions as kz

__all__ = ["MultiFailed", "ProtocolError", "error_for"]


class ProtocolError(Exception):
    """The server broke the protocol; the connection is dropped."""


class MultiFailed(kz.ZookeeperError):  # type: ignore[misc]
    """A multi request failed: none of its operations was applied.

    :ivar results: one entry per operation, each an exception instance: the one that
        failed raises its own error (``NoNodeError``, ``BadVersionError``...), the
        others ``RolledBackError`` (or ``RuntimeInconsistency`` after the failure)
    :ivar index: the position of the operation that failed
    :ivar error: its error (``results[index]``)
    """

    def __init__(self, results: list[Any]) -> None:
        real = [
            (i, r)
            for i, r in enumerate(results)
            if isinstance(r, Exception) and not isinstance(r, kz.RolledBackError)
        ]
        if not real:  # every one "rolled back": name the first
            real = [(i, r) for i, r in enumerate(results) if isinstance(r, Exception)][:1]
        self.results = results
        first: tuple[int, Exception] = real[0] if real else (0, kz.RolledBackError())
        self.index, self.error = first
        super().__init__(f"operation {self.index} failed: {type(self.error).__name__}")


def error_for(code: int) -> Exception:
    """kazoo's exception for a ZooKeeper error *code* (a new instance)."""
    # kazoo's table raises RuntimeError for a code it does not know.
    cls = kz.EXCEPTIONS.get(code)
    if cls is None:
        unknown: Exception = kz.ZookeeperError(f"ZooKeeper error code {code}")
        return unknown
    error: Exception = cls()
    return error
