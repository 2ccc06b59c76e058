"""What each shape of claim and ack costs the store, measured with the raw client library.

The queue's rate is bound by CPU (the store's and the clients' share two cores here), so
the designs of docs/design/queue-claims.md are compared here by what the store spends a
job on the writes each design makes, before any of them is built into coord. Each shape
claims and acks *jobs* queued jobs with W tasks in flight over 4 connections (etcd:
aetcd's gRPC stubs on grpc.aio; ZooKeeper: kazoo's async calls), production durability:

* ``floor``: a compare-and-put of the job, then a delete (queue_bench.py's floor);
* ``now``: coord's writes today: the claim is one transaction that puts the job's header
  and creates a claim entry on the worker's lease (ephemeral node); the ack deletes both;
* ``session``: a claim record per session: the claim puts the job's header alone (it
  names the session's entry), the ack deletes the job alone;
* ``now+merged``: ``now``, with each ack and the worker's next claim in one transaction;
* ``session+merged``: ``session``, with each ack and the next claim in one transaction.

For each: jobs/s, the store's CPU a job (its process's, from /proc), the client's CPU a
job (this process: grpc's C core or kazoo's threads, not coord's Python), and requests a
job. Ratios are against ``floor`` in the same run.

    python benchmarks/claim_shapes.py --store etcd --jobs 3000
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import grpc
from _stores import production_server
from aetcd import rpc
from queue_bench import CLIENTS, PAYLOAD, _done, _kazoo

SHAPES = ("floor", "now", "session", "now+merged", "session+merged")
_EQ = rpc.Compare.CompareResult.EQUAL
_VERSION = rpc.Compare.CompareTarget.VERSION


def _put(key: bytes, value: bytes, lease: int = 0) -> Any:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))


def _delete(key: bytes) -> Any:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))


def _version(key: bytes, version: int) -> Any:
    return rpc.Compare(key=key, result=_EQ, target=_VERSION, version=version)


async def etcd_shape(endpoint: str, shape: str, jobs: int, workers: int) -> tuple[float, int]:
    """*shape* on etcd: jobs/s and requests made."""
    channels = [grpc.aio.insecure_channel(endpoint) for _ in range(CLIENTS)]
    stubs = [rpc.KVStub(channel) for channel in channels]
    leases = [
        (await rpc.LeaseStub(channel).LeaseGrant(rpc.LeaseGrantRequest(TTL=60))).ID
        for channel in channels
    ]
    tag = f"{shape}{workers}{time.monotonic_ns()}"
    keys = [f"{tag}/j/{n:08d}".encode() for n in range(jobs)]
    claims = [f"{tag}/c/{n:08d}".encode() for n in range(jobs)]
    sem = asyncio.Semaphore(64)

    async def put(n: int) -> None:
        async with sem:
            await stubs[n % CLIENTS].Put(rpc.PutRequest(key=keys[n], value=PAYLOAD))

    await asyncio.gather(*(put(n) for n in range(jobs)))
    todo = iter(range(jobs))
    requests = [0]
    header = PAYLOAD + b"c"
    with_claim = not shape.startswith(("floor", "session"))

    def claim_ops(n: int, lease: int) -> tuple[list[Any], list[Any]]:
        ops = [_put(keys[n], header)]
        if with_claim:
            ops.append(_put(claims[n], b"me", lease))
        return [_version(keys[n], 1)], ops

    def ack_ops(n: int) -> tuple[list[Any], list[Any]]:
        compare = [_version(keys[n], 2)]
        ops = [_delete(keys[n])]
        if with_claim:
            compare.append(_version(claims[n], 1))
            ops.append(_delete(claims[n]))
        return compare, ops

    async def txn(stub: Any, compare: list[Any], ops: list[Any]) -> None:
        requests[0] += 1
        reply = await stub.Txn(rpc.TxnRequest(compare=compare, success=ops))
        assert reply.succeeded

    async def worker(i: int) -> None:
        stub, lease = stubs[i % CLIENTS], leases[i % CLIENTS]
        if shape == "floor":
            for n in todo:
                await txn(stub, [_version(keys[n], 1)], [_put(keys[n], header)])
                requests[0] += 1
                await stub.DeleteRange(rpc.DeleteRangeRequest(key=keys[n]))
            return
        if not shape.endswith("merged"):
            for n in todo:
                await txn(stub, *claim_ops(n, lease))
                await txn(stub, *ack_ops(n))
            return
        held = next(todo, None)
        if held is None:
            return
        await txn(stub, *claim_ops(held, lease))
        while held is not None:
            after = next(todo, None)
            compare, ops = ack_ops(held)
            if after is not None:
                more_compare, more_ops = claim_ops(after, lease)
                compare, ops = compare + more_compare, ops + more_ops
            await txn(stub, compare, ops)
            held = after

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(workers)))
    took = time.perf_counter() - started
    for channel in channels:
        await channel.close()
    return jobs / took, requests[0]


async def zk_shape(hosts: str, shape: str, jobs: int, workers: int) -> tuple[float, int]:
    """*shape* on ZooKeeper: jobs/s and requests made."""
    clients = [_kazoo(hosts) for _ in range(CLIENTS)]
    try:
        base = f"/{shape.replace('+', '-')}{workers}-{time.monotonic_ns()}"
        clients[0].ensure_path(base + "/j")
        clients[0].ensure_path(base + "/c")
        sem = asyncio.Semaphore(64)

        async def put(n: int) -> str:
            async with sem:
                create = clients[n % CLIENTS].create_async(f"{base}/j/j-", PAYLOAD, sequence=True)
                return str(await _done(create))

        paths = await asyncio.gather(*(put(n) for n in range(jobs)))
        todo = iter(paths)
        requests = [0]
        header = PAYLOAD + b"c"
        with_claim = not shape.startswith(("floor", "session"))

        def claim_ops(tx: Any, path: str) -> None:
            tx.set_data(path, header, version=0)
            if with_claim:
                tx.create(f"{base}/c/{path.rpartition('/')[2]}", b"me", ephemeral=True)

        def ack_ops(tx: Any, path: str) -> None:
            tx.delete(path, version=1)
            if with_claim:
                tx.delete(f"{base}/c/{path.rpartition('/')[2]}")

        async def commit(tx: Any) -> None:
            requests[0] += 1
            results = await _done(tx.commit_async())
            assert not any(isinstance(r, Exception) for r in results), results

        async def worker(client: Any) -> None:
            if shape == "floor":
                for path in todo:
                    requests[0] += 2
                    await _done(client.set_async(path, header, version=0))
                    await _done(client.delete_async(path, version=1))
                return
            if not shape.endswith("merged"):
                for path in todo:
                    tx = client.transaction()
                    claim_ops(tx, path)
                    await commit(tx)
                    tx = client.transaction()
                    ack_ops(tx, path)
                    await commit(tx)
                return
            held = next(todo, None)
            if held is None:
                return
            tx = client.transaction()
            claim_ops(tx, held)
            await commit(tx)
            while held is not None:
                after = next(todo, None)
                tx = client.transaction()
                ack_ops(tx, held)
                if after is not None:
                    claim_ops(tx, after)
                await commit(tx)
                held = after

        started = time.perf_counter()
        await asyncio.gather(*(worker(clients[n % CLIENTS]) for n in range(workers)))
        return jobs / (time.perf_counter() - started), requests[0]
    finally:
        for client in clients:
            client.stop()
            client.close()


async def run(store: str, server: Any, jobs: int, workers: int, rounds: int) -> None:
    results: dict[str, list[tuple[float, float, float, float]]] = {s: [] for s in SHAPES}
    for _ in range(rounds):
        for shape in SHAPES:  # interleaved: the rounds see the same machine
            cpu, store_cpu = time.process_time(), server.cpu_seconds()
            if store == "etcd":
                rate, requests = await etcd_shape(server.endpoint, shape, jobs, workers)
            else:
                rate, requests = await zk_shape(server.endpoint, shape, jobs, workers)
            results[shape].append(
                (
                    rate,
                    (server.cpu_seconds() - store_cpu) / jobs * 1e6,
                    (time.process_time() - cpu) / jobs * 1e6,
                    requests / jobs,
                )
            )
    base = _median([r[0] for r in results["floor"]]), _median([r[1] for r in results["floor"]])
    print(f"{store}, {workers} workers on {CLIENTS} connections, {jobs} jobs, {rounds} rounds:")
    for shape, rows in results.items():
        rate, store_us, client_us, asked = (_median([r[i] for r in rows]) for i in range(4))
        print(
            f"  {shape:15} {rate:7,.0f} jobs/s ({rate / base[0]:.2f} of the floor); "
            f"store CPU {store_us:4.0f} us a job ({store_us / base[1]:.2f}x); "
            f"client CPU {client_us:4.0f} us; {asked:.2f} requests a job"
        )


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["etcd", "zk", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for store in ["etcd", "zk"] if args.store == "both" else [args.store]:
        with production_server(store) as server:
            for workers in args.workers:
                asyncio.run(run(store, server, args.jobs, workers, args.rounds))


if __name__ == "__main__":
    main()
