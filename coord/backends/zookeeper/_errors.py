"""The wire client's exceptions (kazoo's classes) translated into coord's tree.

The most specific match wins (httpx's ``map_httpcore_exceptions``): kazoo's
``ConnectionClosedError`` is a subclass of its ``SessionExpiredError`` but means "this
wire client was closed", which is coord's ClosedError or SessionExpiredError depending
on why it was stopped, or a mere "try again" when the client was replaced.

Answers about the data (no node, node exists, bad version, not empty) are not translated
here: the backend catches them where it expects them.
"""

from __future__ import annotations

from kazoo import exceptions as kz

from ..._core.exceptions import (
    BackendError,
    BackendUnavailable,
    ClosedError,
    CoordError,
    SessionExpiredError,
)

__all__ = ["ANSWERS", "UNAVAILABLE", "translate"]

#: Errors meaning "no answer": the request may or may not have been applied.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    kz.ConnectionLoss,
    kz.ConnectionDropped,
    kz.OperationTimeoutError,
    OSError,
)

#: Answers about the data, which callers handle themselves.
ANSWERS: tuple[type[BaseException], ...] = (
    kz.NoNodeError,
    kz.NodeExistsError,
    kz.BadVersionError,
    kz.NotEmptyError,
)


def translate(exc: BaseException, what: str, *, closed: bool, ended: bool) -> CoordError:
    """The coord error for a kazoo error (the caller raises it ``from exc``).

    :param closed: the backend was closed
    :param ended: the session was ended on purpose (lease lost or revoked)
    """
    message = f"ZooKeeper {what}: {type(exc).__name__} {exc}".rstrip()
    if isinstance(exc, (kz.ConnectionClosedError, *UNAVAILABLE)):
        # The client was stopped under the request: say why.
        if closed:
            return ClosedError(f"the ZooKeeper backend is closed ({what})")
        if ended:
            return SessionExpiredError(f"the ZooKeeper session is over ({what})")
    if isinstance(exc, kz.ConnectionClosedError):
        return BackendUnavailable(message)  # a replaced client: the retry uses the new one
    if isinstance(exc, kz.SessionExpiredError | kz.SessionMovedError):
        return SessionExpiredError(message)
    if isinstance(exc, UNAVAILABLE):
        return BackendUnavailable(message)
    if isinstance(exc, kz.NoAuthError):
        return BackendError(f"{message} (the node's ACL does not allow this client)")
    return BackendError(message)
