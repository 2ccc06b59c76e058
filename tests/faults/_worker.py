"""A worker of the fault suite: one process, ONE client for its whole life (a service
never rebuilds its client to recover: the client must outlive its sessions), and T
tasks that loop::

    async with client.mutex(NAME) as hold:
        ENTER; value = READ; await a little; WRITE value + 1 with hold.fence; EXIT

or, with ``--recipe election``, campaign in one election and, while leading, do the same
three times per term (``term.fence`` as the fence), then resign; a leader whose term is
lost is cancelled and gets ``coord.LeadershipLost``, a LockLost.

With ``--recipe queue`` each task claims a job of one queue instead (every job has the
same key, so one runs at a time, ``job.fence`` as the fence), reports ``JOB`` with the
job's id and seq inside the body, and ``ACKED`` once the block exited normally (the ack
was accepted); a worker whose claim is lost gets ``coord.ClaimLost``, a LockLost. The
odd-numbered tasks claim as ``queue.run()``'s workers do: each ack's transaction also
claims the key's next job, which the task's next claim takes. With
``--role producer`` the process puts jobs instead, keeping a few ahead of the acks, and
reports each ``PUT`` once it returned.

reporting every step to the fenced store. ``coord.LockLost`` is reported as LOST, any
other exception as ERROR (then the task goes on, as a service would). SIGTERM closes
the client and exits 0. SIGUSR1 writes a diagnosis to stderr (the worker's log): the
client's session and statistics, the mutex's entries as the store lists them, and the
stack of every task; the harness asks for it when a worker does not make progress.

    python _worker.py --url etcd://... --store 127.0.0.1:PORT --proc p0 --tasks 2 --ttl 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

import coord
from coord._core import keys as _keys
from coord._jobs.queue import Claiming
from coord._jobs.worker import Carry

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

NAME = "faults/counter"


class StoreClient:
    """One connection to the fenced store; a request and its reply are never split by a
    cancellation (they are shielded), so the connection never loses its place."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self._stream = stream
        self._buffer = b""

    async def ask(self, *words: object) -> str:
        with anyio.CancelScope(shield=True):
            await self._stream.send((" ".join(map(str, words)) + "\n").encode())
            while b"\n" not in self._buffer:
                self._buffer += await self._stream.receive()
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()


async def connect_store(endpoint: str) -> StoreClient:
    host, _, port = endpoint.rpartition(":")
    return StoreClient(await anyio.connect_tcp(host, int(port)))


async def loop(client: coord.Client, store: StoreClient, proc: str, task: str, recipe: str) -> None:
    # Half of a queue's tasks claim as queue.run()'s workers do: the ack's transaction
    # claims the task's next job (its key's next one), carried to its next claim.
    carry = Carry(lambda: True) if recipe == "queue" and int(task[1:]) % 2 else None
    while True:
        fence = 0
        holding: AbstractAsyncContextManager[coord.Hold | coord.Job]
        try:
            if recipe == "election":
                holding = client.election(NAME).campaign(f"{proc}/{task}".encode())
            elif recipe == "queue":
                queue = client.queue(NAME)
                holding = Claiming(queue, carry) if carry is not None else queue.claim()
            elif recipe == "cohort":  # the tasks of a process hand the lock on locally
                holding = client.mutex(NAME, local_handoff=2)
            else:
                holding = client.mutex(NAME)
            async with holding as hold:
                fence = hold.fence
                await store.ask("ENTER", proc, task, fence)
                for _ in range(3 if recipe == "election" else 1):
                    value = int(await store.ask("READ", proc, task, fence))
                    await anyio.sleep(random.uniform(0.005, 0.03))
                    await store.ask("WRITE", proc, task, fence, value + 1)
                if isinstance(hold, coord.Job):
                    await store.ask("JOB", proc, task, fence, hold.seq, hold.id)
                await store.ask("EXIT", proc, task, fence)
            if isinstance(hold, coord.Job):
                await store.ask("ACKED", proc, task, fence, hold.seq, hold.id)
        except coord.ClaimLost as exc:  # what became of its ending, as the store said
            await store.ask("LOST", proc, task, fence, 0, exc.outcome.replace(" ", "_"))
        except coord.LockLost:
            await store.ask("LOST", proc, task, fence)
        except Exception as exc:  # a service retries
            await store.ask(
                "ERROR", proc, task, type(exc).__name__, str(exc)[:200].replace("\n", " ")
            )
            await anyio.sleep(0.1)


def _awaiting(coro: Any) -> list[str]:
    """Where a suspended coroutine waits, outermost first (``Task.get_stack`` shows one
    frame only: it does not follow ``cr_await``)."""
    lines = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        frame = frame or getattr(coro, "gi_frame", None)
        if frame is not None:
            code = frame.f_code
            lines.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
        inner = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
        coro = inner or getattr(coro, "gi_yieldfrom", None)
    return lines


async def diagnose(client: coord.Client, proc: str) -> None:
    """Write what a person debugging a stuck worker wants to see, to stderr."""
    out = sys.stderr
    print(f"=== {proc} diagnosis at {time.monotonic():.3f}", file=out)
    try:
        session = client.session
        print(f"session lease {session.lease.id:#x} lost={session.lease.lost}", file=out)
    except Exception as exc:
        print(f"no session: {exc!r}", file=out)
    print(f"statistics: {client.statistics()}", file=out)
    try:
        with anyio.fail_after(2):
            listing = await client.backend.entries(_keys.prefix_of(NAME))
        print(f"entries at revision {listing.revision}:", file=out)
        for entry in listing.entries:
            print(f"  {entry.key} rev={entry.revision} lease={entry.lease:#x}", file=out)
    except Exception as exc:
        print(f"listing failed: {exc!r}", file=out)
    for task in asyncio.all_tasks():
        print(f"--- task {task.get_name()}", file=out)
        for line in _awaiting(task.get_coro()):
            print(f"    {line}", file=out)
    out.flush()


async def produce(client: coord.Client, store: StoreClient, proc: str, ttl: float) -> None:
    """Keep a few jobs ahead of the acks (the store counts them). Each job has an id of
    its own (``job_id``), and a put that did not end done is repeated with the same id
    until it does: a repeat queues nothing more, so every job is queued once and
    reported once (the checks hold the producer to it). Every other put that takes
    longer than the TTL (the producer cut off) is cancelled, and repeated too: a
    cancelled put's job is withdrawn, or found by the repeat."""
    queue = client.queue(NAME)
    put = 0
    while True:
        acked = int(await store.ask("ACKS", proc, "-", 0))
        while put < acked + 4:
            job_id = f"{proc}-{put}"
            ref = None
            try:
                # Every other put waits for its outcome (OutcomeUnknown, if cut off).
                with anyio.move_on_after(ttl if put % 2 else math.inf):
                    ref = await queue.put(f"job {put}".encode(), key="k", job_id=job_id)
            except coord.CoordError as exc:
                await store.ask("ERROR", proc, "producer", type(exc).__name__, str(exc)[:100])
                await anyio.sleep(0.2)
                continue
            if ref is None:
                await store.ask("ERROR", proc, "producer", "Cancelled", f"put {job_id}")
                await anyio.sleep(0.2)
                continue
            assert ref.id == job_id, ref
            await store.ask("PUT", proc, "producer", 0, ref.seq, ref.id)
            put += 1
        await anyio.sleep(0.05)  # a test harness may poll its own store


async def main(args: argparse.Namespace) -> None:
    options: dict[str, Any] = json.loads(args.options)
    hello = await connect_store(args.store)
    await hello.ask("HELLO", args.proc, os.getpid())
    async with coord.connect(args.url, ttl=args.ttl, **options) as client:
        async with anyio.create_task_group() as tg:
            if args.role == "producer":
                store = await connect_store(args.store)
                tg.start_soon(produce, client, store, args.proc, args.ttl)
            for number in range(args.tasks if args.role == "worker" else 0):
                store = await connect_store(args.store)
                tg.start_soon(loop, client, store, args.proc, f"t{number}", args.recipe)
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGUSR1) as signals:
                async for received in signals:
                    if received == signal.SIGUSR1:
                        tg.start_soon(diagnose, client, args.proc)
                        continue
                    tg.cancel_scope.cancel()
                    break


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--proc", required=True)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--options", default="{}")
    recipes = ["mutex", "cohort", "election", "queue"]
    parser.add_argument("--recipe", choices=recipes, default="mutex")
    parser.add_argument("--role", choices=["worker", "producer"], default="worker")
    anyio.run(main, parser.parse_args(), backend="asyncio")
    sys.exit(0)
