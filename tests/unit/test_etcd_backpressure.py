"""The etcd transport's receive window against a real etcd: a stream's window is given
back as its reader takes the replies, so a watch nobody reads holds at most a window and
a message, not everything the server has to say; and once read, everything arrives (no
window left closed for good)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest
from aetcd import rpc

from coord.backends.etcd._connection import stream_read, stream_write
from coord.backends.etcd._grpc import Channel

from ._etcd_loops import transport_loops

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from coord.testing import EtcdServer

pytestmark = pytest.mark.anyio

WINDOW = 256 * 1024
VALUE = 64 * 1024
PUTS = 40  # 2.5 MiB of events: ten windows


anyio_backend = transport_loops()


async def test_a_watch_nobody_reads_holds_at_most_a_window(
    tasks: TaskGroup, etcd_server: EtcdServer
) -> None:
    host, port = etcd_server.endpoint.rsplit(":", 1)
    watcher = Channel(host, int(port), stream_window=WINDOW, spawn=tasks.start_soon)
    writer = Channel(host, int(port), spawn=tasks.start_soon)
    try:
        call = rpc.WatchStub(watcher).Watch()
        create = rpc.WatchCreateRequest(key=b"bp/", range_end=b"bp0")
        await stream_write(call, rpc.WatchRequest(create_request=create))
        with anyio.fail_after(5):
            assert (await stream_read(call)).created
        kv = rpc.KVStub(writer)
        for i in range(PUTS):
            await kv.Put(rpc.PutRequest(key=b"bp/%d" % i, value=b"x" * VALUE), timeout=5)
        await anyio.sleep(0.5)  # the server sends what the window lets it
        unread = sum(len(reply) for reply in call._replies)
        assert 0 < unread <= WINDOW + 2 * VALUE
        events = 0
        with anyio.fail_after(10):
            while events < PUTS:
                events += len((await stream_read(call)).events)
        assert events == PUTS
    finally:
        await watcher.close()
        await writer.close()


def test_a_window_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="stream_window"):
        Channel("127.0.0.1", 1, stream_window=2**31)
