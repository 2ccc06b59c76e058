"""Ordered job dispatch: a producer puts jobs with keys, eight workers in three processes
claim them; jobs of one key run one at a time, in put order, different keys in parallel.

The producer (this process) puts 40 jobs for 4 customers, interleaved. Each worker task
loops ``async with queue.claim() as job:``, "works" for a moment, and prints what it did
with the job's fence; a normal exit acks the job. The producer reads the workers' lines
and checks, per customer, that jobs ran in put order and never two at once.

    python examples/dispatch.py                      # a throwaway local etcd, started here
    python examples/dispatch.py zk://127.0.0.1:2181/demo
    python examples/dispatch.py memory://demo         # one process only (memory is local)
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import sys
import time
from typing import TYPE_CHECKING

import anyio
from anyio.streams.text import TextReceiveStream

import coord

if TYPE_CHECKING:
    from collections.abc import Callable

    from anyio.abc import ObjectReceiveStream, ObjectSendStream, Process

QUEUE = "demo/orders"
CUSTOMERS = 4
JOBS = 40
TASKS = {"worker-0": 3, "worker-1": 3, "worker-2": 2}  # 8 workers in 3 processes


def say(line: str) -> None:
    print(line, flush=True)


async def work(client: coord.Client, name: str, report: Callable[[str], None] = say) -> None:
    """One worker task: claim, work, ack (a normal exit), forever."""
    queue = client.queue(QUEUE)
    while True:
        async with queue.claim() as job:
            started = time.monotonic()
            await anyio.sleep(random.uniform(0.01, 0.05))  # the work, fenced by job.fence
            report(
                f"{name} did {job.key} {job.payload.decode()} fence={job.fence} "
                f"{started:.4f} {time.monotonic():.4f}"
            )


async def worker(url: str, name: str, tasks: int) -> None:
    async with coord.connect(url, ttl=5) as client, anyio.create_task_group() as tg:
        for number in range(tasks):
            tg.start_soon(work, client, f"{name}/t{number}")


async def produce(url: str) -> None:
    async with coord.connect(url, ttl=5) as client:
        queue = client.queue(QUEUE)
        for n in range(JOBS):
            customer = f"customer-{n % CUSTOMERS}"
            await queue.put(f"#{n}".encode(), key=customer)
        print(f"put {JOBS} jobs for {CUSTOMERS} customers", flush=True)


def check(done: list[list[str]]) -> None:
    """Per customer: put order, and no two jobs of one customer at once."""
    by_key: dict[str, list[tuple[int, float, float]]] = {}
    for words in done:
        key, number, start, end = words[2], int(words[3][1:]), float(words[5]), float(words[6])
        by_key.setdefault(key, []).append((number, start, end))
    for key, jobs in sorted(by_key.items()):
        jobs.sort(key=lambda job: job[1])
        numbers = [number for number, _, _ in jobs]
        if numbers != sorted(numbers):
            raise SystemExit(f"{key}: out of order: {numbers}")
        for (_, _, end), (_, start, _) in itertools.pairwise(jobs):
            if start < end:
                raise SystemExit(f"{key}: two jobs at once")
        print(f"{key}: {' '.join(f'#{n}' for n in numbers)}")
    print(f"{len(done)} jobs done by 8 workers; per-customer order kept")


async def collect(receive: ObjectReceiveStream[str]) -> list[list[str]]:
    done = []
    async for line in receive:
        words = line.split()
        if words[1:2] == ["did"]:
            done.append(words)
            if len(done) == JOBS:
                return done
    raise SystemExit("the workers stopped early")


async def lines(process: Process, send: ObjectSendStream[str]) -> None:
    assert process.stdout is not None
    buffer = ""
    async for chunk in TextReceiveStream(process.stdout):
        buffer += chunk
        *complete, buffer = buffer.split("\n")
        for line in complete:
            await send.send(line)


async def main(url: str) -> None:
    send, receive = anyio.create_memory_object_stream[str](1000)
    if url.startswith("memory://"):  # one process: the workers are tasks here
        async with coord.connect(url) as client, anyio.create_task_group() as tg:
            for number in range(8):
                tg.start_soon(work, client, f"worker/t{number}", send.send_nowait)
            await produce(url)
            with anyio.fail_after(45):
                check(await collect(receive))
            tg.cancel_scope.cancel()
        return
    processes: list[Process] = []
    try:
        async with anyio.create_task_group() as tg:
            for name, tasks in TASKS.items():
                command = [sys.executable, __file__, "--worker", url, name, str(tasks)]
                processes.append(await anyio.open_process(command, stderr=None))
                tg.start_soon(lines, processes[-1], send)
            await produce(url)
            with anyio.fail_after(45):
                done = await collect(receive)
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            for process in processes:
                if process.returncode is None:
                    process.terminate()
                await process.aclose()
        send.close()
        receive.close()
    check(done)


def run_worker(url: str, name: str, tasks: int) -> None:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    anyio.run(worker, url, name, tasks)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        run_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        sys.exit(0)
    sys.path.insert(0, os.path.dirname(__file__))
    from mutex_demo import store_url

    with store_url(sys.argv) as store:
        anyio.run(main, store)
