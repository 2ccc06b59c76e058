"""A client with no namespace (``etcd://host:port``) sees the whole keyspace, as a user
running ``coord dev`` then ``coord status`` does."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

import coord

if TYPE_CHECKING:
    from coord.testing import EtcdServer

pytestmark = [pytest.mark.anyio, pytest.mark.etcd]


async def test_names_at_the_root(etcd_server: EtcdServer) -> None:
    name = f"root-{uuid.uuid4().hex[:8]}/demo"
    async with coord.connect(etcd_server.url) as a, coord.connect(etcd_server.url) as b:
        async with a.mutex(name):
            assert name in await b.backend.names()
            assert await b.backend.names(name.split("/")[0]) == [name]
        assert name not in await b.backend.names()


async def test_names_skips_keys_that_are_not_text(etcd_server: EtcdServer) -> None:
    """Found by review: one binary key anywhere in a shared keyspace made ``coord status``
    fail with a UnicodeDecodeError."""
    from aetcd import rpc

    name = f"root-{uuid.uuid4().hex[:8]}/bin"
    binary = f"{name}-\udcff".encode("utf-8", "surrogateescape")
    async with coord.connect(etcd_server.url) as client:
        conn = client.backend._conn  # type: ignore[attr-defined]
        put = rpc.PutRequest(key=binary + b"/@x", value=b"")
        await conn.call("put", lambda c: c.kv.Put, put)
        async with client.mutex(name):
            assert name in await client.backend.names()
