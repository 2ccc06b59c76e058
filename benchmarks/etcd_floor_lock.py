"""The protocol's floor on etcd: a FIFO lock making the same requests per acquisition as
coord's strict mutex (one registration transaction, one watch on the key ahead created
and cancelled, a read when the watch was created after a write, one delete), in as
little Python as the transport allows, with none of coord's guarantees (no fencing check,
no loss detection, no cancellation safety). N contenders over min(N, 8) channels, as in
suite.py; compare its client CPU per acquisition with ``hot_loop.py``'s.

    python benchmarks/etcd_floor_lock.py --contenders 32 --seconds 6 [--transport coord]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
import uuid
from collections import deque
from typing import Any

import grpc
from aetcd import rpc

from coord.backends.etcd._grpc import Channel
from coord.testing import EtcdServer

NOPUT = rpc.WatchCreateRequest.FilterType.Value("NOPUT")
DESCEND = rpc.RangeRequest.SortOrder.Value("DESCEND")
BY_CREATION = rpc.RangeRequest.SortTarget.Value("CREATE")


class Client:
    """One channel, one lease, one watch stream (a reader and a writer task)."""

    def __init__(self, host: str, port: int, transport: str) -> None:
        self.channel: Any = (
            # (an asyncio benchmark: the channel's tasks are plain asyncio tasks)
            Channel(host, port, spawn=lambda f, *a: asyncio.ensure_future(f(*a)))
            if transport == "coord"
            else grpc.aio.insecure_channel(f"{host}:{port}")
        )
        self.kv = rpc.KVStub(self.channel)
        self.ids = itertools.count(1)
        self.created: deque[asyncio.Future[int]] = deque()  # creations sent, in order
        self.gone: dict[int, asyncio.Future[None]] = {}  # watch id -> its deletion
        self.reads = 0
        self.requests: asyncio.Queue[Any] = asyncio.Queue()

    async def start(self) -> None:
        lease = rpc.LeaseStub(self.channel)
        self.lease_id = (await lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=60))).ID
        self.stream = rpc.WatchStub(self.channel).Watch()
        self.tasks = [asyncio.ensure_future(self._read()), asyncio.ensure_future(self._write())]

    async def _write(self) -> None:
        while True:
            await self.stream.write(await self.requests.get())

    async def _read(self) -> None:
        while True:
            reply = await self.stream.read()
            if reply.created:
                created = self.created.popleft()
                if not created.done():
                    created.set_result(reply.header.revision)
            elif reply.events and not reply.canceled:
                gone = self.gone.pop(reply.watch_id, None)
                if gone is not None and not gone.done():
                    gone.set_result(None)

    async def acquire(self, prefix: bytes) -> bytes:
        key = prefix + uuid.uuid4().hex.encode()
        # Mine, and the one created right before it (the range sees the put).
        ahead = rpc.RangeRequest(
            key=prefix,
            range_end=prefix[:-1] + b"0",
            sort_order=DESCEND,
            sort_target=BY_CREATION,
            limit=2,
            keys_only=True,
        )
        put = rpc.PutRequest(key=key, value=b"x", lease=self.lease_id)
        reply = await self.kv.Txn(
            rpc.TxnRequest(
                success=[rpc.RequestOp(request_put=put), rpc.RequestOp(request_range=ahead)]
            )
        )
        kvs = reply.responses[1].response_range.kvs
        if len(kvs) < 2:
            return key
        loop = asyncio.get_running_loop()
        created, gone = loop.create_future(), loop.create_future()
        watch_id = next(self.ids)
        self.gone[watch_id] = gone
        self.created.append(created)
        create = rpc.WatchCreateRequest(key=kvs[1].key, filters=[NOPUT], watch_id=watch_id)
        self.requests.put_nowait(rpc.WatchRequest(create_request=create))
        await asyncio.wait((created, gone), return_when=asyncio.FIRST_COMPLETED)
        if not gone.done() and created.result() > reply.header.revision:
            self.reads += 1  # created after a write: the key ahead may be gone already
            read = await self.kv.Range(rpc.RangeRequest(key=kvs[1].key, count_only=True))
            if not read.count and not gone.done():
                gone.set_result(None)
        await gone
        self.gone.pop(watch_id, None)
        cancel = rpc.WatchCancelRequest(watch_id=watch_id)
        self.requests.put_nowait(rpc.WatchRequest(cancel_request=cancel))
        return key

    async def release(self, key: bytes) -> None:
        await self.kv.DeleteRange(rpc.DeleteRangeRequest(key=key))

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.stream.cancel()
        await self.channel.close()


async def run(host: str, port: int, n: int, seconds: float, transport: str) -> None:
    clients = [Client(host, port, transport) for _ in range(min(n, 8))]
    for client in clients:
        await client.start()
    count = 0
    deadline = time.perf_counter() + seconds

    async def contend(client: Client) -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            key = await client.acquire(b"floor-lock/")
            count += 1
            await client.release(key)

    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(contend(clients[i % len(clients)]) for i in range(n)))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    reads = sum(client.reads for client in clients)
    print(
        f"floor ({transport}), {n} contenders: {count / elapsed:,.0f} acq/s, "
        f"{cpu / count * 1000:.2f} ms CPU/acq, {reads / count:.2f} reads after a late "
        "watch creation per acquisition"
    )
    for client in clients:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contenders", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--transport", choices=["grpc.aio", "coord"], default="grpc.aio")
    args = parser.parse_args()
    with EtcdServer() as server:
        host, port = server.endpoint.rsplit(":", 1)
        asyncio.run(run(host, int(port), args.contenders, args.seconds, args.transport))


if __name__ == "__main__":
    main()
