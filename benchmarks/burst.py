"""Load check: N acquires of one mutex started at once, over two clients.

Each registration on ZooKeeper lists the whole queue, so a burst of thousands used to
outlast the TTL-long bound on registering: the late ones failed with BackendUnavailable
and left their keys behind, bound to a live lease. This prints how many acquired, how many
failed, how long the burst took, whether any session was lost, and whether every key was
gone afterwards.

    python benchmarks/burst.py --store zk --waiters 2000
    python benchmarks/burst.py --store etcd --waiters 5000 --ttl 10
"""

from __future__ import annotations

import argparse
import logging
import time

import anyio
from _stores import production_server

import coord
from coord.testing import wait_for_no_waiters

NAME = "burst"


async def burst(url: str, waiters: int, ttl: float) -> None:
    errors: list[str] = []
    acquired = 0
    async with coord.connect(url, ttl=ttl) as a, coord.connect(url, ttl=ttl) as b:
        started = time.monotonic()

        async def waiter(number: int) -> None:
            nonlocal acquired
            try:
                async with (a if number % 2 else b).mutex(NAME):
                    acquired += 1
            except Exception as exc:
                errors.append(repr(exc))

        async with anyio.create_task_group() as tg:
            for number in range(waiters):
                tg.start_soon(waiter, number)
        took = time.monotonic() - started
        lost = a.statistics().sessions_lost + b.statistics().sessions_lost
        print(
            f"{waiters} waiters: {acquired} acquired, {len(errors)} errors, "
            f"{lost} sessions lost, {took:.1f} s ({waiters / took:.0f} acquisitions/s)"
        )
        for error in sorted(set(errors))[:3]:
            print(f"  error: {error}")
        with anyio.move_on_after(30) as scope:
            await wait_for_no_waiters(a, NAME)
        print("keys left: none" if not scope.cancelled_caught else "keys left: SOME (30 s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["etcd", "zk"], default="etcd")
    parser.add_argument("--url", help="an existing store (default: start a throwaway one)")
    parser.add_argument("--waiters", type=int, default=1000)
    parser.add_argument("--ttl", type=float, default=10.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.url:
        anyio.run(burst, args.url, args.waiters, args.ttl, backend="asyncio")
        return
    server = production_server(args.store)
    with server:
        anyio.run(burst, f"{server.url}/bench", args.waiters, args.ttl, backend="asyncio")


if __name__ == "__main__":
    main()
