"""Every watch of one etcd backend, multiplexed on one gRPC Watch stream.

Like clientv3's watcher: watch creations are sent one at a time (the server answers them in
order, and the answer carries the watch id). When the stream breaks, it is reopened (on
the next endpoint if the member was unreachable or had no leader) and every watch is
created again from the revision after the last event it delivered, so no event is lost and
none is seen twice. aetcd's watcher does not resume; this is why coord has its own.

A watch whose start revision has been compacted away cannot resume: it reports
:class:`WatchCompacted`, and its user re-reads the state it cares about.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio
import grpc
from aetcd import rpc

from ..._exceptions import BackendError, BackendUnavailable, ResyncNeeded
from ._connection import AuthTokenExpired, finish, stream_read, stream_write

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from ._connection import Connection

__all__ = ["Watch", "WatchCompacted", "WatchStream"]

_BACKOFF = (0.0, 0.05, 0.1, 0.2, 0.5, 1.0)
# A stream that lived this long before it broke was healthy: reconnect at once.
_HEALTHY = 5.0
_log = logging.getLogger("coord.backends.etcd")
_NOPUT = rpc.WatchCreateRequest.FilterType.Value("NOPUT")


class WatchCompacted(ResyncNeeded):
    """The watch's start revision was compacted: re-read, then watch again."""


class Watch:
    """One watch on a key or range. Iterate it for batches of ``aetcd.rpc.Event``.

    :ivar notify: set at the first delivery (events, compaction or failure)
    """

    def __init__(
        self, stream: WatchStream, key: bytes, range_end: bytes, start: int, no_put: bool
    ) -> None:
        self._stream = stream
        self.key = key
        self.range_end = range_end
        self.next_revision = start
        self.no_put = no_put
        self.id: int | None = None
        self.closed = False
        #: Why the server ended the watch, if it did.
        self.error: BackendError | None = None
        self.notify = anyio.Event()
        self._send, self._receive = anyio.create_memory_object_stream[Any](1_000_000)

    def create_request(self) -> Any:
        create = rpc.WatchCreateRequest(
            key=self.key,
            range_end=self.range_end,
            start_revision=self.next_revision,
            filters=[_NOPUT] if self.no_put else [],
        )
        return rpc.WatchRequest(create_request=create)

    def deliver(self, events: Any) -> None:
        if self.closed:
            return
        if events:
            self.next_revision = events[-1].kv.mod_revision + 1
            self._send.send_nowait(list(events))
        self.notify.set()

    def fail(self, error: BackendError) -> None:
        if not self.closed:
            self.error = error
            self._send.send_nowait(error)
            self.notify.set()
            self.closed = True

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> list[Any]:
        try:
            item = await self._receive.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None
        if isinstance(item, BaseException):
            raise item
        return item  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        """Stop the watch (cancels it on the server). Shielded; not a failure point."""
        self.closed = True
        self._send.close()
        self._receive.close()
        await self._stream.forget(self)


class WatchStream:
    """The Watch stream of one connection and the watches multiplexed on it."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._active: list[Watch] = []
        self._by_id: dict[int, Watch] = {}
        self._queue: deque[Watch] = deque()
        self._creating: Watch | None = None
        self._call: Any = None
        self._lock = anyio.Lock()
        self._answered = False  # a watch was created, or events delivered
        self._failing = False
        #: Statistics: responses with events received, and events in them.
        self.responses = 0
        self.events = 0

    async def open(
        self, key: bytes, range_end: bytes = b"", *, start_revision: int, no_put: bool = False
    ) -> Watch:
        """Start a watch. Its events arrive by iterating it; close it with ``aclose``."""
        watch = Watch(self, key, range_end, start_revision, no_put)
        self._active.append(watch)
        self._queue.append(watch)
        try:
            await self._send_next()
        except (grpc.aio.AioRpcError, BackendUnavailable):
            pass  # the stream is broken: run() reopens it and creates this watch then
        return watch

    async def forget(self, watch: Watch) -> None:
        if watch in self._active:
            self._active.remove(watch)
        if watch.id is not None and self._by_id.pop(watch.id, None) is watch:
            cancel = rpc.WatchCancelRequest(watch_id=watch.id)
            with anyio.move_on_after(1, shield=True):
                try:
                    await self._write(rpc.WatchRequest(cancel_request=cancel))
                except (grpc.aio.AioRpcError, BackendUnavailable):
                    pass  # the stream is gone, and the watch with it

    async def _write(self, request: Any) -> None:
        # One writer at a time on the stream; a write is never interrupted half-way.
        with anyio.CancelScope(shield=True):
            async with self._lock:
                if self._call is not None:
                    await stream_write(self._call, request)

    async def _send_next(self) -> None:
        with anyio.CancelScope(shield=True):
            async with self._lock:
                while self._creating is None and self._queue and self._call is not None:
                    watch = self._queue.popleft()
                    if watch.closed:
                        continue
                    self._creating = watch
                    await stream_write(self._call, watch.create_request())

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep the stream open, reopening it after every break. Start with ``tg.start``.

        Never raises (but cancellation): it lives in the backend's task group, beside the
        keepalive, and a failure here must cost neither. Whatever breaks the stream or the
        recovery (a login refused after a password change, a bug), it logs, backs off and
        tries again; waiters see their watches resume.
        """
        task_status.started()
        attempt = 0
        while True:
            generation, token = self._conn.generation, self._conn.token
            self._answered = False
            opened = anyio.current_time()
            try:
                await self._serve()
            except (grpc.aio.AioRpcError, BackendUnavailable, AuthTokenExpired) as exc:
                error: BaseException = exc
            except Exception as exc:
                # A bug: let it take the stream down and reopen it, never crash the
                # user's code.
                _log.exception("coord: etcd watch stream failed; reopening it")
                error = exc
            if self._answered or anyio.current_time() - opened > _HEALTHY:
                attempt = 0  # the stream worked: this is a fresh break
            try:
                await self._conn.recover(error, generation, token)
            except Exception as exc:  # e.g. logging in again was refused
                attempt = max(attempt, 1)
                if not self._failing:
                    _log.warning("coord: etcd watch stream cannot recover yet: %s", exc)
                self._failing = True
            else:
                if self._failing:
                    _log.info("coord: etcd watch stream recovered")
                self._failing = False
            await anyio.sleep(_BACKOFF[min(attempt, len(_BACKOFF) - 1)])
            attempt += 1

    async def _serve(self) -> None:
        """Open the stream and serve it until it breaks."""
        call = self._conn.watch.Watch(metadata=self._conn.metadata(require_leader=True))
        self._reset(call)
        try:
            await self._send_next()
            while True:
                response = await stream_read(call)
                await self._handle(response)
        finally:
            self._call = None
            await finish(call)

    def _reset(self, call: Any) -> None:
        self._call = call
        self._by_id.clear()
        self._creating = None
        self._active = [w for w in self._active if not w.closed]
        self._queue = deque(self._active)

    async def _handle(self, response: Any) -> None:
        if response.created:
            watch, self._creating = self._creating, None
            if watch is not None:
                watch.id = response.watch_id
                self._by_id[watch.id] = watch
                if response.canceled:
                    self._cancelled(watch, response)
                else:
                    self._answered = True
                    if watch.closed:
                        await self.forget(watch)
            await self._send_next()
        elif response.canceled:
            watch = self._by_id.pop(response.watch_id, None)
            if watch is not None:
                self._cancelled(watch, response)
        else:
            watch = self._by_id.get(response.watch_id)
            self._answered = True
            self.responses += 1
            self.events += len(response.events)
            if watch is not None:
                watch.deliver(response.events)

    def _cancelled(self, watch: Watch, response: Any) -> None:
        self._by_id.pop(response.watch_id, None)
        if watch in self._active:
            self._active.remove(watch)
        if response.compact_revision:
            watch.fail(WatchCompacted(f"watch compacted at {response.compact_revision}"))
        elif "no leader" in response.cancel_reason:
            # The member lost its leader: reopen the stream elsewhere and keep the watch.
            self._active.append(watch)
            raise BackendUnavailable(f"etcd watch: {response.cancel_reason}")
        elif "invalid auth token" in response.cancel_reason:
            # The stream's token is stale (expired, or the server restarted): log in again
            # and reopen the stream with the new token, keeping the watch.
            self._active.append(watch)
            raise AuthTokenExpired(f"etcd watch: {response.cancel_reason}")
        else:
            watch.fail(BackendError(f"etcd watch cancelled: {response.cancel_reason}"))
