"""The etcd connection: our own gRPC channels over aetcd's generated stubs.

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

import asyncio
import itertools
import os
import ssl
import stat
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import grpc
from aetcd import rpc

from ..._checks import check_type
from ..._exceptions import (
    BackendError,
    BackendUnavailable,
    ClosedError,
    ConfigurationError,
    CoordError,
    SessionExpiredError,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = [
    "Answer",
    "AuthTokenExpired",
    "Connection",
    "TLSFiles",
    "finish",
    "guarded",
    "stream_read",
    "stream_write",
    "translate",
]

T = TypeVar("T")

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
_BACKOFF = (0.05, 0.1, 0.2, 0.5, 1.0)

# Detect a dead TCP connection (a crashed or SIGSTOPped member) within ~15 s even when no
# request is outstanding; etcd refuses pings more frequent than every 5 s. Reconnect
# quickly: gRPC's default backoff would wait up to 2 minutes after a restart.
_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


@dataclass(frozen=True)
class TLSFiles:
    """Paths of PEM files for TLS; all optional (no CA: the system's roots)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        for field in ("ca_file", "cert_file", "key_file"):
            value = getattr(self, field)
            if value is not None:
                check_type(value, str, field, "a path (str)")
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigurationError("cert_file and key_file must be given together")
        for field in ("ca_file", "cert_file", "key_file"):
            _check_readable(field, getattr(self, field))

    async def credentials(self) -> grpc.ChannelCredentials:
        async def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            try:
                return await anyio.Path(path).read_bytes()
            except OSError as exc:
                raise ConfigurationError(f"cannot read TLS file {path!r}: {exc}") from exc

        return grpc.ssl_channel_credentials(
            root_certificates=await read(self.ca_file),
            private_key=await read(self.key_file),
            certificate_chain=await read(self.cert_file),
        )

    async def probe_context(self) -> ssl.SSLContext:
        """A TLS context for the first contact (:mod:`coord.backends._probe`): it only
        asks whether an HTTP/2 server answers, so it verifies nothing (gRPC does, on its
        own connections) and presents the client certificate if there is one."""

        def make() -> ssl.SSLContext:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            context.set_alpn_protocols(["h2"])
            if self.cert_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
            return context

        try:
            return await anyio.to_thread.run_sync(make)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(f"cannot load the TLS client certificate: {exc}") from exc


def _check_readable(field: str, path: str | None) -> None:
    """A missing TLS file is a configuration error at the call, not a failure when the
    client connects. One stat of a local file: done at once, even on an event loop."""
    if path is None:
        return
    try:
        info = os.stat(path)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read TLS file {path!r} ({field}): {exc.strerror}"
        ) from exc
    if not stat.S_ISREG(info.st_mode):
        raise ConfigurationError(f"TLS file {path!r} ({field}) is not a regular file")


class AuthTokenExpired(BackendError):
    """The server no longer knows our auth token (expired, or the server restarted)."""


async def guarded(awaitable: Awaitable[T]) -> T:
    """Await a gRPC operation so that a cancellation reaches us as anyio delivered it.

    grpc.aio awaits internal tasks; a cancel delivered into them comes back as a bare
    ``CancelledError`` without anyio's "Cancelled via cancel scope" message, which anyio
    then takes for a foreign cancellation: it escapes ``move_on_after`` and cancels the
    enclosing task group. So the operation runs as its own future behind
    ``asyncio.shield``: our task is cancelled with anyio's message, and we cancel the
    operation ourselves. A unary call is waited for with a callback instead (no task of
    ours per request: a third of a request's cost on the client).
    """
    if isinstance(awaitable, grpc.aio.UnaryUnaryCall):
        return await _unary(awaitable)  # type: ignore[no-any-return]
    future = asyncio.ensure_future(awaitable)
    try:
        return await asyncio.shield(future)
    except BaseException as exc:
        task = asyncio.current_task()
        if (
            isinstance(exc, asyncio.CancelledError)
            and future.cancelled()
            and task is not None
            and not task.cancelling()
        ):
            # Not our cancellation: gRPC cancelled the call itself, because its channel
            # was closed (failover). Left as a bare CancelledError it would escape every
            # cancel scope and cancel the caller's task group.
            raise BackendUnavailable("the gRPC call was cancelled: its channel closed") from None
        if not future.done():
            future.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait([future])
        if not future.cancelled():
            future.exception()  # retrieved, so asyncio does not log "never retrieved"
        raise


async def _unary(call: Any) -> Any:
    """:func:`guarded` for a unary call: wait for its end on a future of our own (which
    only our task's cancellation cancels), then take its outcome."""
    if not call.done():
        ended = asyncio.get_running_loop().create_future()
        call.add_done_callback(partial(_resolve, ended))
        try:
            await ended
        except BaseException:
            call.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait([ended])  # until gRPC is done with the call
            raise
    try:
        return await call  # ended: its response, or its error (deserialized)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # ours, between its end and its response
        # Not our cancellation: gRPC cancelled the call itself (its channel closed).
        raise BackendUnavailable("the gRPC call was cancelled: its channel closed") from None


def _resolve(future: asyncio.Future[None], _call: Any) -> None:
    if not future.done():
        future.set_result(None)


async def stream_write(call: Any, request: Any) -> None:
    """Write on a stream; a stream that already ended, or ends during the write, is
    BackendUnavailable.

    (grpc.aio reports a write after the end as ``asyncio.InvalidStateError``, not as an
    RPC error: left alone it would crash the task that owns the stream.)
    """
    try:
        await guarded(_write_unless_ended(call, request))
    except asyncio.InvalidStateError as exc:
        raise BackendUnavailable("the gRPC stream has ended") from exc


async def _write_unless_ended(call: Any, request: Any) -> None:
    """``call.write(request)``, given up when the call ends first.

    A write made before the call's headers went out waits for them, and grpc.aio never
    wakes it if the call ends meanwhile (its channel closed by a failover, or cancelled):
    the write would hang forever, and with it the watch stream that made it, so that
    no waiter on that client ever heard of a deletion again (seen when a cluster's
    leader was killed). So the write races the call's end. A write that is cancelled
    ends the call.
    """
    write = asyncio.ensure_future(call.write(request))
    ended = asyncio.ensure_future(call.code())  # cancelling this wait leaves the call be
    for future in (write, ended):
        # Whatever happens to us, an outcome nobody reads must not be logged by asyncio
        # as "never retrieved" (nor fail a test that collects such logs).
        future.add_done_callback(_retrieve)
    try:
        await asyncio.wait([write, ended], return_when=asyncio.FIRST_COMPLETED)
    finally:
        ended.cancel()
        if not write.done():
            # The call has ended, or we were cancelled: a write given up half-way leaves
            # the stream unusable, so end the call (grpc.aio does not, if the write was
            # still waiting for the headers); its owner reopens the stream.
            write.cancel()
            call.cancel()
    if write.cancelled():
        raise BackendUnavailable("the gRPC stream ended before the write went out")
    write.result()


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def stream_read(call: Any) -> Any:
    """Read from a stream; EOF or an ended stream is BackendUnavailable.

    Awaited directly, not as :func:`guarded` does (a task and a shield per read: a third
    of what the watch stream cost per handoff). A cancellation of the read that is not
    our task's is gRPC's own (the call cancelled: its channel closed, or the stream's
    other half gave up), and becomes BackendUnavailable instead of a bare CancelledError
    that would escape every cancel scope. Our task's own cancellation comes back from
    grpc.aio as a bare CancelledError too: one more turn of the loop lets anyio deliver
    its own again (it does until its scope is left), which its scope then recognizes; a
    native cancellation (``task.cancel()``) is raised as it came.
    """
    try:
        reply = await call.read()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or not task.cancelling():
            raise BackendUnavailable("the gRPC stream was cancelled: its channel closed") from None
        await asyncio.sleep(0)
        raise
    except asyncio.InvalidStateError as exc:
        raise BackendUnavailable("the gRPC stream has ended") from exc
    if reply is grpc.aio.EOF:
        raise BackendUnavailable("the server closed the gRPC stream")
    return reply


async def finish(call: Any) -> None:
    """Cancel a gRPC call and wait (shielded, briefly) until gRPC has let go of it.

    Otherwise its last completion events may be delivered after the event loop closed.
    """
    call.cancel()
    with anyio.move_on_after(2, shield=True):
        await guarded(call.code())


async def _quiesce(channel: grpc.aio.Channel) -> None:
    """Wait until gRPC is done with the calls of *channel*, just closed.

    gRPC's poller thread delivers the last completion events of the closed calls a
    moment later; were the event loop closed first, they would be handed to the next
    loop of the process and fail there ("Event loop is closed", seen with a fresh loop
    per test, and once in CI under load with a fixed 20 ms wait). So wait (bounded) for
    grpc.aio's own tasks of this channel's calls to end, then give the poller thread a
    moment more.
    """
    with anyio.move_on_after(1):
        while pending := [task for task in asyncio.all_tasks() if _call_of(task, channel)]:
            await asyncio.wait(pending)
    await anyio.sleep(0.05)


def _call_of(task: asyncio.Task[Any], channel: grpc.aio.Channel) -> bool:
    """Whether *task* is one of grpc.aio's own tasks for a call on *channel* (found the
    way grpc.aio's ``Channel.close`` finds them; False if its internals change)."""
    if task.done():
        return False
    frame = getattr(task.get_coro(), "cr_frame", None)
    call = frame.f_locals.get("self") if frame is not None else None
    cython_call = getattr(call, "_cython_call", None)
    own = getattr(channel, "_channel", None)
    return own is not None and getattr(cython_call, "_channel", None) is own


def translate(exc: grpc.aio.AioRpcError, what: str) -> CoordError:
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
        self._credentials: grpc.ChannelCredentials | None = None
        self._index = 0
        self._channel: grpc.aio.Channel | None = None
        self._generation = 0
        self._token: str | None = None
        self._auth_lock: anyio.Lock | None = None
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
        self._auth_lock = anyio.Lock()
        if self._tls is not None:
            self._credentials = await self._tls.credentials()
        self._open_channel()
        if self._username is not None:
            await self.authenticate(stale=None)

    def _open_channel(self) -> None:
        target = self.endpoint
        if self._credentials is not None:
            channel = grpc.aio.secure_channel(target, self._credentials, _CHANNEL_OPTIONS)
        else:
            channel = grpc.aio.insecure_channel(target, _CHANNEL_OPTIONS)
        self._channel = channel
        self._generation += 1
        self.kv = rpc.KVStub(channel)
        self.lease = rpc.LeaseStub(channel)
        self.watch = rpc.WatchStub(channel)

    async def failover(self, generation: int) -> None:
        """Move to the next endpoint, unless someone already did since *generation*."""
        if generation != self._generation or self._closed or len(self._endpoints) == 1:
            return  # with one endpoint, gRPC's own reconnect is all there is to do
        old = self._channel
        self._index = (self._index + 1) % len(self._endpoints)
        self._open_channel()
        if old is not None:
            await guarded(old.close(grace=None))

    async def recover(self, exc: BaseException, generation: int, token: str | None) -> None:
        """After a stream broke with *exc*: renew an expired token, or fail over.

        :param token: the token the stream was opened with
        :raises BackendError: if logging in again fails
        """
        expired = isinstance(exc, AuthTokenExpired) or (
            isinstance(exc, grpc.aio.AioRpcError) and self._token_expired(exc)
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
                reply = await guarded(stub.Authenticate(request, timeout=self.attempt_timeout))
            except grpc.aio.AioRpcError as exc:
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
        self._closed = True
        if self._channel is not None:
            with anyio.CancelScope(shield=True):
                await guarded(self._channel.close(grace=None))
                await _quiesce(self._channel)

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
        deadline = anyio.current_time() + self.request_timeout
        for attempt in itertools.count():
            if self._closed:
                raise ClosedError("the etcd connection is closed")
            generation, token = self._generation, self._token
            sent = anyio.current_time()
            budget = deadline - sent
            timeout = min(budget, self.attempt_timeout) if retry else budget
            call = method(self)(request, timeout=max(timeout, 0.001), metadata=self.metadata())
            try:
                return Answer(await guarded(call), sent, attempt + 1)
            except (grpc.aio.AioRpcError, BackendUnavailable) as exc:
                error = translate(exc, what) if isinstance(exc, grpc.aio.AioRpcError) else exc
                if isinstance(exc, grpc.aio.AioRpcError) and self._token_expired(exc):
                    await self.authenticate(stale=token)
                    continue
                if not retry or not isinstance(error, BackendUnavailable):
                    raise error from exc
                remaining = deadline - anyio.current_time()
                if remaining <= 0:
                    raise error from exc
                await self.failover(generation)
                # Back off once every endpoint has been tried.
                if (attempt + 1) % len(self._endpoints) == 0:
                    await anyio.sleep(min(_BACKOFF[min(attempt, len(_BACKOFF) - 1)], remaining))
            except BaseException:
                await finish(call)  # cancelled: wait until gRPC is done with the call
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _token_expired(self, exc: grpc.aio.AioRpcError) -> bool:
        return (
            self._username is not None
            and exc.code() == grpc.StatusCode.UNAUTHENTICATED
            and "invalid auth token" in (exc.details() or "")
        )


def _format(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
