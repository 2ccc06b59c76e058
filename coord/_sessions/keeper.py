"""SessionKeeper: the sessions of one client, one after the other.

A client lives as long as its service; its sessions do not. When the current session is
lost (lease expired or revoked, local deadline passed, store unreachable for too long),
the keeper closes it (revoking what is left of it) and opens the next one, with a
jittered backoff while the store cannot be reached. Recipes ask it for a live session
(:meth:`SessionKeeper.live`) and never learn which backend they run on:

* holders of the lost session are cancelled and get ``LockLost`` (the session tells
  them the moment it is lost);
* waiters of the lost session held nothing: they register again on the next session
  (losing their place in the queue) and keep waiting, bounded only by their caller;
* new calls wait for the next session.

With ``renew=False`` there is no next session: calls raise SessionExpiredError.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import AsyncResource

from .._core import retry as _retry
from .._core.background import BackgroundTasks, Endings
from .._core.checks import check_bool, check_ttl
from .._core.exceptions import ClosedError, SessionExpiredError
from .._core.stats import Counters
from . import identity as _identity
from .readers import Readers
from .session import CLOSE_MARGIN, NOT_OPEN, Session, SessionSource

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Coroutine
    from contextlib import AbstractContextManager
    from types import TracebackType

    from anyio.abc import TaskStatus

    from ..abc import Backend

__all__ = ["SessionKeeper", "SessionStatistics"]

_log = logging.getLogger("coord")

# Renewal attempts back off up to this many seconds (jittered) while the store is down.
_RENEW_BACKOFF_CAP = 2.0


@dataclass(frozen=True)
class SessionStatistics:
    """The sessions of one client so far.

    :ivar session_id: id of the current session's lease, None between sessions
    :ivar sessions_opened: sessions opened, the first one included
    :ivar sessions_lost: sessions lost (closing the client does not count)
    :ivar renew_failures: attempts to open a session that failed
    :ivar renews: whether a lost session is followed by a new one
    """

    session_id: int | None
    sessions_opened: int
    sessions_lost: int
    renew_failures: int
    renews: bool


class SessionKeeper(SessionSource, AsyncResource):
    """Keeps a live session open on *backend* until closed.

    :param backend: an open backend
    :param ttl: the TTL of every session
    :param renew: open a new session when the current one is lost
    """

    def __init__(
        self,
        backend: Backend,
        *,
        ttl: float = 10.0,
        renew: bool = True,
        identity: dict[str, Any] | None = None,
    ) -> None:
        check_bool(renew, "renew")
        self.identity = identity if identity is not None else _identity.identity()
        self.counters: Counters = Counters()
        self._backend = backend
        self._ttl = check_ttl(ttl, backend.max_ttl, type(backend).__name__)
        self.renews = renew
        self._current: Session | None = None
        self._tg: BackgroundTasks | None = None
        self._endings = Endings()  # the client's tasks its close waits for (spawn)
        self._changed: anyio.Event | None = None
        self._closing = False
        self._draining = False  # closing, and waiting for the endings: spawn takes them
        self._dead = False  # lost, and not renewing
        self._generation = 0
        self._opened = self._lost = self._failures = 0
        self._finished: dict[Session, anyio.Event] = {}
        self._readers = Readers(self._check_reading)

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def current(self) -> Session:
        """The current session (possibly lost, while the next one is being opened).

        :raises ClosedError: before the keeper is open
        """
        if self._current is None:
            self.check_open()
            raise ClosedError("the client is still opening its first session")
        return self._current

    def check_open(self) -> None:
        """Raise :exc:`ClosedError` if the client is not open yet or closed. Not a
        checkpoint."""
        if self._closing:
            raise ClosedError("the client is closed")
        if self._changed is None:
            raise ClosedError(NOT_OPEN)

    def describe(self) -> str:
        """The state, for reprs: ``session=<lease id> open``, ``renewing``, ``closed``..."""
        session = self._current
        if session is None:
            return "closed" if self._closing else "not open"
        state = "closed" if self._closing else "lost" if self._dead else "open"
        if session.lost and state == "open":
            state = "renewing"  # between sessions
        return f"session={session.id:#x} {state}"

    def statistics(self) -> SessionStatistics:
        """Counters of this client's sessions. Not a checkpoint."""
        current = self._current
        live = current is not None and not current.lost
        return SessionStatistics(
            current.id if live and current is not None else None,
            self._opened,
            self._lost,
            self._failures,
            self.renews,
        )

    async def live(self) -> Session:
        """The current session if it is live, else wait for the next one. A checkpoint
        only when it waits.

        :raises SessionExpiredError: if the session was lost and ``renew=False``
        :raises ClosedError: if the client is not open yet, or closed
        """
        while True:
            self.check_open()
            assert self._changed is not None
            session = self._current
            if session is not None and not session.lost:
                return session
            if self._dead:
                raise _no_next(session)
            await self._changed.wait()

    def reading(self) -> AbstractContextManager[object]:
        """Ends with ClosedError when the client closes, and with SessionExpiredError as
        soon as the session is lost with ``renew=False``."""
        return self._readers.reading()

    def _check_reading(self) -> None:
        self.check_open()
        session = self._current
        if not self.renews and session is not None and session.lost:
            raise _no_next(session)

    def spawn(self, func: Callable[[], Coroutine[Any, Any, None]], *, ending: bool = False) -> None:
        """Run *func* in the client's task group: across sessions, until the client
        closes. Not a checkpoint.

        :param ending: the close waits for it (up to the TTL, beside the session's
            endings) before it stops the client's tasks: a put out, told done rather
            than unknown
        :raises ClosedError: if the client is not open, or closing (an ending is taken
            while the close waits for the endings: a cancelled put's withdrawal, started
            when its transaction out is answered)
        """
        if self._tg is None or (self._closing and not (ending and self._draining)):
            raise ClosedError("the client is not open")
        if ending:
            self._endings.start(self._tg.start_soon, func)
        else:
            self._tg.start_soon(func)

    def changes(self) -> AsyncIterator[Session]:
        """The current session, then each new one as it is opened; ends when the client
        closes (or, with ``renew=False``, once the session is lost)."""
        return _Changes(self)

    # -- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> SessionKeeper:
        self._changed = anyio.Event()
        # The keeper's tasks (and the sessions' tasks, which run in them) live until
        # aclose(), whatever scope around the client is cancelled: see _background.
        self._tg = BackgroundTasks()
        await self._tg.open()
        try:
            # The first session's failure is raised as itself (tg.start re-raises it).
            session = await self._tg.start(self._keep)
        except BaseException:
            self._closing = True
            await self._tg.aclose()
            raise
        self._tg.start_soon(self._renew)
        _log.info(
            "session %#x opened on %s (ttl %gs)",
            session.id,
            self._backend.url,
            session.lease.ttl,
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the current session and stop renewing. Shielded. First the endings out
        get their answers (the session's: acks, claimed jobs given back; the client's:
        puts), up to the TTL; then holders are told; then the lease is revoked. The
        whole close takes at most the TTL and :data:`CLOSE_MARGIN` seconds."""
        if self._closing or self._tg is None:
            self._closing = True
            self._readers.end()
            return
        self._closing = True
        self._readers.end()
        self._publish()
        session = self._current
        # The whole close within the TTL and a second: the endings up to the TTL, then
        # the revoke in what is left (a store that answered none expires the lease).
        deadline = anyio.current_time() + self._ttl + CLOSE_MARGIN
        if session is not None:
            session.close_by(deadline)
        try:
            try:
                # The endings out first, up to the TTL: the client's own (puts out,
                # withdrawals of cancelled puts), and the session's (claimed jobs given
                # back, acks answered: start_ending), until neither has any: each may
                # start while the other's are waited for (an ack made while a put is
                # out; a withdrawal once a cancelled put's transaction is answered).
                self._draining = True
                with anyio.move_on_after(self._ttl, shield=True):
                    while True:
                        await self._endings.wait()
                        if session is not None:
                            await session.drain()  # (a checkpoint: then no more start)
                        if not self._endings.running:
                            break
            finally:  # (also after a native cancellation, which no shield stops)
                self._draining = False
                if session is not None:
                    session.declare_lost("the client was closed")
            if session is not None:
                finished = self._finished.get(session)
                if finished is not None:
                    with anyio.CancelScope(deadline=deadline, shield=True):
                        await finished.wait()
        finally:
            await self._tg.aclose()

    def _publish(self) -> None:
        assert self._changed is not None
        self._generation += 1
        self._changed.set()
        self._changed = anyio.Event()

    async def _keep(self, *, task_status: TaskStatus[Session]) -> None:
        """Open one session, publish it, and close it once it is lost. The session's
        task group lives in this task, from start to end. Raises only before it has
        started (``tg.start`` hands that to the caller); never into the task group."""
        session = Session(self._backend, ttl=self._ttl)
        finished = anyio.Event()
        started = False
        try:
            async with session:
                self._finished[session] = finished
                self._current = session
                self._opened += 1
                self._publish()
                task_status.started(session)
                started = True
                await session.wait_lost()
        except Exception:
            if not started:
                raise
            _log.exception("closing session %#x failed", session.id)
        finally:
            finished.set()
            self._finished.pop(session, None)

    async def _renew(self) -> None:
        """Follow the current session; when it is lost, open the next one."""
        while True:
            session = self.current
            await session.wait_lost()
            if self._closing:
                return
            self._lost += 1
            _log.warning(
                "session %#x on %s lost (%s)%s",
                session.id,
                self._backend.url,
                session.reason,
                "; opening a new one" if self.renews else "; not renewing (renew=False)",
            )
            if not self.renews:
                self._readers.end()  # now: not after the revoke, which may take the TTL
            lost_at = anyio.current_time()
            finished = self._finished.get(session)
            if finished is not None:  # the lease is revoked (or given up) before the next
                await finished.wait()
            if not self.renews:
                self._dead = True
                self._publish()
                return
            await self._open_next(session, lost_at)

    async def _open_next(self, lost: Session, lost_at: float) -> None:
        assert self._tg is not None
        for attempt in _retry.attempts():
            try:
                session = await self._tg.start(self._keep)
            except Exception as exc:  # the store is unreachable, refused us, ...
                self._failures += 1
                log = _log.warning if attempt in (0, 10) else _log.debug
                log("opening a new session failed (attempt %d): %s", attempt + 1, exc)
                await _retry.backoff(attempt, cap=_RENEW_BACKOFF_CAP)
                continue
            _log.info(
                "session %#x opened on %s (ttl %gs), replacing %#x after %.1fs "
                "(%d failed attempts)",
                session.id,
                self._backend.url,
                session.lease.ttl,
                lost.id,
                anyio.current_time() - lost_at,
                attempt,
            )
            return


def _no_next(session: Session | None) -> SessionExpiredError:
    return SessionExpiredError(
        f"the session was lost ({session.reason if session else '?'}) and this client "
        "does not open another (renew=False)"
    )


class _Changes:
    """Iterates the sessions of a keeper (an iterator, not a generator, so that leaving
    the ``async for`` early leaves nothing to finalize)."""

    def __init__(self, keeper: SessionKeeper) -> None:
        self._keeper = keeper
        self._generation = -1

    def __aiter__(self) -> _Changes:
        return self

    async def __anext__(self) -> Session:
        keeper = self._keeper
        while not keeper._closing and keeper._changed is not None:
            changed = keeper._changed
            if keeper._generation != self._generation and keeper._current is not None:
                if not (keeper._dead and self._generation >= 0):
                    self._generation = keeper._generation
                    return keeper._current
            if keeper._dead:
                break
            await changed.wait()
        raise StopAsyncIteration
