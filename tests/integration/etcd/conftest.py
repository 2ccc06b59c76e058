"""etcd-only tests: faults that need a real server (restart, SIGSTOP), TLS, auth."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

import pytest

from coord.testing import EtcdServer, ServerTLS, TcpProxy

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # aetcd's gRPC is asyncio-only


@pytest.fixture
def proxy(etcd_server: EtcdServer) -> Iterator[TcpProxy]:
    """A TCP proxy in front of the test's etcd, to cut clients off and let them back."""
    with TcpProxy(etcd_server.client_port) as proxy:
        yield proxy


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(directory: Path) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (openssl CLI)."""
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-subj",
        "/CN=coord-test-ca",
        cwd=directory,
    )
    for name, ext in [
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "extendedKeyUsage=clientAuth"),
    ]:
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN=coord-{name}",
            cwd=directory,
        )
        (directory / f"{name}.ext").write_text(ext + "\n")
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            f"{name}.pem",
            "-extfile",
            f"{name}.ext",
            cwd=directory,
        )
    return {
        n: str(directory / n)
        for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")
    }


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_certs(tmp_path_factory.mktemp("certs"))


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
