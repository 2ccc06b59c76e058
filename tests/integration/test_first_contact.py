"""The first connection to a store: a server of the other kind is named at once, and only
the first connection is bounded by ``connect_timeout`` (a client that lives through an
outage longer than that carries on)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

import coord
from coord.testing import TcpProxy
from coord.testing.pytest_plugin import fresh_namespace

if TYPE_CHECKING:
    from collections.abc import Iterator

    from coord.testing import EtcdServer, KafkaBroker, ZooKeeperServer

pytestmark = pytest.mark.anyio

_SCHEMES = [
    pytest.param("etcd", marks=pytest.mark.etcd),
    pytest.param("zk", marks=pytest.mark.zookeeper),
]


@pytest.fixture
def proxy(request: pytest.FixtureRequest, scheme: str) -> Iterator[TcpProxy]:
    """A proxy in front of the test session's server for *scheme* (both started and
    stopped outside the event loop)."""
    server: EtcdServer | ZooKeeperServer = request.getfixturevalue(
        "etcd_server" if scheme == "etcd" else "zookeeper_server"
    )
    with TcpProxy(int(server.endpoint.rpartition(":")[2])) as proxy:
        yield proxy


@pytest.mark.etcd
@pytest.mark.zookeeper
async def test_a_server_of_the_other_kind_is_named_within_2s(
    etcd_server: EtcdServer, zookeeper_server: ZooKeeperServer
) -> None:
    """Named at first contact (about 0.5 s here), not after the connect wait of 30 s.
    (The CLI's test allows more: it starts an interpreter.)"""
    cases = [
        (
            f"zk://{etcd_server.endpoint}",
            "the ZooKeeper protocol",
            "an HTTP/2 (gRPC) server: etcd?",
        ),
        (
            f"etcd://{zookeeper_server.endpoint}",
            "etcd's protocol (gRPC over HTTP/2)",
            "a ZooKeeper server",
        ),
    ]
    for url, protocol, found in cases:
        started = anyio.current_time()
        with pytest.raises(coord.BackendUnavailable) as info:
            async with coord.connect(f"{url}/x", ttl=5, connect_timeout=30):
                pass
        assert anyio.current_time() - started < 2, url
        endpoint = url.partition("://")[2]
        assert str(info.value) == (
            f"cannot connect to {'ZooKeeper' if url.startswith('zk') else 'etcd'}: "
            f"{endpoint} does not speak {protocol} (it answers as {found})"
        )


@pytest.mark.kafka
@pytest.mark.parametrize("scheme", ["etcd", "zk"])
async def test_a_kafka_broker_is_named_within_2s(scheme: str, kafka_broker: KafkaBroker) -> None:
    """A Kafka broker reads either store's opening as the length of a request of over a
    gigabyte and waits for the rest, silent: the probe asks it in Kafka's protocol
    meanwhile (it waited the whole connect timeout, 30 s here)."""
    started = anyio.current_time()
    with pytest.raises(coord.BackendUnavailable, match="it answers as a Kafka broker"):
        async with coord.connect(f"{scheme}://{kafka_broker.bootstrap}/x", connect_timeout=30):
            pass
    assert anyio.current_time() - started < 2


@pytest.mark.parametrize("scheme", _SCHEMES)
@pytest.mark.timeout(40)
async def test_a_client_outlives_an_outage_longer_than_its_connect_timeout(
    proxy: TcpProxy, scheme: str
) -> None:
    url = f"{scheme}://{proxy.endpoint}/{fresh_namespace()}"
    async with coord.connect(url, ttl=2, connect_timeout=0.5) as client:
        first = client.session
        proxy.blackhole()  # connections are accepted, and nothing gets through
        await first.wait_lost()
        await anyio.sleep(3)  # six connect timeouts
        proxy.heal()
        with anyio.fail_after(15):
            async with client.mutex("after") as hold:
                assert client.session is not first
                assert hold.fence > 0


@pytest.mark.etcd
async def test_tls_to_a_plain_etcd_fails_at_once(etcd_server: EtcdServer) -> None:
    # (TLS to an etcd that speaks it: tests/integration/etcd/test_security.py; both ways
    # on ZooKeeper: tests/integration/zookeeper/test_tls.py.)
    started = anyio.current_time()
    with pytest.raises(coord.BackendUnavailable) as info:
        async with coord.connect(etcd_server.url, tls=True, connect_timeout=10):
            pass
    assert anyio.current_time() - started < 2
    assert str(info.value) == (
        f"cannot connect to etcd: {etcd_server.endpoint} does not speak TLS (it speaks "
        "etcd's protocol (gRPC over HTTP/2) in plain text: leave out the TLS options)"
    )
