"""Every watch of one etcd backend, multiplexed on one gRPC Watch stream.

Each watch gets its id from us (``WatchCreateRequest.watch_id``, etcd 3.4), so creations
are pipelined: up to :data:`_PIPELINE` are in flight at once, sent by a short-lived pump
task while the stream's reader reads (clientv3 sends one at a time and waits for each
answer: ten thousand held locks would take ten thousand round trips to be guarded). When
the stream breaks, it is reopened (on the next endpoint if the member was unreachable or
had no leader) and every watch is created again from the revision after the last event it
delivered, so no event is lost and none is seen twice. aetcd's watcher does not resume;
this is why coord has its own.

Two kinds of watch share the stream: a :class:`Watch` is iterated for its events (a
prefix watch, a wait for a deletion); a :class:`Guard` is a callback and nothing else
(no task, no event, no buffer), called once when its key is deleted or the watch ends:
what a held lock costs while it is held.

A watch whose start revision has been compacted away cannot resume: it reports
:class:`WatchCompacted`, and its user re-reads the state it cares about.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio
from aetcd import rpc

from ..._core.exceptions import BackendError, BackendUnavailable, ResyncNeeded
from ._connection import AuthTokenExpired, finish, stream_read
from ._grpc import CallEnded, RpcError

if TYPE_CHECKING:
    from collections.abc import Callable

    from anyio.abc import TaskStatus

    from ._connection import Connection
    from ._grpc._pipe import Event

__all__ = ["Guard", "HandOver", "Watch", "WatchCompacted", "WatchStream"]

_BACKOFF = (0.0, 0.05, 0.1, 0.2, 0.5, 1.0)
# A stream that lived this long before it broke was healthy: reconnect at once.
_HEALTHY = 5.0
_log = logging.getLogger("coord.backends.etcd")
_NOPUT = rpc.WatchCreateRequest.FilterType.Value("NOPUT")
# Watch creations sent and not yet answered, at most: enough to fill a round trip, few
# enough that the answers never back up behind our writes.
_PIPELINE = 64


class WatchCompacted(ResyncNeeded):
    """The watch's start revision was compacted: re-read, then watch again."""


class _Watcher:
    """What both kinds of watch share: what to create, and from which revision."""

    __slots__ = ("_stream", "closed", "id", "key", "next_revision", "no_put", "range_end")

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

    def create_request(self, watch_id: int) -> Any:
        create = rpc.WatchCreateRequest(
            key=self.key,
            range_end=self.range_end,
            start_revision=self.next_revision,
            filters=[_NOPUT] if self.no_put else [],
            watch_id=watch_id,
        )
        return rpc.WatchRequest(create_request=create)

    def deliver(self, events: Any) -> None:
        raise NotImplementedError

    def fail(self, error: BackendError) -> None:
        raise NotImplementedError

    def created(self, revision: int) -> None:
        """The server created it at store revision *revision*."""


class Watch(_Watcher):
    """One watch on a key or range. Iterate it for batches of ``aetcd.rpc.Event``.

    :ivar notify: set at the first delivery (events, compaction or failure)
    """

    __slots__ = ("_receive", "_send", "error", "notify")

    def __init__(
        self, stream: WatchStream, key: bytes, range_end: bytes, start: int, no_put: bool
    ) -> None:
        super().__init__(stream, key, range_end, start, no_put)
        #: Why the server ended the watch, if it did.
        self.error: BackendError | None = None
        self.notify = anyio.Event()
        self._send, self._receive = anyio.create_memory_object_stream[Any](1_000_000)

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
        """Stop the watch (cancels it on the server). Not a failure point."""
        self.closed = True
        self._send.close()
        self._receive.close()
        self._stream.forget(self)


class Guard(_Watcher):
    """A watch for the deletion of one key (or of any key of a range) that calls
    *on_change* once: at the first deletion, or when the watch ends otherwise
    (compaction, an error): the caller re-reads."""

    __slots__ = ("_on_change", "_on_created", "error")

    def __init__(
        self,
        stream: WatchStream,
        key: bytes,
        start: int,
        on_change: Callable[[], None],
        on_created: Callable[[int], None] | None = None,
        range_end: bytes = b"",
    ) -> None:
        super().__init__(stream, key, range_end, start, no_put=True)
        self._on_change = on_change
        self._on_created = on_created
        #: Why the server ended the watch, if it did.
        self.error: BackendError | None = None

    def created(self, revision: int) -> None:
        if self._on_created is not None and not self.closed:
            self._on_created(revision)

    def deliver(self, events: Any) -> None:
        if events:  # deletes only (NOPUT): a key is gone
            self._fire()

    def fail(self, error: BackendError) -> None:
        if not self.closed:
            self.error = error
        self._fire()

    def _fire(self) -> None:
        if not self.closed:
            self.stop()
            try:
                self._on_change()
            except Exception:  # pragma: no cover - callers only set flags, start tasks
                _log.exception("an etcd guard callback failed")

    def stop(self) -> None:
        """Stop the guard (cancels it on the server). Idempotent; not a checkpoint."""
        if not self.closed:
            self.closed = True
            self._stream.forget(self)


class HandOver(Guard):
    """The guard of an exclusive waiter whose key is *mine*: the range from the key
    ahead (*key*) to mine, for the hand-over of an etcd queue (``_waitqueue.py``).

    :ivar proof: the revision at which the key ahead and my link (``_waitqueue.link_key``)
        were deleted together, my key not among the deletes delivered; 0 if not.

    Not my key among any of the deletes delivered with it: a response holds the events of
    several revisions when a watch resumes after a break, and a deletion of my key after
    the hand-over (another client's, or my lease's end) means that I no longer hold (the
    read after the wake says so). My key deleted before the watch began is the caller's
    to check, by a read after a late creation. A guard object and no closure: a waiter's
    memory is mostly what it waits with."""

    __slots__ = ("proof",)

    def __init__(
        self,
        stream: WatchStream,
        key: bytes,
        mine: bytes,
        on_change: Callable[[], None],
        on_created: Callable[[int], None] | None,
    ) -> None:
        super().__init__(stream, key, 0, on_change, on_created, range_end=mine + b"\0")
        self.proof = 0

    def deliver(self, events: Any) -> None:
        if events and not self.closed:
            mine = self.range_end[:-1]
            at = events[0].kv.mod_revision  # one revision's deletes, all in one response
            ahead = link = False
            for event in events:
                key = event.kv.key
                if key == mine:
                    break
                if event.kv.mod_revision == at:
                    ahead = ahead or key == self.key
                    link = link or (key.endswith(b"\0") and mine.startswith(key[:-1]))
            else:
                if ahead and link:
                    self.proof = at
        super().deliver(events)


class WatchStream:
    """The Watch stream of one connection and the watches multiplexed on it."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._active: dict[_Watcher, None] = {}  # insertion-ordered; O(1) removal
        self._by_id: dict[int, _Watcher] = {}
        self._queue: deque[_Watcher] = deque()  # to create
        self._cancels: deque[int] = deque()  # watch ids to cancel on the server
        self._ids = itertools.count(1)
        # Ids of the creations sent and not yet answered, oldest first: etcd answers them
        # in order, and a refusal carries id -1 (InvalidWatchID), not ours.
        self._sent: deque[int] = deque()
        self._call: Any = None
        # What wakes the pump when it has nothing to send (None while it sends).
        self._idle: Event | None = None
        self._answered = False  # a watch was created, or events delivered
        self._failing = False
        #: Statistics: responses with events received, and events in them.
        self.responses = 0
        self.events = 0

    def __len__(self) -> int:
        return len(self._active)

    async def open(
        self, key: bytes, range_end: bytes = b"", *, start_revision: int, no_put: bool = False
    ) -> Watch:
        """Start a watch. Its events arrive by iterating it; close it with ``aclose``.
        A checkpoint (the creation is sent by the stream's pump, soon after)."""
        # The checkpoint first: a caller cancelled here gets no watch, so none is left
        # behind unclosed (its memory streams would warn when collected).
        await anyio.lowlevel.checkpoint()
        watch = Watch(self, key, range_end, start_revision, no_put)
        self._add(watch)
        return watch

    def guard(
        self,
        key: bytes,
        *,
        start_revision: int,
        on_change: Callable[[], None],
        on_created: Callable[[int], None] | None = None,
    ) -> Guard:
        """Start a :class:`Guard` of *key* (*start_revision* 0: from its creation on,
        which *on_created* is told). Not a checkpoint."""
        guard = Guard(self, key, start_revision, on_change, on_created)
        self._add(guard)
        return guard

    def hand_over(
        self,
        key: bytes,
        mine: bytes,
        *,
        on_change: Callable[[], None],
        on_created: Callable[[int], None] | None = None,
    ) -> HandOver:
        """Start a :class:`HandOver` guard from *key* to *mine*, from its creation on.
        Not a checkpoint."""
        guard = HandOver(self, key, mine, on_change, on_created)
        self._add(guard)
        return guard

    def _add(self, watch: _Watcher) -> None:
        self._active[watch] = None
        self._queue.append(watch)
        self._kick()

    def forget(self, watch: _Watcher) -> None:
        """Drop *watch* and have it cancelled on the server. Not a checkpoint."""
        watch.closed = True
        self._active.pop(watch, None)
        if watch.id is not None and self._by_id.pop(watch.id, None) is watch:
            self._cancels.append(watch.id)
            self._kick()

    def _kick(self) -> None:
        """Wake the pump if it waits for something to send (with no stream, there is no
        pump: the next one sends everything)."""
        idle = self._idle
        if idle is not None:
            idle.set()

    def _next_request(self) -> Any:
        if self._cancels:
            return rpc.WatchRequest(
                cancel_request=rpc.WatchCancelRequest(watch_id=self._cancels.popleft())
            )
        while self._queue and len(self._sent) < _PIPELINE:
            watch = self._queue.popleft()
            if watch.closed:
                continue
            watch.id = next(self._ids)
            self._by_id[watch.id] = watch
            self._sent.append(watch.id)
            return watch.create_request(watch.id)
        return None

    async def _pump(self, call: Any) -> None:
        """Send what is to be sent (cancels first, then creations while fewer than
        _PIPELINE are unanswered), and wait for more: one task beside the reader for the
        stream's life (a task per burst of writes cost more than the writes). The reader's
        end cancels it."""
        try:
            while True:
                request = self._next_request()
                if request is None:
                    self._idle = idle = self._conn.waiter()
                    try:
                        await idle.wait()
                    finally:
                        self._idle = None
                    continue
                await call.write(request)
        except (RpcError, CallEnded):
            call.cancel()  # the stream is broken: run() reopens it, creating every watch
        except BaseException:
            call.cancel()  # a write cut half-way leaves the stream unusable
            raise

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
            except (RpcError, BackendUnavailable, AuthTokenExpired) as exc:
                error: BaseException = exc
            except Exception as exc:
                # A bug: let it take the stream down and reopen it, never crash the
                # user's code.
                _log.exception("etcd watch stream failed; reopening it")
                error = exc
            if self._answered or anyio.current_time() - opened > _HEALTHY:
                attempt = 0  # the stream worked: this is a fresh break
            try:
                await self._conn.recover(error, generation, token)
            except Exception as exc:  # e.g. logging in again was refused
                attempt = max(attempt, 1)
                if not self._failing:
                    _log.warning("etcd watch stream cannot recover yet: %s", exc)
                self._failing = True
            else:
                if self._failing:
                    _log.info("etcd watch stream recovered")
                self._failing = False
            await anyio.sleep(_BACKOFF[min(attempt, len(_BACKOFF) - 1)])
            attempt += 1

    async def _serve(self) -> None:
        """Open the stream and serve it until it breaks."""
        call = self._conn.watch.Watch(metadata=self._conn.metadata(require_leader=True))
        error: Exception | None = None
        try:
            async with anyio.create_task_group() as tg:
                self._reset(call)
                tg.start_soon(self._pump, call)
                try:
                    while True:
                        self._handle(await stream_read(call))
                except Exception as exc:  # raised as itself, not in an ExceptionGroup
                    error = exc
                    tg.cancel_scope.cancel()
            if error is not None:
                raise error
        finally:
            self._call = None
            finish(call)

    def _reset(self, call: Any) -> None:
        self._call = call
        self._by_id.clear()
        self._cancels.clear()  # the old stream's watches died with it
        self._sent.clear()
        for watch in self._active:
            watch.id = None
        self._queue = deque(self._active)

    def _handle(self, response: Any) -> None:
        if response.created:
            # The answer to the oldest creation sent (by its id: a refusal says -1).
            watch_id = self._sent.popleft() if self._sent else response.watch_id
            watch = self._by_id.get(watch_id)
            if watch is not None and response.canceled:
                self._cancelled(watch, watch_id, response)
            elif watch is not None:
                self._answered = True
                revision = response.header.revision
                if not watch.next_revision:  # "from now": a new stream resumes from here
                    watch.next_revision = revision + 1
                watch.created(revision)
            self._kick()  # room in the pipeline
            return
        watch = self._by_id.get(response.watch_id)
        if response.canceled:
            if watch is not None:
                self._cancelled(watch, response.watch_id, response)
        else:
            self._answered = True
            self.responses += 1
            self.events += len(response.events)
            if watch is not None:
                watch.deliver(response.events)

    def _cancelled(self, watch: _Watcher, watch_id: int, response: Any) -> None:
        self._by_id.pop(watch_id, None)
        self._active.pop(watch, None)
        if response.compact_revision:
            watch.fail(WatchCompacted(f"watch compacted at {response.compact_revision}"))
        elif "no leader" in response.cancel_reason:
            # The member lost its leader: reopen the stream elsewhere and keep the watch.
            self._active[watch] = None
            raise BackendUnavailable(f"etcd watch: {response.cancel_reason}")
        elif "invalid auth token" in response.cancel_reason:
            # The stream's token is stale (expired, or the server restarted): log in again
            # and reopen the stream with the new token, keeping the watch.
            self._active[watch] = None
            raise AuthTokenExpired(f"etcd watch: {response.cancel_reason}")
        else:
            watch.fail(BackendError(f"etcd watch cancelled: {response.cancel_reason}"))
