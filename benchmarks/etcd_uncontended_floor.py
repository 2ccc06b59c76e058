"""Where an uncontended acquire+release of coord's Mutex on etcd spends its time: the
protocol's two transactions against two raw round trips, and coord's code on top.

Three loops on one throwaway server and one transport (coord's own), in alternating
blocks (the machines are noisy), each a median of its blocks:

* raw: a Put and a DeleteRange of one key, no lease (suite.py's yardstick);
* protocol: the requests coord sends for one idle cycle, from a minimal loop: the
  registration on an idle tail (compare the tail; put it and the waiter key, lease-bound;
  the failure branch's reads) and the release of the first and newest waiter
  (``drop_ops``: the key, the tail made idle, the links), with none of coord's code;
* coord: ``client.mutex(name)`` acquire and release.

protocol / raw is what the key layout costs the store and the wire; coord / protocol is
what coord's code adds (its CPU: the recipe, the hold, the registrar, the messages).

    python benchmarks/etcd_uncontended_floor.py [--blocks 9] [--rounds 60]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import TYPE_CHECKING, Any

import anyio
from aetcd import rpc

import coord
from coord.backends.etcd._grpc import Channel
from coord.backends.etcd._kv import _EQUAL, _MOD
from coord.backends.etcd._waitqueue import drop_ops, order_key, range_op, tail_key, tail_value
from coord.testing import EtcdServer

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

#: A waiter's value as coord writes it (its size matters a little).
VALUE = b'{"host":"bench","pid":4242,"since":1795778129.804}'


def _put(key: bytes, value: bytes, lease: int) -> Any:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))


async def main(url: str, host: str, port: int, blocks: int, rounds: int) -> None:
    channel = await Channel(host, port).__aenter__()  # (its tasks, until __aexit__)
    kv = rpc.KVStub(channel)
    lease = (await rpc.LeaseStub(channel).LeaseGrant(rpc.LeaseGrantRequest(TTL=60))).ID
    pk = f"floor-{uuid.uuid4().hex[:6]}/".encode()
    tail = tail_key(pk)
    made = await kv.Put(rpc.PutRequest(key=tail, value=tail_value(1, idle=True), lease=lease))
    state = {"n": 1, "mod": made.header.revision}

    async def raw() -> None:
        await kv.Put(rpc.PutRequest(key=b"raw", value=b""), timeout=10)
        await kv.DeleteRange(rpc.DeleteRangeRequest(key=b"raw"), timeout=10)

    async def protocol() -> None:
        n = state["n"] + 1
        key = order_key(pk, n) + b"@w" + uuid.uuid4().hex.encode()
        register = rpc.TxnRequest(
            compare=[rpc.Compare(key=tail, target=_MOD, mod_revision=state["mod"], result=_EQUAL)],
            success=[_put(tail, tail_value(n), lease), _put(key, VALUE, lease)],
            failure=[range_op(tail), range_op(key)],
        )
        reply = await kv.Txn(register, timeout=10)
        assert reply.succeeded
        release = rpc.TxnRequest(success=drop_ops(key, n, first=True))
        reply = await kv.Txn(release, timeout=10)
        assert reply.responses[1].response_txn.succeeded  # the tail made idle
        state.update(n=n, mod=reply.header.revision)

    async with coord.connect(url, ttl=30) as client:
        mutex = client.mutex(f"m{uuid.uuid4().hex[:6]}")

        async def mine() -> None:
            await mutex.acquire()
            await mutex.release()

        loops: dict[str, Callable[[], Awaitable[None]]] = {
            "raw": raw,
            "protocol": protocol,
            "coord": mine,
        }
        times: dict[str, list[float]] = {name: [] for name in loops}
        cpus: dict[str, list[float]] = {name: [] for name in loops}
        for loop in loops.values():  # warm up
            for _ in range(20):
                await loop()
        for _ in range(blocks):
            for name, loop in loops.items():
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(rounds):
                    await loop()
                times[name].append((time.perf_counter() - t0) / rounds * 1e6)
                cpus[name].append((time.process_time() - c0) / rounds * 1e6)
    await channel.__aexit__(None, None, None)
    median = {name: statistics.median(t) for name, t in times.items()}
    for name in loops:
        print(
            f"{name:>9}: {median[name]:6.0f} us per cycle, "
            f"{statistics.median(cpus[name]):4.0f} us client CPU, "
            f"{median[name] / median['raw']:.2f}x raw"
        )
    print(
        f"protocol / raw {median['protocol'] / median['raw']:.2f}x; "
        f"coord / protocol {median['coord'] / median['protocol']:.2f}x"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    with EtcdServer() as server:
        host, port = server.endpoint.rsplit(":", 1)
        anyio.run(main, server.url + "/floor", host, int(port), args.blocks, args.rounds)
