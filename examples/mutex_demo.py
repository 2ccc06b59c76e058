"""Several workers, each with its own client (its own session), contend for one mutex.

Every worker prints when it holds the lock and with which fencing token. The fences
strictly increase from holder to holder, and holders follow the order in which they
queued.

    python examples/mutex_demo.py                 # a throwaway local etcd, started here
    python examples/mutex_demo.py etcd://10.0.0.1:2379/demo
    COORD_URL=memory:// python examples/mutex_demo.py
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from typing import TYPE_CHECKING

import anyio

import coord

if TYPE_CHECKING:
    from collections.abc import Iterator

WORKERS = 4
ROUNDS = 3


async def worker(url: str, number: int, log: list[int]) -> None:
    async with coord.connect(url, ttl=5) as client:
        for _ in range(ROUNDS):
            async with client.mutex("demo/printer") as hold:
                print(f"worker {number} holds demo/printer with fence {hold.fence}")
                log.append(hold.fence)
                await anyio.sleep(0.02)  # the protected work


async def main(url: str) -> None:
    log: list[int] = []
    async with anyio.create_task_group() as tg:
        for number in range(WORKERS):
            tg.start_soon(worker, url, number, log)
    if any(a >= b for a, b in itertools.pairwise(log)):
        raise SystemExit(f"fences did not strictly increase: {log}")
    print(f"{len(log)} acquisitions, fences strictly increasing: {log[0]} .. {log[-1]}")


@contextlib.contextmanager
def store_url(argv: list[str]) -> Iterator[str]:
    """The URL given, or COORD_URL, or a throwaway etcd started for the demo."""
    url = argv[1] if len(argv) > 1 else os.environ.get("COORD_URL")
    if url:
        yield url
        return
    from coord.testing import EtcdServer

    with EtcdServer() as etcd:
        print(f"started a throwaway etcd at {etcd.endpoint}")
        yield etcd.url + "/demo"


if __name__ == "__main__":
    with store_url(sys.argv) as url:
        anyio.run(main, url)
