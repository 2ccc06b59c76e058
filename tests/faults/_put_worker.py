"""A producer of the put fault scenario (issue 36, item 1): one process, one client,
whose connection to the store delays every reply (the test's TcpProxy).

For each id it puts the job with that ``job_id`` and cancels the put 0.1 s after its
transaction was sent (before the delayed reply comes): with ``anyio.fail_after``, or
natively with ``asyncio.timeout``. It prints ``CANCELLED <id>`` (or ``PUT <id>`` if the
put returned first). With ``--repeat``, it then puts the ids named there again 50 ms
later, through a second ``client.queue()`` object of the same name, and prints
``REPEATED <id>``. After the last id it stays up for ``--linger`` seconds, so that the
client's withdrawals run, prints ``DONE`` and closes the client.

    python _put_worker.py --url etcd://... --ids r0,w0 --cancel native --repeat r0
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import anyio

import coord
from coord.abc import Create

NAME = "putfaults"


def say(line: str) -> None:
    print(line, flush=True)


async def _put(queue: coord.Queue, job_id: str, sent: anyio.Event, cancel: str) -> None:
    """Put *job_id*, cancelled 0.1 s after *sent* is set (its transaction sent)."""
    try:
        if cancel == "anyio":
            with anyio.fail_after(30) as scope:
                async with anyio.create_task_group() as tg:

                    async def arm() -> None:
                        await sent.wait()
                        scope.deadline = anyio.current_time() + 0.1

                    tg.start_soon(arm)
                    await queue.put(b"x", job_id=job_id)
                    tg.cancel_scope.cancel()
        else:
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(None) as timeout:

                async def arm_native() -> None:
                    await sent.wait()
                    timeout.reschedule(loop.time() + 0.1)

                armed = asyncio.create_task(arm_native())
                try:
                    await queue.put(b"x", job_id=job_id)
                finally:
                    armed.cancel()
    except TimeoutError:
        say(f"CANCELLED {job_id}")
    else:
        say(f"PUT {job_id}")


async def main(url: str, ids: list[str], cancel: str, repeat: set[str], linger: float) -> None:
    async with coord.connect(url) as client:
        queue = client.queue(NAME)
        transact = client.backend.transact
        sent = anyio.Event()

        async def watched(ops: Any) -> Any:
            if any(isinstance(op, Create) and op.prefix.endswith("/_jobs/") for op in ops):
                sent.set()
            return await transact(ops)

        client.backend.transact = watched  # type: ignore[method-assign]
        for job_id in ids:
            sent = anyio.Event()
            await _put(queue, job_id, sent, cancel)
            if job_id in repeat:
                await anyio.sleep(0.05)
                again = await client.queue(NAME).put(b"x", job_id=job_id)
                say(f"REPEATED {again.id}")
        await anyio.sleep(linger)
        say("DONE")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--ids", required=True)
    parser.add_argument("--cancel", choices=["anyio", "native"], default="anyio")
    parser.add_argument("--repeat", default="")
    parser.add_argument("--linger", type=float, default=3.0)
    args = parser.parse_args()
    ids = args.ids.split(",")
    repeat = set(filter(None, args.repeat.split(",")))
    asyncio.run(main(args.url, ids, args.cancel, repeat, args.linger))
