"""Running a fault scenario: worker processes, the fenced store, waiting, checking.

A test harness, not library code: it waits by polling the store's history (every 50
ms), which a test may do; the library itself never polls.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

import coord
from coord._jobs.records import decode
from coord.testing import wait_for_no_waiters

from . import _checks
from ._store import FencedStore
from ._worker import NAME

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._store import Event

__all__ = ["FaultRun", "Worker"]

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_worker.py")


@dataclass
class Worker:
    proc: str
    url: str
    popen: subprocess.Popen[bytes]
    log: Path
    killed: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, sig: signal.Signals) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class FaultRun:
    """Workers looping on one mutex (or campaigning in one election) through one fenced
    store, and the checks.

    :param ttl: every worker's session TTL
    :param tasks: tasks per worker
    :param recipe: ``"mutex"``, ``"cohort"`` (a mutex with ``local_handoff=2``),
        ``"election"`` (each term is a hold) or ``"queue"`` (each claim is a hold)
    :param layout: the workers' layout of mutexes and elections (``connect(layout=)``)
    """

    directory: Path
    ttl: float = 2.0
    tasks: int = 2
    recipe: str = "mutex"
    layout: str = "coord"
    options: dict[str, Any] = field(default_factory=dict)
    store: FencedStore = field(default_factory=FencedStore)
    workers: dict[str, Worker] = field(default_factory=dict)
    producers: dict[str, Worker] = field(default_factory=dict)
    stopped_at: float | None = None

    def __post_init__(self) -> None:
        self.store.start()

    # -- workers --------------------------------------------------------------------------

    def spawn(self, proc: str, url: str, *, role: str = "worker") -> Worker:
        log = self.directory / f"{proc}.log"
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        command = [
            sys.executable,
            str(WORKER),
            f"--url={url}",
            f"--store={self.store.endpoint}",
            f"--proc={proc}",
            f"--tasks={self.tasks}",
            f"--ttl={self.ttl}",
            f"--recipe={self.recipe}",
            f"--options={json.dumps(self.options)}",
            f"--layout={self.layout}",
            f"--role={role}",
        ]
        with log.open("ab") as out:
            popen = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        worker = Worker(proc, url, popen, log)
        (self.producers if role == "producer" else self.workers)[proc] = worker
        return worker

    def kill(self, proc: str) -> None:
        worker = self.workers[proc]
        worker.signal(signal.SIGKILL)
        worker.popen.wait(10)
        worker.killed = True

    def alive(self) -> list[str]:
        return [p for p, w in self.workers.items() if not w.killed and w.popen.poll() is None]

    async def stop(self) -> None:
        """SIGTERM every worker (they close their clients), SIGKILL stragglers."""
        self.stopped_at = time.monotonic()
        everyone = [*self.producers.values(), *self.workers.values()]
        for worker in everyone:
            worker.signal(signal.SIGCONT)
            worker.signal(signal.SIGTERM)
        for worker in everyone:
            try:
                await anyio.to_thread.run_sync(worker.popen.wait, 15)
            except subprocess.TimeoutExpired:
                worker.signal(signal.SIGKILL)
                await anyio.to_thread.run_sync(worker.popen.wait, 10)

    def close(self) -> None:
        for worker in [*self.producers.values(), *self.workers.values()]:
            if worker.popen.poll() is None:
                worker.signal(signal.SIGCONT)
                worker.signal(signal.SIGKILL)
                worker.popen.wait(10)
        self.store.close()

    # -- observing ------------------------------------------------------------------------

    def events(self) -> list[Event]:
        """The history, up to the moment the workers were told to stop."""
        events = self.store.snapshot()
        if self.stopped_at is not None:
            events = [e for e in events if e.at < self.stopped_at]
        return events

    def holds(self) -> list[_checks.Hold]:
        killed = [p for p, w in self.workers.items() if w.killed]
        return _checks.holds(self.events(), killed)

    def holder(self) -> _checks.Hold | None:
        """The hold open right now (entered, neither exited nor lost), if any."""
        open_holds = [h for h in self.holds() if h.exited is None and not h.lost]
        return open_holds[-1] if open_holds else None

    async def until(self, what: str, predicate: Callable[[], Any], within: float) -> Any:
        """Until ``predicate()`` is true (polled: the history lives in another thread)."""
        with anyio.move_on_after(within):
            while not (result := predicate()):  # noqa: ASYNC110
                await anyio.sleep(0.05)
            return result
        await self.diagnose()
        raise AssertionError(f"not within {within:g}s: {what}\n{self.report(tail=150)}")

    async def diagnose(self) -> None:
        """Ask every running worker to write its diagnosis (session, entries, task
        stacks) to its log; a paused worker cannot, and says nothing."""
        for proc in self.alive():
            self.workers[proc].signal(signal.SIGUSR1)
        await anyio.sleep(3)  # the listing in it is bounded by 2 s

    async def wait_for_holder(self, proc: str | None = None, within: float = 20) -> _checks.Hold:
        """Until a process (*proc*, if given) holds the lock; returns its hold."""

        def found() -> _checks.Hold | None:
            hold = self.holder()
            return hold if hold is not None and proc in (None, hold.proc) else None

        result: _checks.Hold = await self.until(f"{proc or 'someone'} holds", found, within)
        return result

    async def steady(self, acquisitions: int = 5, within: float = 30) -> None:
        """Until every live worker has acquired at least *acquisitions* times."""

        def enough() -> bool:
            counts = dict.fromkeys(self.alive(), 0)
            for hold in self.holds():
                if hold.proc in counts:
                    counts[hold.proc] += 1
            return all(n >= acquisitions for n in counts.values())

        await self.until(f"every worker acquires {acquisitions} times", enough, within)

    async def everyone_acquires_after(
        self, since: float, within: float, *, procs: list[str] | None = None
    ) -> None:
        """Every live worker (of *procs*) enters a hold after *since*, within *within*
        seconds of it."""
        deadline = since + within

        def done() -> bool:
            events = self.events()
            wanted = procs if procs is not None else self.alive()
            return all(_checks.acquired_after(events, p, since) for p in wanted)

        await self.until(
            f"{procs or 'every live worker'} acquire(s) again within {within:g}s of {since:.3f}",
            done,
            max(deadline - time.monotonic(), 0.1),
        )

    # -- checks ---------------------------------------------------------------------------

    def check(self) -> int:
        """The safety checks over the whole history; returns the accepted writes."""
        all_holds = self.holds()
        writes = _checks.check_no_lost_update(self.events())
        _checks.check_fences_increase(all_holds)
        _checks.check_no_overlap(all_holds)
        return writes

    async def check_no_keys_left(self, url: str) -> None:
        """Once every worker has stopped: no waiter key is left (a killed worker's keys
        go with its lease, at most a TTL later)."""
        async with coord.connect(url, ttl=self.ttl) as client:
            with anyio.fail_after(self.ttl + 10):
                if self.recipe != "queue":
                    await wait_for_no_waiters(client, NAME)
                    return
                await wait_for_no_waiters(client, f"{NAME}/_idle")
                await wait_for_no_waiters(client, f"{NAME}/_claims")
                jobs = await client.backend.entries(f"{NAME}/_jobs/")
        remaining = {decode(e)[0].id for e in jobs.entries}
        try:
            acks = _checks.check_queue(self.store.snapshot(), remaining)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.report()}") from None
        assert acks > 0

    def report(self, tail: int = 30) -> str:
        events = self.store.snapshot()
        lines = [f"{len(events)} events; last ones:"]
        lines += [
            f"  {e.at:.3f} {e.kind} {e.proc}/{e.task} fence={e.fence} value={e.value}"
            f"{'' if e.accepted else ' REJECTED'} {e.detail}"
            for e in events[-25:]
        ]
        errors = [e for e in events if e.kind == "ERROR"]
        if errors:
            lines.append(f"{len(errors)} errors, first: {errors[0].proc} {errors[0].detail}")
        for worker in [*self.producers.values(), *self.workers.values()]:
            lines.append(f"--- {worker.proc} (pid {worker.pid}) log tail:\n{worker.tail(tail)}")
        return "\n".join(lines)
