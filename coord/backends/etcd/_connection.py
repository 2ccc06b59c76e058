"""The etcd connection: our own gRPC channels (``_grpc/``) under aetcd's generated
stubs.

aetcd's client takes one endpoint, no TLS, and ignores half of RangeRequest, so coord
uses only its generated messages and stubs (``aetcd.rpc``) and manages channels itself:

* several endpoints; requests go to the current one, and an unreachable member (or one
  without a leader) makes us fail over to the next;
* TLS (CA, client certificate) and user/password auth, re-authenticating when the token
  expires;
* every request has a time budget (``request_timeout``) across retries; only requests
  that are safe to repeat are retried (all of coord's lock requests are guarded txns);
* gRPC errors are translated into coord's errors here, at the boundary.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import grpc
from aetcd import rpc

from ..._core.background import BackgroundTasks
from ..._core.exceptions import (
    BackendError,
    BackendUnavailable,
    ClosedError,
    ConfigurationError,
    CoordError,
    SessionExpiredError,
)
from ._grpc import EOF, CallEnded, Channel, RpcError

if TYPE_CHECKING:
    from .._common.tls import TLSFiles

if TYPE_CHECKING:
    import ssl
    from collections.abc import Awaitable, Callable

    from ._grpc._pipe import Event

__all__ = [
    "Answer",
    "AuthTokenExpired",
    "Connection",
    "finish",
    "stream_read",
    "stream_write",
    "translate",
]

T = TypeVar("T")

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
_BACKOFF = (0.05, 0.1, 0.2, 0.5, 1.0)

# Detect a dead TCP connection (a crashed or SIGSTOPped member) within ~15 s while calls
# are open (the watch stream and the lease's keepalive stream always are); etcd refuses
# pings more frequent than every 5 s. Reconnect quickly after a failure.
_KEEPALIVE = 10.0
_KEEPALIVE_TIMEOUT = 5.0
_RECONNECT_BACKOFF = (0.1, 1.0)
_MAX_RECEIVE = 64 * 1024 * 1024


class AuthTokenExpired(BackendError):
    """The server no longer knows our auth token (expired, or the server restarted)."""


async def stream_write(call: Any, request: Any) -> None:
    """Write on a stream; a stream that already ended, or ends during the write, is
    BackendUnavailable. (A write never waits for the connection for ever: a call ends
    when its connection is lost, and a write held back by flow control with it.)"""
    try:
        await call.write(request)
    except CallEnded as exc:
        raise BackendUnavailable("the gRPC stream has ended") from exc


async def stream_read(call: Any) -> Any:
    """Read from a stream; EOF or an ended stream is BackendUnavailable (so is one that
    the stream's other half cancelled, giving up: see :func:`finish`)."""
    try:
        reply = await call.read()
    except CallEnded as exc:
        raise BackendUnavailable("the gRPC stream has ended") from exc
    if reply is EOF:
        raise BackendUnavailable("the server closed the gRPC stream")
    return reply


def finish(call: Any) -> None:
    """End a call we no longer need (its stream is reset at once). Not a checkpoint."""
    call.cancel()


def translate(exc: RpcError, what: str) -> CoordError:
    """The coord error for a gRPC error (the caller raises it ``from exc``)."""
    code, details = exc.code(), exc.details() or ""
    message = f"etcd {what}: {code.name}: {details}"
    if "lease not found" in details:
        return SessionExpiredError(message)
    if code in _RETRYABLE:
        return BackendUnavailable(message)
    return BackendError(message)


@dataclass(frozen=True)
class Answer:
    """A reply and how it was obtained.

    :ivar sent: ``anyio.current_time()`` when the attempt that was answered was sent
    :ivar attempts: how many attempts it took (an answer after more than one may be about
        the effect of an earlier attempt whose reply was lost)
    """

    reply: Any
    sent: float
    attempts: int


class Connection:
    """Channels to the members of one etcd cluster, one in use at a time.

    :param endpoints: ``(host, port)`` pairs, tried in order
    :param tls: TLS files, or None for plain text
    :param username: with *password*, authenticate and send the token with every call
    :param request_timeout: time budget of one request, retries included; each attempt
        gets a third of it (at least a second, or the whole budget if that is less), so
        that a member that hangs costs one attempt, not the request
    """

    def __init__(
        self,
        endpoints: tuple[tuple[str, int], ...],
        *,
        tls: TLSFiles | None = None,
        username: str | None = None,
        password: str | None = None,
        request_timeout: float = 10.0,
    ) -> None:
        if not endpoints:
            raise ConfigurationError("at least one etcd endpoint is needed")
        if (username is None) != (password is None):
            raise ConfigurationError("username and password must be given together")
        self._endpoints = endpoints
        self._tls = tls
        self._username = username
        self._password = password
        self.request_timeout = request_timeout
        self.attempt_timeout = max(request_timeout / 3, min(request_timeout, 1.0))
        self._ssl: ssl.SSLContext | None = None
        self._index = 0
        self._channel: Channel | None = None
        self._generation = 0
        self._token: str | None = None
        self._auth_lock: anyio.Lock | None = None
        # The tasks of the channels' connections: they outlive any one channel (a
        # failover closes the old one from a task of the backend's).
        self._tasks: BackgroundTasks | None = None
        self._clock = anyio.current_time
        #: Makes an event of the transport's kind (``_grpc._pipe.Event``).
        self.event: Callable[[], Event] = anyio.Event
        #: Makes an event that one task at a time waits on (``Runtime.waiter``).
        self.waiter: Callable[[], Event] = anyio.Event
        #: Statistics: Authenticate requests sent.
        self.logins = 0
        self._closed = False
        self.kv: Any = None
        self.lease: Any = None
        self.watch: Any = None

    @property
    def endpoint(self) -> str:
        host, port = self._endpoints[self._index]
        return _format(host, port)

    @property
    def endpoints(self) -> tuple[tuple[str, int], ...]:
        return self._endpoints

    @property
    def generation(self) -> int:
        """Changes each time the channel is replaced (failover)."""
        return self._generation

    @property
    def token(self) -> str | None:
        """The auth token in use (None without auth)."""
        return self._token

    async def open(self) -> None:
        """Open (in the task that will close it: its connections' tasks run in a task
        group of its own). A checkpoint; cancelled, it leaves nothing open."""
        self._auth_lock = anyio.Lock()
        if self._tls is not None:
            self._ssl = await self._tls.client_context()
        tasks = BackgroundTasks()
        await tasks.open()
        self._tasks = tasks
        self._open_channel()
        if self._username is not None:
            try:
                await self.authenticate(stale=None)
            except BaseException:
                await self.close()  # its connection, made for the login (shielded)
                raise

    def _open_channel(self) -> None:
        assert self._tasks is not None
        host, port = self._endpoints[self._index]
        channel = Channel(
            host,
            port,
            ssl_context=self._ssl,
            keepalive=_KEEPALIVE,
            keepalive_timeout=_KEEPALIVE_TIMEOUT,
            max_receive=_MAX_RECEIVE,
            reconnect_backoff=_RECONNECT_BACKOFF,
            # A connection on which nothing can be sent (a server that never opens its
            # flow-control windows, or never reads) costs one attempt, as a member that
            # hangs does: the next attempt goes on a new connection. With one endpoint
            # that is the only way out; a longer limit (the request's) would fail the
            # request that found the stall, though a new connection may serve it.
            stall_timeout=self.attempt_timeout,
            spawn=self._tasks.start_soon,
        )
        self._clock = channel.runtime.clock
        self.event = channel.runtime.event
        self.waiter = channel.runtime.waiter
        self._channel = channel
        self._generation += 1
        self.kv = rpc.KVStub(channel)
        self.lease = rpc.LeaseStub(channel)
        self.watch = rpc.WatchStub(channel)

    async def failover(self, generation: int) -> None:
        """Move to the next endpoint, unless someone already did since *generation*."""
        if generation != self._generation or self._closed or len(self._endpoints) == 1:
            return  # with one endpoint, the channel's own reconnect is all there is to do
        old = self._channel
        self._index = (self._index + 1) % len(self._endpoints)
        self._open_channel()
        if old is not None:
            await old.close()

    async def recover(self, exc: BaseException, generation: int, token: str | None) -> None:
        """After a stream broke with *exc*: renew an expired token, or fail over.

        :param token: the token the stream was opened with
        :raises BackendError: if logging in again fails
        """
        expired = isinstance(exc, AuthTokenExpired) or (
            isinstance(exc, RpcError) and self._token_expired(exc)
        )
        if expired and self._username is not None:
            await self.authenticate(stale=token)
        else:
            await self.failover(generation)

    async def authenticate(self, *, stale: str | None) -> None:
        """Log in and keep the token. One login per expired token: a caller whose token
        *stale* has already been replaced by someone else's login returns at once, so
        that a burst of requests failing together costs one Authenticate, not one each.
        """
        assert self._auth_lock is not None
        async with self._auth_lock:
            if stale is not None and self._token != stale:
                return
            stub = rpc.AuthStub(self._channel)
            request = rpc.AuthenticateRequest(name=self._username, password=self._password)
            self.logins += 1
            try:
                reply = await stub.Authenticate(request, timeout=self.attempt_timeout)
            except RpcError as exc:
                raise translate(exc, "authenticate") from exc
            self._token = reply.token

    def metadata(self, *, require_leader: bool = False) -> tuple[tuple[str, str], ...]:
        """Call metadata: the auth token, and ``hasleader`` for streams, so that a member
        cut off from the leader fails the stream at once instead of hanging (#14641)."""
        md: tuple[tuple[str, str], ...] = (("hasleader", "true"),) if require_leader else ()
        if self._token is not None:
            md += (("token", self._token),)
        return md

    async def close(self) -> None:
        """Close the channel (shielded), then end its tasks (in the task that opened
        it: their task group is entered there). Idempotent."""
        self._closed = True
        try:
            if self._channel is not None:
                with anyio.CancelScope(shield=True):
                    await self._channel.close()
        finally:
            tasks, self._tasks = self._tasks, None
            if tasks is not None:
                await tasks.aclose()

    async def call(
        self,
        what: str,
        method: Callable[[Any], Callable[..., Awaitable[Any]]],
        request: Any,
        *,
        retry: bool = True,
    ) -> Any:
        """Make a unary call, failing over and retrying within the time budget.

        :param method: picks the stub method from this connection, e.g.
            ``lambda c: c.kv.Txn`` (picked anew after a failover)
        :param retry: False for requests that must not be repeated (then the one
            attempt gets the whole budget)
        """
        return (await self.call_answer(what, method, request, retry=retry)).reply

    async def call_answer(
        self,
        what: str,
        method: Callable[[Any], Callable[..., Awaitable[Any]]],
        request: Any,
        *,
        retry: bool = True,
    ) -> Answer:
        """:meth:`call`, with when the answered attempt was sent and how many it took."""
        clock = self._clock  # anyio's clock (on asyncio, the loop's without anyio's look-up)
        deadline = clock() + self.request_timeout
        for attempt in itertools.count():
            if self._closed:
                raise ClosedError("the etcd connection is closed")
            generation, token = self._generation, self._token
            sent = clock()
            budget = deadline - sent
            timeout = min(budget, self.attempt_timeout) if retry else budget
            call = method(self)(request, timeout=max(timeout, 0.001), metadata=self.metadata())
            try:
                return Answer(await call, sent, attempt + 1)
            except (RpcError, BackendUnavailable) as exc:
                error = translate(exc, what) if isinstance(exc, RpcError) else exc
                if isinstance(exc, RpcError) and self._token_expired(exc):
                    await self.authenticate(stale=token)
                    continue
                if not retry or not isinstance(error, BackendUnavailable):
                    raise error from exc
                remaining = deadline - clock()
                if remaining <= 0:
                    raise error from exc
                await self.failover(generation)
                # Back off once every endpoint has been tried.
                if (attempt + 1) % len(self._endpoints) == 0:
                    await anyio.sleep(min(_BACKOFF[min(attempt, len(_BACKOFF) - 1)], remaining))
            except BaseException:
                finish(call)  # cancelled: its stream is reset
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _token_expired(self, exc: RpcError) -> bool:
        return (
            self._username is not None
            and exc.code() == grpc.StatusCode.UNAUTHENTICATED
            and "invalid auth token" in (exc.details() or "")
        )


def _format(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
