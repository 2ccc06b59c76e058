"""kazoo's connection chatter is folded into coord's lines: an outage of a few seconds,
in which kazoo retries many times, shows as a handful of lines, not dozens."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
import pytest

import coord
from coord.testing import TcpProxy
from coord.testing.pytest_plugin import fresh_namespace

if TYPE_CHECKING:
    from collections.abc import Iterator

    from coord.testing import ZooKeeperServer

pytestmark = [pytest.mark.anyio, pytest.mark.zookeeper]


@pytest.fixture
def proxy(zookeeper_server: ZooKeeperServer) -> Iterator[TcpProxy]:
    with TcpProxy(zookeeper_server.port) as proxy:
        yield proxy


async def test_an_outage_is_a_few_lines_with_a_count(
    proxy: TcpProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # everything, kazoo's own lines too
    url = f"zk://{proxy.endpoint}/{fresh_namespace()}"
    async with coord.connect(url, ttl=10) as client:
        caplog.clear()
        proxy.refuse()
        proxy.reset()
        await anyio.sleep(5)
        proxy.heal()
        with anyio.fail_after(10):
            await client.session.lease.wait_resumed()  # the same session, back
        assert not client.session.lost
        records = list(caplog.records)
    kazoo = [r for r in records if r.name.startswith("kazoo")]
    failed = [r for r in kazoo if r.getMessage().startswith("Connection dropped")]
    assert len(failed) >= 3, [r.getMessage() for r in kazoo]  # kazoo did retry, quietly:
    assert all(r.levelno == logging.DEBUG for r in failed)
    visible = [f"{r.levelname} {r.getMessage()}" for r in records if r.levelno >= logging.INFO]
    assert len(visible) <= 6, visible
    lost = [line for line in visible if "connection to ZooKeeper" in line and "lost" in line]
    assert lost == [
        f"WARNING coord: connection to ZooKeeper {url} lost "
        f"({failed[0].getMessage().removeprefix('Connection dropped: ')}); retrying"
    ], visible
    back = [line for line in visible if "is back after" in line]
    assert len(back) == 1, visible
    assert f"({len(failed)} failed attempts)" in back[0], (back, len(failed))
