"""Integration tests run on asyncio unless they choose (aiokafka is asyncio-only; the
etcd and ZooKeeper tests choose their loops in their conftests). Certificates for the
TLS tests of both stores."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


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
    """A CA, and a server and a client certificate it signed (PEM paths by name)."""
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def other_certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Another CA and its certificates: trusted by no test server."""
    return make_certs(tmp_path_factory.mktemp("other-certs"))
