"""A worker process of the slow-replies scenario (``test_slow_replies.py``): one client,
through a proxy that delays the store's replies past a third of the TTL, so that its
sessions are lost and replaced while it works. It runs one recipe for ``--seconds`` and
prints one JSON line per outcome to stdout:

* ``--recipe mutex``: tasks that loop on ``async with client.mutex(...)``; each
  acquisition prints ``{"ok": ...}``, each exception ``{"error": type, "message": ...}``
  (``LockLost`` is an expected outcome of a lost session, reported as such);
* ``--recipe group`` / ``partitioner``: ``Group.run`` / ``Partitioner.run`` in each task
  (a member each), which rejoin until cancelled; each membership or owned partition
  prints ``{"ok": ...}``, and an exception out of ``run`` ``{"error": ...}`` (then the
  process exits 1: a crashed worker).

At the end it prints ``{"done": true}`` and exits 0.

    python _slow_worker.py --url etcd://127.0.0.1:PORT/ns --recipe mutex --seconds 8
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import anyio

import coord

NAME = "slow/replies"


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def error(exc: BaseException) -> None:
    say(error=type(exc).__name__, message=str(exc)[:300])


async def mutex_loop(client: coord.Client, task: int) -> None:
    while True:
        try:
            async with client.mutex(NAME) as hold:
                say(ok="mutex", task=task, fence=hold.fence)
                await anyio.sleep(0.05)
        except coord.LockLost as exc:
            say(lost=type(exc).__name__)
        except Exception as exc:  # a service would go on: so does this one, after saying it
            error(exc)
            await anyio.sleep(0.1)


async def run_recipe(client: coord.Client, recipe: str) -> None:
    async def member(membership: coord.Membership) -> None:
        say(ok="group", fence=membership.fence)
        await anyio.sleep_forever()

    async def work(hold: coord.PartitionHold) -> None:
        say(ok="partition", partition=hold.partition, fence=hold.fence)

    try:
        if recipe == "group":
            await client.group(NAME).run(member, cooldown=0.05)
        else:
            await client.partitioner(NAME, partitions=8).run(work, cooldown=0.05)
    except Exception as exc:
        error(exc)
        raise


async def main(args: argparse.Namespace) -> None:
    async with coord.connect(args.url, ttl=args.ttl) as client:
        with anyio.move_on_after(args.seconds):
            async with anyio.create_task_group() as tg:
                if args.recipe == "mutex":
                    for task in range(args.tasks):
                        tg.start_soon(mutex_loop, client, task)
                else:  # each task a member of its own
                    for _ in range(args.tasks):
                        tg.start_soon(run_recipe, client, args.recipe)
        say(sessions=client.statistics().sessions_opened)
    say(done=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--recipe", choices=["mutex", "group", "partitioner"], required=True)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--tasks", type=int, default=3)
    try:
        anyio.run(main, parser.parse_args(), backend="asyncio")
    except BaseException as exc:  # a crashed worker: said, and exit 1
        error(exc)
        sys.exit(1)
    sys.exit(0)
