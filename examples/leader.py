"""Three worker processes elect a leader; the leader is killed; another takes over.

Each worker runs ``election.run(lead, ...)``: it campaigns, and while it leads it does
periodic work, printing its term (the fencing token). This script starts the workers,
waits until one leads, SIGKILLs that leader (no chance to resign: its session must expire
on the store), and measures how long until another worker leads. With ``ttl=2`` that is
about two seconds.

    python examples/leader.py                      # a throwaway local etcd, started here
    python examples/leader.py etcd://10.0.0.1:2379/demo
    python examples/leader.py zk://127.0.0.1:2181/demo
"""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING

import anyio
from anyio.streams.text import TextReceiveStream

import coord

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from anyio.abc import ObjectReceiveStream, ObjectSendStream, Process

WORKERS = 3
TTL = 2.0
TICKS = 3  # the leader's periodic work items before it is killed


async def lead(term: coord.Term) -> None:
    """The leader's job: runs only while leading (cancelled if leadership is lost)."""
    worker = term.value.decode()
    print(f"{worker} leads, term {term.fence}", flush=True)
    for tick in range(1, 1_000_000):
        await anyio.sleep(0.2)
        print(f"{worker} term {term.fence} tick {tick}", flush=True)


async def worker(url: str, name: str) -> None:
    async with coord.connect(url, ttl=TTL) as client:
        await client.election("demo/leader").run(lead, name.encode(), cooldown=0.5)


async def lines(process: Process, send: ObjectSendStream[str]) -> None:
    assert process.stdout is not None
    buffer = ""
    async for chunk in TextReceiveStream(process.stdout):
        buffer += chunk
        *complete, buffer = buffer.split("\n")
        for line in complete:
            await send.send(line)


async def watch_and_kill(receive: ObjectReceiveStream[str], processes: dict[str, Process]) -> None:
    """Print the workers' lines; SIGKILL the first leader after its third tick; return
    once another worker leads."""
    terms: list[int] = []
    killed_at = 0.0
    async for line in receive:
        print(line)
        words = line.split()
        if words[1:2] == ["leads,"]:
            terms.append(int(words[-1]))
            if len(terms) == 2:
                break
        elif line.endswith(f"tick {TICKS}") and len(terms) == 1:
            victim = words[0]
            processes[victim].send_signal(signal.SIGKILL)
            killed_at = anyio.current_time()
            print(f"-- SIGKILL {victim} (pid {processes[victim].pid})")
    took = anyio.current_time() - killed_at
    if terms[1] <= terms[0]:
        raise SystemExit(f"terms did not increase: {terms}")
    print(f"another worker took over in {took:.1f} s (ttl {TTL:g} s): term {terms[1]}")
    if took > TTL + 5:
        raise SystemExit(f"takeover took {took:.1f} s, longer than the TTL + 5 s")


async def main(url: str) -> None:
    await run_workers(__file__, url, WORKERS, watch_and_kill, within=30)


async def run_workers(
    script: str,
    url: str,
    workers: int,
    watch: Callable[[ObjectReceiveStream[str], dict[str, Process]], Awaitable[None]],
    *,
    within: float,
) -> None:
    """Start *workers* processes of *script* (``--worker URL worker-N``), run ``watch``
    on their output lines (within *within* seconds), then stop them all."""
    send, receive = anyio.create_memory_object_stream[str](1000)
    processes: dict[str, Process] = {}
    try:
        async with anyio.create_task_group() as tg:
            for number in range(workers):
                name = f"worker-{number}"
                command = [sys.executable, script, "--worker", url, name]
                processes[name] = await anyio.open_process(command, stderr=None)
                tg.start_soon(lines, processes[name], send)
            with anyio.fail_after(within):
                await watch(receive, processes)
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            for process in processes.values():
                if process.returncode is None:
                    process.terminate()
                await process.aclose()  # waits for it to exit
        send.close()
        receive.close()


def run_worker(url: str, name: str) -> None:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    anyio.run(worker, url, name)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        run_worker(sys.argv[2], sys.argv[3])
        sys.exit(0)
    sys.path.insert(0, os.path.dirname(__file__))
    from mutex_demo import store_url

    with store_url(sys.argv) as store:
        anyio.run(main, store)
