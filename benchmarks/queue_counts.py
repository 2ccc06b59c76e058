"""What one job of ``queue.run()`` costs, counted: the requests, the groups, the claims.

Starts a throwaway server (as production runs it, like ``queue_bench.py``), puts *jobs*
jobs (untimed), then runs ``queue.run()`` with W workers over 4 clients until every job
is acked, and prints, per job:

* the rate, the client's CPU (this process) and the store's (its server's process);
* the backend calls (``transact``, ``entries``, ``get``, ...);
* etcd: the gRPC requests by kind; ZooKeeper: the requests by opcode;
* the group commit (``coord/_jobs/commit.py``): groups sent, by size, and those refused;
* the claims, by path: with an ack (``run()``'s joint transaction: claimed, failed, or
  not sent so, by the state of the looker's stock at the ack), in the looker's own
  rounds, and in a worker's own task, each with those that failed (another looker had
  the job first).

The counts wrap coord's private functions, so this script follows the code it measures:
a count that stays at zero after a change to those functions is a sign to look here.
The counts a job are steadier than rates on a shared machine, whose speed drifts.

    python benchmarks/queue_counts.py --store etcd --workers 32
    python benchmarks/queue_counts.py --store zk --workers 8 --keys 16
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import resource
import time
from typing import Any

import queue_bench
from _stores import production_server

from coord._jobs import commit, looker
from coord.backends.etcd import _connection as etcd_connection
from coord.backends.etcd._backend import EtcdBackend
from coord.backends.zookeeper._backend import ZooKeeperBackend
from coord.backends.zookeeper._wire import _connection as zk_connection

BACKEND_CALLS = ("transact", "entries", "get", "find", "put", "delete", "position")

counts: collections.Counter[str] = collections.Counter()
counting = False


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _count_backend(backend: type[Any]) -> None:
    for name in BACKEND_CALLS:
        original = getattr(backend, name)

        def wrapped(original: Any = original, name: str = name) -> Any:
            async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
                if counting:
                    counts[f"backend.{name}"] += 1
                return await original(self, *args, **kwargs)

            return call

        setattr(backend, name, wrapped())


def _count_requests() -> None:
    call = etcd_connection.Connection.call

    async def etcd_call(self: Any, what: str, *args: Any, **kwargs: Any) -> Any:
        if counting:
            counts[f"etcd.{what}"] += 1
        return await call(self, what, *args, **kwargs)

    etcd_connection.Connection.call = etcd_call  # type: ignore[method-assign]
    submit = zk_connection.Connection.submit

    def zk_submit(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if counting:
            counts[f"zk.{type(request).__name__}"] += 1
        return submit(self, request, *args, **kwargs)

    zk_connection.Connection.submit = zk_submit  # type: ignore[method-assign]


def _count_groups() -> None:
    send = commit.Committer._send

    async def counted(self: Any, group: list[Any]) -> None:
        await send(self, group)
        if counting:
            counts["group.sent"] += 1
            counts[f"group.size{len(group)}"] += 1
            if len(group) > 1 and not group[0].told:
                counts["group.refused"] += 1

    commit.Committer._send = counted  # type: ignore[method-assign]


def _count_claims() -> None:
    claim_all = looker.Looker._claim_all
    ack_and_claim = looker.Looker.ack_and_claim
    claim_own = looker.Looker._claim_own

    async def rounds(self: Any, session: Any, picks: list[Any]) -> None:
        before = self._conflicts
        await claim_all(self, session, picks)
        if counting:
            counts["claim.looker round"] += 1
            counts["claim.looker"] += len(picks)
            counts["claim.looker failed"] += self._conflicts - before

    async def joint(self: Any, session: Any, ack: Any, ended: Any, late: Any) -> Any:
        # The stock's state at the ack: why an ack goes alone.
        stock = self._stock
        state = (
            "being read"
            if self._reading
            else ("fresh" if stock.fresh(session) else "stale")
            + (", workers waiting" if self._waiters else "")
        )
        answer, job = await ack_and_claim(self, session, ack, ended, late)
        if counting:
            if answer == "unsent":
                counts["claim.with ack: none (ack alone)"] += 1
                counts[f"claim.with ack: none, the stock {state}"] += 1
            else:
                counts["claim.with ack" if job is not None else "claim.with ack failed"] += 1
        return answer, job

    async def own(self: Any, *args: Any, **kwargs: Any) -> Any:
        job = await claim_own(self, *args, **kwargs)
        if counting:
            counts["claim.own task"] += 1
            counts["claim.own task failed"] += job is None
        return job

    looker.Looker._claim_all = rounds  # type: ignore[method-assign]
    looker.Looker.ack_and_claim = joint  # type: ignore[method-assign]
    looker.Looker._claim_own = own  # type: ignore[method-assign]


async def measure(server: Any, jobs: int, workers: int, keys: int) -> None:
    global counting
    url = f"{server.url}/counts"
    await queue_bench.queue_puts(url, jobs, "q", keys)
    counting = True
    cpu, store_cpu, started = _cpu(), server.cpu_seconds(), time.perf_counter()
    rate = await queue_bench.run_first(url, "q", jobs, workers)
    counting = False
    client_us = 1e6 * (_cpu() - cpu) / jobs
    store_us = 1e6 * (server.cpu_seconds() - store_cpu) / jobs
    print(
        f"{jobs} jobs, {workers} workers on {queue_bench.CLIENTS} clients, {keys} keys: "
        f"{rate:,.0f} jobs/s ({time.perf_counter() - started:.1f} s); CPU a job: client "
        f"{client_us:.0f} us, store {store_us:.0f} us"
    )
    for name, count in sorted(counts.items()):
        print(f"  {name:56s} {count / jobs:8.3f} a job")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["etcd", "zk"], default="etcd")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--keys", type=int, default=0)
    args = parser.parse_args()
    if args.jobs < 1 or args.workers < 1 or args.keys < 0:
        parser.error("--jobs and --workers must be at least 1, --keys at least 0")
    _count_backend(EtcdBackend if args.store == "etcd" else ZooKeeperBackend)
    _count_requests()
    _count_groups()
    _count_claims()
    server = production_server(args.store)
    with server:
        asyncio.run(measure(server, args.jobs, args.workers, args.keys))


if __name__ == "__main__":
    main()
