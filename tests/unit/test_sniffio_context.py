"""A queue handler runs in coord's worker task, in its context. What it does in a thread
it starts with asyncio.to_thread (which copies the context, unlike anyio's to_thread,
which clears sniffio's variable there) must see no event loop there: anyio.run starts.
(997f9e9 told sniffio "asyncio" in coord's own tasks' context, to spare anyio's sniffing
at every call; the handler's thread then saw "asyncio", and anyio.run refused to start
with "Already running asyncio in this thread". Taken out; back in coord's own tasks
since, with the handler run as the worker's starter had it: ``undeclared``.) Under plain
asyncio.run, not anyio.run, which sets the variable itself."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import anyio
import sniffio

import coord
from coord._core.background import declare_asyncio
from coord.testing.pytest_plugin import fresh_namespace

if TYPE_CHECKING:
    import pytest


def test_a_handlers_thread_is_on_no_event_loop() -> None:
    seen: list[object] = []

    def in_thread() -> None:
        try:
            seen.append(sniffio.current_async_library())
        except sniffio.AsyncLibraryNotFoundError:
            seen.append(None)

        async def nested() -> str:
            return "ran"

        try:
            seen.append(anyio.run(nested))
        except RuntimeError as exc:
            seen.append(exc)

    async def main() -> None:
        async with coord.connect(f"memory://{fresh_namespace()}") as client:
            queue = client.queue("q")
            await queue.put(b"x")
            done = asyncio.Event()

            async def handler(job: coord.Job) -> None:
                await asyncio.to_thread(in_thread)
                done.set()

            runner = asyncio.create_task(queue.run(handler, signals=()))
            await asyncio.wait_for(done.wait(), 10)
            runner.cancel()
            try:
                await runner
            except asyncio.CancelledError:
                pass

    asyncio.run(main())
    assert seen == [None, "ran"]


def test_coords_own_tasks_declare_asyncio_and_no_caller_sees_it() -> None:
    """coord's own tasks on asyncio declare it (anyio then need not sniff at every
    Event and CancelScope: 6% of queue.run()'s CPU), in their own context only: the
    caller's task, the handler run in a worker's task, and the user's own work run in
    a session's task (``Session.start_soon``) see what they saw before."""
    seen: dict[str, object] = {}

    async def main() -> None:
        seen["caller before"] = sniffio.current_async_library_cvar.get()
        async with coord.connect(f"memory://{fresh_namespace()}") as client:
            queue = client.queue("q")
            await queue.put(b"x")
            done = asyncio.Event()

            async def handler(job: coord.Job) -> None:
                seen["handler"] = sniffio.current_async_library_cvar.get()
                done.set()

            runner = asyncio.create_task(queue.run(handler, signals=()))
            await asyncio.wait_for(done.wait(), 10)
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner

            finished = anyio.Event()

            async def users() -> None:
                seen["user's task of the session"] = sniffio.current_async_library_cvar.get()
                finished.set()

            client.session.start_soon(users)
            await finished.wait()
        seen["caller after"] = sniffio.current_async_library_cvar.get()

    asyncio.run(main())
    assert seen == {
        "caller before": None,
        "handler": None,
        "user's task of the session": None,
        "caller after": None,
    }


def test_nothing_is_declared_on_trio() -> None:
    async def main() -> object:
        return declare_asyncio()

    assert anyio.run(main, backend="trio") is None


def test_the_lookers_task_declares_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    """The saving itself: the looker's reads run with asyncio declared (an empty
    declare_asyncio would pass every test above)."""
    from coord._jobs.stock import Stock

    seen: list[object] = []
    read = Stock.read

    async def recording(self: Stock, session: object) -> object:
        seen.append(sniffio.current_async_library_cvar.get())
        return await read(self, session)  # type: ignore[arg-type]

    monkeypatch.setattr(Stock, "read", recording)

    async def main() -> None:
        async with coord.connect(f"memory://{fresh_namespace()}") as client:
            queue = client.queue("q")
            await queue.put(b"x")
            async with queue.claim():
                pass

    asyncio.run(main())
    assert seen
    assert set(seen) == {"asyncio"}
