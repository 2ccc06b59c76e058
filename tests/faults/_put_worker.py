"""A producer of the put fault scenario (issue 36, item 1): one process, one client,
whose connection to the store delays every reply (the test's TcpProxy).

For each id it puts the job with that ``job_id`` and cancels the put 0.1 s after its
transaction was sent (before the delayed reply comes): with ``anyio.fail_after``, or
natively with ``asyncio.timeout``. It prints ``CANCELLED <id>`` (or ``PUT <id>`` if the
put returned first). With ``--repeat``, it then puts the ids named there again 50 ms
later, through a second ``client.queue()`` object of the same name, and prints
``REPEATED <id>``. After the last id it waits until the client's withdrawals have ended
— one scheduled for each cancelled put, each run to its end (the test reads the store
after them) — and prints ``WITHDRAWN <n>`` (none scheduled that did not end); at most
``--linger`` seconds, after which it goes on without that line. Then it prints ``DONE``
and closes the client.

    python _put_worker.py --url etcd://... --ids r0,w0 --cancel native --repeat r0
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import anyio

import coord
from coord._jobs.put import Putter
from coord.abc import Create

NAME = "putfaults"


def say(line: str) -> None:
    print(line, flush=True)


class Withdrawals:
    """The client's withdrawals of cancelled puts (``Putter._withdraw_soon``, which spawns
    ``Putter._withdraw`` in a task of the client): how many were scheduled, how many ran
    to their end. There is no public way to wait for them: this worker's own process
    wraps the two methods."""

    def __init__(self) -> None:
        self.scheduled = 0
        self.ended = 0
        self._changed = anyio.Event()
        soon, withdraw = Putter._withdraw_soon, Putter._withdraw
        watch = self

        def _withdraw_soon(putter: Putter, *args: Any) -> None:
            watch.scheduled += 1
            watch._changed.set()
            soon(putter, *args)

        async def _withdraw(putter: Putter, *args: Any) -> None:
            try:
                await withdraw(putter, *args)
            finally:
                watch.ended += 1
                watch._changed.set()

        Putter._withdraw_soon = _withdraw_soon  # type: ignore[method-assign,assignment]
        Putter._withdraw = _withdraw  # type: ignore[method-assign,assignment]

    async def wait(self, count: int) -> None:
        """Until *count* withdrawals were scheduled and every one scheduled has ended."""
        while self.scheduled < count or self.ended < self.scheduled:
            await self._changed.wait()
            self._changed = anyio.Event()


async def _put(queue: coord.Queue, job_id: str, sent: anyio.Event, cancel: str) -> bool:
    """Put *job_id*, cancelled 0.1 s after *sent* is set (its transaction sent); whether
    it was cancelled."""
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
        return True
    say(f"PUT {job_id}")
    return False


async def main(url: str, ids: list[str], cancel: str, repeat: set[str], linger: float) -> None:
    withdrawals = Withdrawals()
    async with coord.connect(url) as client:
        queue = client.queue(NAME)
        transact = client.backend.transact
        sent = anyio.Event()

        async def watched(ops: Any) -> Any:
            if any(isinstance(op, Create) and op.prefix.endswith("/_jobs/") for op in ops):
                sent.set()
            return await transact(ops)

        client.backend.transact = watched  # type: ignore[method-assign]
        cancelled = 0
        for job_id in ids:
            sent = anyio.Event()
            cancelled += await _put(queue, job_id, sent, cancel)
            if job_id in repeat:
                await anyio.sleep(0.05)
                again = await client.queue(NAME).put(b"x", job_id=job_id)
                say(f"REPEATED {again.id}")
        # Each cancelled put's transaction made its job (only replies are delayed): the
        # client withdraws each, once its reply has come.
        with anyio.move_on_after(linger):
            await withdrawals.wait(cancelled)
            say(f"WITHDRAWN {withdrawals.ended}")
        say("DONE")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--ids", required=True)
    parser.add_argument("--cancel", choices=["anyio", "native"], default="anyio")
    parser.add_argument("--repeat", default="")
    parser.add_argument("--linger", type=float, default=10.0)
    args = parser.parse_args()
    ids = args.ids.split(",")
    repeat = set(filter(None, args.repeat.split(",")))
    asyncio.run(main(args.url, ids, args.cancel, repeat, args.linger))
