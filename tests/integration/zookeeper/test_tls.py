"""ZooKeeper over TLS, against a real server's ``secureClientPort`` that requires client
certificates: locks and elections work on it, digest auth works over it, and each
misconfiguration is one clear error at once: a wrong CA, no client certificate, a plain
client at the TLS port, a TLS client at the plain port."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest
from anyio.streams.tls import TLSAttribute
from kazoo.exceptions import NoAuthError

import coord
from coord.testing.pytest_plugin import fresh_namespace

from ._support import backend_of, raw_client

if TYPE_CHECKING:
    from coord.testing import ZooKeeperServer

pytestmark = [pytest.mark.anyio, pytest.mark.zookeeper]


def _files(certs: dict[str, str], *, ca: str | None = None) -> dict[str, Any]:
    """The options of a client with a certificate the server accepts."""
    return {
        "ca_file": ca or certs["ca.pem"],
        "cert_file": certs["client.pem"],
        "key_file": certs["client.key"],
    }


async def test_a_mutex_and_an_election_over_tls(
    tls_zookeeper: ZooKeeperServer, certs: dict[str, str]
) -> None:
    url = f"zk://{tls_zookeeper.tls_endpoint}/{fresh_namespace()}"
    files = _files(certs)
    async with coord.connect(url, ttl=5, **files) as a, coord.connect(url, ttl=5, **files) as b:
        async with a.mutex("tls") as first:
            with pytest.raises(coord.LockedError):
                await b.mutex("tls").try_acquire()
        async with b.mutex("tls") as second:
            assert second.fence > first.fence
        async with a.election("leader").campaign(b"a") as term:
            leader = await b.election("leader").leader()
            assert leader is not None
            assert leader.value == b"a"
            assert term.fence > 0
        wire = backend_of(a)._conn.client
        assert wire is not None
        connection = wire._session.current
        assert connection is not None
        assert connection._stream.extra(TLSAttribute.tls_version).startswith("TLS")


async def test_digest_auth_over_tls(tls_zookeeper: ZooKeeperServer, certs: dict[str, str]) -> None:
    """The credentials travel inside TLS; the nodes are "creator all" as over plain
    text: a client without them can neither delete them nor queue behind them. Over
    mutual TLS the server also authenticates the connection as the certificate's
    subject (its x509 scheme), and "creator all" names every identity of the creator:
    a client with the same certificate and no credentials may queue."""
    chroot = fresh_namespace()
    where = f"{tls_zookeeper.tls_endpoint}/{chroot}"
    files = _files(certs)
    async with coord.connect(f"zk://alice:secret@{where}", ttl=5, **files) as alice:
        async with alice.mutex("m") as hold:
            async with raw_client(tls_zookeeper.endpoint) as intruder:
                with pytest.raises(NoAuthError):
                    await intruder.delete(f"/{chroot}/{hold.key}")
            plain = f"zk://{tls_zookeeper.endpoint}/{chroot}"
            async with coord.connect(plain, ttl=5) as mallory:
                with pytest.raises(coord.BackendError, match="ACL"):
                    await mallory.mutex("m").try_acquire()
            async with coord.connect(f"zk://{where}", ttl=5, **files) as same_certificate:
                with pytest.raises(coord.LockedError):
                    await same_certificate.mutex("m").try_acquire()
            assert not hold.lost


async def _refused(url: str, **options: Any) -> str:
    """The message of the BackendUnavailable that opening a client raises, at once."""
    started = anyio.current_time()
    with anyio.fail_after(10), pytest.raises(coord.BackendUnavailable) as info:
        async with coord.connect(url, ttl=5, connect_timeout=10, **options):
            pass
    assert anyio.current_time() - started < 3  # not the connect timeout of 10 s
    return str(info.value)


async def test_a_wrong_ca_is_named(
    tls_zookeeper: ZooKeeperServer, certs: dict[str, str], other_certs: dict[str, str]
) -> None:
    files = _files(certs, ca=other_certs["ca.pem"])
    message = await _refused(f"zk://{tls_zookeeper.tls_endpoint}", **files)
    assert message == (
        f"cannot connect to ZooKeeper: {tls_zookeeper.tls_endpoint}: the server's certificate "
        "was not verified (unable to get local issuer certificate; is ca_file the CA that "
        "signed it?)"
    )


async def test_no_client_certificate_is_named(
    tls_zookeeper: ZooKeeperServer, certs: dict[str, str]
) -> None:
    message = await _refused(f"zk://{tls_zookeeper.tls_endpoint}", ca_file=certs["ca.pem"])
    assert message.startswith(
        f"cannot connect to ZooKeeper: {tls_zookeeper.tls_endpoint}: the server refused the "
        "TLS connection ("
    )
    assert message.endswith("does it want a client certificate it trusts (cert_file=, key_file=)?")


async def test_a_plain_client_at_the_tls_port(tls_zookeeper: ZooKeeperServer) -> None:
    message = await _refused(f"zk://{tls_zookeeper.tls_endpoint}")
    assert message == (
        f"cannot connect to ZooKeeper: {tls_zookeeper.tls_endpoint} does not speak the "
        "ZooKeeper protocol in plain text (it expects TLS: give ca_file=, or tls=True)"
    )


async def test_a_tls_client_at_the_plain_port(
    tls_zookeeper: ZooKeeperServer, certs: dict[str, str]
) -> None:
    message = await _refused(f"zk://{tls_zookeeper.endpoint}", **_files(certs))
    assert message == (
        f"cannot connect to ZooKeeper: {tls_zookeeper.endpoint} does not speak TLS (it "
        "speaks the ZooKeeper protocol in plain text: leave out the TLS options)"
    )


def test_tls_options_are_checked_at_the_call(certs: dict[str, str]) -> None:
    with pytest.raises(coord.ConfigurationError, match="together"):
        coord.connect("zk://127.0.0.1:2281", cert_file=certs["client.pem"])
    with pytest.raises(TypeError, match="path"):
        coord.connect("zk://127.0.0.1:2281", ca_file=42)
    with pytest.raises(TypeError, match="tls"):
        coord.connect("zk://127.0.0.1:2281", tls="yes")
    with pytest.raises(coord.ConfigurationError, match="cannot read TLS file"):
        coord.connect("zk://127.0.0.1:2281", ca_file="/nonexistent/ca.pem")
    client = coord.connect("zk://127.0.0.1:2281", tls=True)
    assert backend_of(client)._options.tls is not None
    assert backend_of(coord.connect("zk://127.0.0.1:2181"))._options.tls is None
