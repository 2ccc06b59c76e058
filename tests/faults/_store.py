"""The fenced store: the protected resource of the fault suite (Jepsen's lock workload).

A TCP server on 127.0.0.1, on a thread of its own (it serves whatever the test's event
loop is doing), with one integer counter. A write is accepted only if its fence is at
least the highest fence seen so far: a holder that was paused or cut off, and writes
after another holder took over, is rejected. Every request is an event of the history,
time-stamped and serialized by the store, which the checks read afterwards.

One request per line, one reply per line::

    HELLO <proc> <pid>              -> OK
    ENTER <proc> <task> <fence> [<key>] -> OK      (entered the body of async with;
                                                    the key of the hold or the term)
    READ  <proc> <task> <fence>     -> <counter>
    WRITE <proc> <task> <fence> <v> -> OK | REJECTED
    EXIT  <proc> <task> <fence>     -> OK          (leaving the body, still inside)
    LOST  <proc> <task> <fence>     -> OK          (async with raised LockLost)
    ERROR <proc> <task> <kind>      -> OK          (any other exception)
    JOB   <proc> <task> <fence> <seq> <id> -> OK   (queue: the job being worked on)
    ACKED <proc> <task> <fence> <seq> <id> -> OK   (queue: its ack was accepted)
    PUT   <proc> <task> 0 <seq> <id>       -> OK   (queue: a put returned)
    ACKS  <proc> <task> 0           -> <number of ACKED so far>
    OWN    <proc> <partition> <fence>        -> OK   (partitioner: entered owner.partition(p))
    PWRITE <proc> <partition> <fence>        -> OK | REJECTED  (fenced per partition)
    DROP   <proc> <partition> <fence> <why>  -> OK   (leaving owner.partition(p): "lost"
                                                     or "ended", still inside it)
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

__all__ = ["Event", "FencedStore"]


@dataclass(frozen=True)
class Event:
    """One request, as the store saw it."""

    at: float  # time.monotonic() when the store handled it
    kind: str
    proc: str
    task: str = ""
    fence: int = 0
    value: int = 0
    accepted: bool = True
    detail: str = ""


@dataclass
class FencedStore:
    """See the module docstring. Start with :meth:`start`, stop with :meth:`close`."""

    counter: int = 0
    highest_fence: int = 0
    partition_fences: dict[str, int] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    port: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _started: threading.Event = field(default_factory=threading.Event)
    _stop: asyncio.Event | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FencedStore:
        self._thread = threading.Thread(target=self._run, name="fenced-store", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the fenced store did not start")
        return self

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def snapshot(self) -> list[Event]:
        """The history so far (a copy: safe to read while the store runs)."""
        with self._lock:
            return list(self.events)

    # -- the store's own thread -----------------------------------------------------------

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._started.set()
        async with server:
            await self._stop.wait()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                writer.write(self._handle(line.decode().split()).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def _handle(self, words: list[str]) -> str:
        kind, proc, *rest = words
        now = time.monotonic()
        with self._lock:
            if kind == "HELLO":
                self.events.append(Event(now, kind, proc, detail=rest[0]))
                return "OK"
            if kind == "ERROR":
                self.events.append(Event(now, kind, proc, rest[0], detail=" ".join(rest[1:])))
                return "OK"
            task, fence = rest[0], int(rest[1])
            if kind == "ACKS":
                return str(sum(e.kind == "ACKED" for e in self.events))
            if kind in ("JOB", "ACKED", "PUT"):
                self.events.append(Event(now, kind, proc, task, fence, int(rest[2]), True, rest[3]))
                return "OK"
            if kind == "READ":
                self.events.append(Event(now, kind, proc, task, fence, self.counter))
                return str(self.counter)
            if kind == "PWRITE":  # fenced per partition (the task field)
                accepted = fence >= self.partition_fences.get(task, 0)
                if accepted:
                    self.partition_fences[task] = fence
                self.events.append(Event(now, kind, proc, task, fence, 0, accepted))
                return "OK" if accepted else "REJECTED"
            if kind == "DROP":
                self.events.append(Event(now, kind, proc, task, fence, detail=rest[2]))
                return "OK"
            if kind == "WRITE":
                value = int(rest[2])
                accepted = fence >= self.highest_fence
                if accepted:
                    self.highest_fence, self.counter = fence, value
                self.events.append(Event(now, kind, proc, task, fence, value, accepted))
                return "OK" if accepted else "REJECTED"
            if kind == "ENTER" and len(rest) > 2:  # with the hold's key
                self.events.append(Event(now, kind, proc, task, fence, detail=rest[2]))
                return "OK"
            if kind == "LOST" and len(rest) > 3:  # a ClaimLost's outcome
                self.events.append(Event(now, kind, proc, task, fence, detail=rest[3]))
                return "OK"
            self.events.append(Event(now, kind, proc, task, fence))  # ENTER, EXIT, LOST
            return "OK"
