"""Client CPU of one unary call through the etcd transport with no socket and no server:
the request is encoded and "sent" to a transport that drops it, and a recorded reply
(HEADERS, DATA, trailers, its header blocks indexed as etcd's are after the first) is fed
to the connection. What is left is the transport's own work per call, without the
network's noise; ``hot_loop.py`` measures whole contended acquisitions on a real etcd.

    python benchmarks/etcd_transport_cpu.py [--calls 20000] [--rounds 7] [--timeout 10]
        [--loop asyncio|trio] [--generic]

``--generic`` runs asyncio on the generic anyio path (``_grpc/_runtime.py``) instead of
its fast path; ``--timeout`` gives each call a deadline (a timer set and cancelled), as
coord's calls always have.
"""

from __future__ import annotations

import argparse
import time

import anyio
import hpack
from aetcd import rpc

from coord.backends.etcd._grpc import Channel, _runtime
from coord.backends.etcd._grpc._connection import _Connection


class _Sink:
    """A pipe that drops what it is given."""

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def _h2(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + sid.to_bytes(4, "big") + payload


async def _best(calls: int, rounds: int, deadline: float | None) -> float:
    async with anyio.create_task_group() as tg:
        channel = Channel("127.0.0.1", 1, spawn=tg.start_soon)
        try:
            best = await _rounds(channel, calls, rounds, deadline)
        finally:
            channel.timers.close()
    return best


async def _rounds(channel: Channel, calls: int, rounds: int, deadline: float | None) -> float:
    conn = _Connection(channel)
    conn.connection_made(_Sink())
    channel._conn = conn
    channel._live.add(conn)
    encoder = hpack.Encoder()
    body = rpc.RangeResponse(header=rpc.ResponseHeader(revision=5)).SerializeToString()
    message = b"\0" + len(body).to_bytes(4, "big") + body
    blocks = []
    for _ in range(2):  # the second time, the fields are indexed
        head = encoder.encode([(b":status", b"200"), (b"content-type", b"application/grpc")])
        tail = encoder.encode([(b"grpc-status", b"0"), (b"grpc-message", b"")])
        blocks.append((head, tail))
    kv = rpc.KVStub(channel)
    best = float("inf")
    for round_ in range(rounds):
        started = time.process_time()
        for i in range(calls):
            call = kv.Range(rpc.RangeRequest(key=b"a/b"), timeout=deadline)
            sid = conn._next_id - 2
            head, tail = blocks[0 if round_ == i == 0 else 1]
            reply = _h2(1, 4, sid, head) + _h2(0, 0, sid, message) + _h2(1, 5, sid, tail)
            conn.data_received(reply)
            await call
        best = min(best, (time.process_time() - started) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--loop", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--generic", action="store_true", help="asyncio without its fast path")
    args = parser.parse_args()
    _runtime.fast_path = not args.generic
    best = anyio.run(_best, args.calls, args.rounds, args.timeout, backend=args.loop)
    path = "generic" if args.generic or args.loop != "asyncio" else "fast path"
    print(
        f"{best * 1e6:.2f} us client CPU per unary call on {args.loop} ({path}), "
        f"timeout {args.timeout} (best of {args.rounds} rounds)"
    )


if __name__ == "__main__":
    main()
