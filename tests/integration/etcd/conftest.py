"""etcd-only tests: faults that need a real server (restart, SIGSTOP), TLS, auth."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from coord.testing import EtcdServer, ServerTLS, TcpProxy

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # aetcd's gRPC is asyncio-only


@pytest.fixture
def proxy(etcd_server: EtcdServer) -> Iterator[TcpProxy]:
    """A TCP proxy in front of the test's etcd, to cut clients off and let them back."""
    with TcpProxy(etcd_server.client_port) as proxy:
        yield proxy


@pytest.fixture(scope="session")
def tls_etcd(certs: dict[str, str], etcd_server: EtcdServer) -> Iterator[EtcdServer]:
    """An etcd that speaks only TLS and requires client certificates."""
    del etcd_server  # only for the skip/fail policy when etcd is not installed
    tls = ServerTLS(
        certs["ca.pem"],
        certs["server.pem"],
        certs["server.key"],
        client_cert_auth=True,
        client_cert=certs["client.pem"],
        client_key=certs["client.key"],
    )
    with EtcdServer(tls=tls) as server:
        yield server


@pytest.fixture(scope="session")
def auth_etcd(etcd_server: EtcdServer) -> Iterator[EtcdServer]:
    """An etcd with authentication on; simple tokens expire after 2 s without use."""
    del etcd_server
    with EtcdServer(extra_args=["--auth-token=simple", "--auth-token-ttl=2"]) as server:
        yield server
