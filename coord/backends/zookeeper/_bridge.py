"""The bridge between kazoo's threads and the event loop.

kazoo is threaded: a connection thread talks to the server, a completion thread runs the
callbacks of ``*_async`` results, a callback thread runs watch callbacks. The event loop
must never block on them, and they must never block on the event loop:

* **loop -> kazoo**: requests are handed to one submitter thread per backend through an
  unbounded queue (a put never blocks). Issuing a kazoo request takes kazoo's locks and
  writes a wake-up byte to a socketpair that holds only a few hundred bytes; with
  hundreds of waiters registering at once that write *would* block the loop.
* **kazoo -> loop**: results and watch events are scheduled onto the loop with
  ``loop.call_soon_threadsafe`` (asyncio) or the trio token's ``run_sync_soon``; neither
  blocks the kazoo thread, and neither calls back into kazoo (kazoo #356).

One submitter thread per connection, whatever the number of waiters: a waiter is an
:class:`anyio.Event`, never a thread.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Bridge", "Reply"]

log = logging.getLogger("coord.backends.zookeeper")


class Reply:
    """The outcome of one kazoo request, delivered on the event loop."""

    __slots__ = ("_error", "_event", "_value")

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def settle(self, value: Any, error: BaseException | None) -> None:
        """Record the outcome (on the event loop). Later calls are ignored."""
        if not self._event.is_set():
            self._value, self._error = value, error
            self._event.set()

    async def result(self) -> Any:
        """Wait for the outcome; return the value or raise kazoo's exception.

        A checkpoint. Cancelling it abandons the wait, not the request.
        """
        await self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value


class Bridge:
    """Moves work between the event loop and kazoo's threads without blocking either.

    :meth:`open` on the event loop that will use it; :meth:`close` when done.
    """

    def __init__(self) -> None:
        self._schedule: Callable[[Callable[[], object]], object] | None = None
        self._loop_gone: tuple[type[BaseException], ...] = (RuntimeError,)
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def open(self) -> None:
        """Capture the running event loop and start the submitter thread."""
        try:
            self._schedule = asyncio.get_running_loop().call_soon_threadsafe
        except RuntimeError:  # not asyncio: then trio (anyio's only other event loop)
            import trio

            self._schedule = trio.lowlevel.current_trio_token().run_sync_soon
            self._loop_gone = (trio.RunFinishedError, RuntimeError)
        self._thread = threading.Thread(
            target=self._submit_loop, name="coord-zookeeper-submit", daemon=True
        )
        self._thread.start()

    async def close(self) -> None:
        """Stop the submitter thread once it has run every job already submitted."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(thread.join)

    def to_loop(self, func: Callable[..., object], *args: Any) -> None:
        """Run ``func(*args)`` soon on the event loop. From any thread; never blocks."""
        schedule = self._schedule
        if schedule is None:
            return
        try:
            schedule(functools.partial(func, *args))
        except self._loop_gone:
            pass  # the event loop has finished: nobody is waiting any more

    def submit(self, job: Callable[[], None]) -> None:
        """Run *job* on the submitter thread (it must not block for long). Never blocks."""
        self._jobs.put(job)

    def start(self, request: Callable[[], Any]) -> Reply:
        """Issue a kazoo ``*_async`` call on the submitter thread; return its Reply.

        *request* returns kazoo's ``IAsyncResult``; its outcome is settled on the loop.
        Not a checkpoint.
        """
        reply = Reply()
        self.call(request, reply.settle)
        return reply

    def call(
        self, request: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        """Issue a kazoo ``*_async`` call on the submitter thread; ``done(value, error)``
        is called on the event loop with its outcome. Not a checkpoint."""

        def completed(result: Any) -> None:  # on a kazoo thread (or the submitter)
            if result.successful():
                self.to_loop(done, result.value, None)
            else:
                self.to_loop(done, None, result.exception)

        def job() -> None:
            try:
                request().rawlink(completed)
            except Exception as exc:  # kazoo checks arguments before sending
                self.to_loop(done, None, exc)

        self.submit(job)

    def _submit_loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except Exception:  # pragma: no cover - jobs deliver their own errors
                log.exception("coord: a ZooKeeper submission failed")
