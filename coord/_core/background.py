"""BackgroundTasks: the tasks a resource owns from its ``async with`` to its close.

A client's session keeper, a session and a backend each run tasks (the keepalive, watch
streams, the renewal of sessions) that must live exactly as long as the resource is open:
a lock held in a block inside the client is only as good as the keepalive behind it. A task
group entered in ``__aenter__`` would put those tasks under every cancel scope around the
``async with``: cancelling an outer scope would stop the keepalive and close the session
while a block inside the client, shielded for its clean-up, still runs and still holds its
lock in its own eyes, and another client would take that lock.

So the tasks run in a task group of their own, inside a shielded scope, in a host task of
a task group entered in ``__aenter__`` (anyio's and httpx's background tasks are built the
same way). The caller's own code stays under the scopes around it: an outer cancellation
still reaches it, but not the tasks, which only :meth:`BackgroundTasks.aclose` stops, when
the resource closes (which happens after every block inside it has left). A task that
crashes still ends the resource's block, as a plain task group would: its error ends the
host task, the outer group cancels the caller's block and raises the error at its exit.
"""

from __future__ import annotations

import asyncio
import contextlib
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine, Iterator

    from anyio.abc import TaskGroup

_library_cvar: ContextVar[str | None] | None
try:
    from sniffio import current_async_library_cvar as _library_cvar
except ImportError:  # (anyio then finds asyncio without sniffing: nothing to declare)
    _library_cvar = None

__all__ = [
    "BackgroundTasks",
    "Endings",
    "asyncio_task",
    "close_on_exit",
    "declare_asyncio",
    "undeclared",
]


def declare_asyncio() -> Token[str | None] | None:
    """In a task of coord's own, started on asyncio: declare asyncio to sniffio, in
    this task's context (and so in the tasks it starts). Returns the token to restore
    the starter's declaration with around user code (:func:`undeclared`); None if
    nothing was declared (not on asyncio, or no sniffio).

    anyio finds its backend through sniffio at every ``Event``, ``CancelScope``,
    ``move_on_after`` and ``current_time``, and on asyncio sniffio learns it by calling
    ``asyncio.current_task()`` each time, unless the library was declared: that
    sniffing was 6% of the client's CPU in ``queue.run()`` (etcd, 32 workers). A task's
    context is its own (a copy of its starter's), so the declaration reaches no caller.
    Only in tasks that run coord's code alone (not in every task of a session:
    ``Session.start_soon`` runs the user's too), or user code under :func:`undeclared`:
    user code that starts a thread with ``asyncio.to_thread`` (which copies the
    context) would find asyncio declared there, and ``anyio.run`` in that thread would
    refuse to start (``tests/unit/test_sniffio_context.py``). A backend's methods run in
    these tasks: a backend of one's own that runs an event loop in a thread it starts
    with the context copied would find asyncio declared there too."""
    if _library_cvar is None or not _on_asyncio():
        return None
    return _library_cvar.set("asyncio")


@contextlib.contextmanager
def undeclared(token: Token[str | None] | None) -> Iterator[None]:
    """Run user code in a task that :func:`declare_asyncio` declared (*token*) with
    sniffio's declaration as the task's starter had it."""
    if token is None or _library_cvar is None:
        yield
        return
    old = token.old_value
    inner = _library_cvar.set(None if old is Token.MISSING else old)
    try:
        yield
    finally:
        _library_cvar.reset(inner)


async def close_on_exit(aclose: Callable[[], Awaitable[None]], error: BaseException | None) -> None:
    """Await ``aclose()`` from an ``__aexit__`` whose block ended with *error*.

    In a cancelled scope the close ends with that scope's cancellation (its tasks are
    waited for, which is a checkpoint). Raised from ``__aexit__`` it would replace the
    block's own error, and the scope would swallow both: so while an error propagates,
    that error goes on instead (the cancellation is still pending in its scope, and is
    raised again at the next checkpoint). Only a scope's: a native asyncio
    ``task.cancel()`` is delivered once, and would be lost.
    """
    try:
        await aclose()
    except anyio.get_cancelled_exc_class():
        if error is None or anyio.current_effective_deadline() != float("-inf"):
            raise


class Endings:
    """Tasks that a close waits for before it goes on (a job's ack out, a claimed job
    being given back, a put out): each counted from when a task group took it to its
    end."""

    def __init__(self) -> None:
        self._count = 0
        self._drains: set[anyio.Event] = set()  # one per wait: each set when none is left

    @property
    def running(self) -> int:
        """How many are running."""
        return self._count

    def start(
        self,
        start_soon: Callable[[Callable[[], Coroutine[Any, Any, None]]], None],
        func: Callable[[], Coroutine[Any, Any, None]],
    ) -> None:
        """Run *func* with *start_soon* (a task group's), counted. Not a checkpoint;
        raises what *start_soon* raises, and then counts nothing."""

        async def run() -> None:
            try:
                await func()
            finally:
                self._count -= 1
                if not self._count:
                    for done in list(self._drains):
                        done.set()

        start_soon(run)
        self._count += 1

    async def wait(
        self,
        given_up: Callable[[], bool] = lambda: False,
        listen: Callable[[Callable[[], None]], Callable[[], None]] | None = None,
    ) -> None:
        """Until none is running, or ``given_up()`` (looked at again whenever *listen*,
        if given, calls back; it returns the function that stops it). Unbounded: the
        caller's scope bounds it. A checkpoint before each look, so that none can start
        between the last look and the caller's next step: one started meanwhile (by a
        task woken with this one) is waited for too."""
        while True:
            await anyio.lowlevel.checkpoint()
            if not self._count or given_up():
                return
            done = anyio.Event()
            self._drains.add(done)
            stop = listen(done.set) if listen is not None else None
            try:
                await done.wait()
            finally:
                if stop is not None:
                    stop()
                self._drains.discard(done)


class BackgroundTasks:
    """A task group shielded from the scopes around the ``async with`` that opened it,
    stopped only by :meth:`aclose`. Enter it (``await tasks.open()``) in the owner's
    ``__aenter__`` and close it in the owner's ``aclose``: scopes nest, so both in the
    same task, and every scope entered in between left first."""

    def __init__(self) -> None:
        self._outer: TaskGroup | None = None
        self._tasks: TaskGroup | None = None
        self._scope: anyio.CancelScope | None = None
        self._native: _NativeTasks | None = None  # asyncio's fast path of start_soon

    async def open(self) -> None:
        """Start the host task. A checkpoint (cancelling it leaves no task behind)."""
        if _on_asyncio():
            self._native = _NativeTasks(self._crashed)
        outer = anyio.create_task_group()
        await outer.__aenter__()
        # The host's scope is made here, not in the host, so that a cancellation of
        # this call can end it whether or not the host has started. (Not tg.start():
        # a cancelled start cancels its task and waits for it, and a shielded host
        # would never end.)
        scope = self._scope = anyio.CancelScope(shield=True)
        ready = anyio.Event()
        try:
            outer.start_soon(self._host, scope, ready)
            await ready.wait()
        except BaseException as exc:
            scope.cancel()
            outer.cancel_scope.cancel()
            await outer.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._outer = outer

    async def _host(self, scope: anyio.CancelScope, ready: anyio.Event) -> None:
        try:
            with scope:
                async with anyio.create_task_group() as tasks:
                    self._tasks = tasks
                    ready.set()
                    await anyio.sleep_forever()  # until aclose() cancels the scope
        except BaseExceptionGroup as group:
            # A task's crash, raised as itself: the outer group wraps it once, as a
            # plain task group in the owner's task did.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        native = self._native
        if native is not None and native.crash is not None:
            native.told = True
            raise native.crash  # a plain task's (see _NativeTasks), as a task group's would be

    def _crashed(self) -> None:
        """A plain task crashed: end the host, which raises its error."""
        if self._tasks is not None:
            self._tasks.cancel_scope.cancel()

    def start_soon(self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Run ``func(*args)`` in a task until :meth:`aclose`. Not a checkpoint."""
        assert self._tasks is not None, "BackgroundTasks.open() first"
        if self._native is not None:
            self._native.start_soon(func, args)
        else:
            self._tasks.start_soon(func, *args)

    async def start(self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
        """Start ``func(*args, task_status=...)`` and return what it passes to
        ``task_status.started()``; its failure before that is raised here (as
        ``TaskGroup.start`` does). A checkpoint."""
        assert self._tasks is not None, "BackgroundTasks.open() first"
        return await self._tasks.start(func, *args)

    async def aclose(self) -> None:
        """Cancel the tasks and wait until they have ended (each task's own clean-up
        runs shielded if it must). Idempotent."""
        outer, self._outer = self._outer, None
        if outer is None:
            return
        assert self._scope is not None
        self._scope.cancel()
        if self._native is not None:
            self._native.cancel()
        try:
            await outer.__aexit__(None, None, None)
        finally:
            if self._native is not None:
                with anyio.CancelScope(shield=True):
                    await self._native.wait()
        # A plain task that crashed after the host ended (in a clean-up while closing)
        # is raised here, one group deep, as the task group's would have been.
        native = self._native
        if native is not None and native.crash is not None and not native.told:
            native.told = True
            raise BaseExceptionGroup("unhandled errors in a TaskGroup", [native.crash])


def asyncio_task() -> asyncio.Task[Any] | None:
    """The asyncio task running this, or None (on trio): no dependency but anyio's and
    the standard library's (sniffio comes with some anyio releases only)."""
    try:
        return asyncio.current_task()
    except RuntimeError:  # no asyncio loop running here
        return None


def _on_asyncio() -> bool:
    """Whether this runs on asyncio (not trio)."""
    return asyncio_task() is not None


class _NativeTasks:
    """The tasks of :meth:`BackgroundTasks.start_soon` on asyncio: plain asyncio tasks,
    a sixth of what an anyio task costs to start (a task, an event and a cancel scope
    more), for the per-request work the session owns (``Session.settle``, ``discard``).

    Each runs in a cancel scope of its own, so that closing cancels it as a task group
    would (again at every checkpoint until it leaves, its shielded clean-ups let run);
    its crash is kept and *crashed* called, which ends the host and raises it."""

    __slots__ = ("_closing", "_crashed", "_scopes", "_tasks", "crash", "told")

    def __init__(self, crashed: Callable[[], None]) -> None:
        self._crashed = crashed
        self._tasks: set[asyncio.Task[None]] = set()
        self._scopes: set[anyio.CancelScope] = set()
        self._closing = False
        self.crash: BaseException | None = None
        self.told = False  # the crash was raised (by the host, or by aclose)

    def start_soon(
        self, func: Callable[..., Coroutine[Any, Any, Any]], args: tuple[Any, ...]
    ) -> None:
        task = asyncio.get_running_loop().create_task(self._run(func, args))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    async def _run(
        self, func: Callable[..., Coroutine[Any, Any, Any]], args: tuple[Any, ...]
    ) -> None:
        with anyio.CancelScope() as scope:
            if self._closing:
                scope.cancel()
            self._scopes.add(scope)
            try:
                await func(*args)
            finally:
                self._scopes.discard(scope)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None and self.crash is None:
            self.crash = error
            self.cancel()
            self._crashed()

    def cancel(self) -> None:
        """Cancel every task, and those started from now on."""
        self._closing = True
        for scope in list(self._scopes):
            scope.cancel()

    async def wait(self) -> None:
        """Until every task has ended."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))
