"""Digest auth and ACLs: with credentials, coord's nodes are "creator all", so another
user of the ensemble can neither delete them nor queue behind them."""

from __future__ import annotations

import logging

import pytest
from kazoo.exceptions import NoAuthError
from kazoo.security import CREATOR_ALL_ACL, make_digest_acl

import coord
from coord.testing import ZooKeeperServer, drop_key
from coord.testing.pytest_plugin import fresh_namespace

from ._support import backend_of, raw_client

pytestmark = [pytest.mark.anyio, pytest.mark.zookeeper]


async def test_another_user_cannot_delete_our_node(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    chroot = zookeeper_url.rsplit("/", 1)[1]
    alice_url = f"zk://alice:secret@{zookeeper_server.endpoint}/{chroot}"
    async with coord.connect(alice_url, ttl=5) as alice, alice.mutex("guarded") as hold:
        path = f"/{chroot}/{hold.key}"
        for auth in ((), [("digest", "mallory:guess")]):
            async with raw_client(zookeeper_server.endpoint, auth) as intruder:
                with pytest.raises(NoAuthError):
                    await intruder.delete(path)
                with pytest.raises(NoAuthError):  # nor read it, nor queue behind it
                    await intruder.get_children(f"/{chroot}/guarded")
        # Through coord, a client without the credentials gets a clear error.
        async with coord.connect(zookeeper_url, ttl=5) as mallory:
            with pytest.raises(coord.BackendError, match="ACL"):
                await drop_key(mallory, hold.key)
            with pytest.raises(coord.BackendError, match="ACL"):
                await mallory.mutex("guarded").try_acquire()
        assert not hold.lost
        # Another client of the same user may (the ACL names the user, not the session).
        async with coord.connect(zookeeper_url, ttl=5, auth=("alice", "secret")) as again:
            assert [e.key for e in (await again.backend.entries("guarded/")).entries] == [hold.key]


async def test_an_explicit_acl(zookeeper_server: ZooKeeperServer) -> None:
    chroot = fresh_namespace()
    acl = [make_digest_acl("alice", "secret", all=True), make_digest_acl("bob", "pw", read=True)]
    url = f"zk://{zookeeper_server.endpoint}/{chroot}"
    async with coord.connect(url, ttl=5, auth=("alice", "secret"), acl=acl) as alice:
        mutex = alice.mutex("shared")
        hold = await mutex.acquire()
        async with raw_client(zookeeper_server.endpoint, [("digest", "bob:pw")]) as bob:
            path = f"/{chroot}/{hold.key}"
            _, stat = await bob.get_data(path)  # bob may read
            assert stat.czxid << 16 == hold.fence  # the fence: czxid << 16 | seq
            with pytest.raises(NoAuthError):
                await bob.delete(path)
        await mutex.release()


def test_options_are_checked_at_the_call() -> None:
    with pytest.raises(coord.ConfigurationError, match="unknown ZooKeeper option"):
        coord.connect("zk://127.0.0.1:2181", request_timeout=5)  # etcd's
    with pytest.raises(TypeError, match="auth must be"):
        coord.connect("zk://127.0.0.1:2181", auth="alice:secret")
    with pytest.raises(coord.ConfigurationError, match="not both"):
        coord.connect("zk://alice:secret@127.0.0.1:2181", auth=("bob", "pw"))
    with pytest.raises(TypeError, match="acl"):
        coord.connect("zk://127.0.0.1:2181", acl=["world:anyone"])
    with pytest.raises(coord.ConfigurationError, match="needs auth"):
        coord.connect("zk://127.0.0.1:2181", acl=CREATOR_ALL_ACL)
    with pytest.raises(TypeError, match="suspended_is_lost"):
        coord.connect("zk://127.0.0.1:2181", suspended_is_lost="yes")
    with pytest.raises(coord.ConfigurationError, match="connect_timeout"):
        coord.connect("zk://127.0.0.1:2181", connect_timeout=0)
    client = coord.connect("zk://alice:s%40cret@127.0.0.1:2181/app", suspended_is_lost=False)
    assert backend_of(client)._options.auth_data == (("digest", "alice:s@cret"),)
    assert not backend_of(client).suspended_is_lost


async def test_the_password_is_never_logged(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by review: kazoo's DEBUG line per request sent showed the Auth packet, with
    the digest password in clear. The wire client logs no request; nothing at DEBUG
    shows the password either."""
    chroot = zookeeper_url.rsplit("/", 1)[1]
    caplog.set_level(logging.DEBUG)
    url = f"zk://alice:s3cret-pw@{zookeeper_server.endpoint}/{chroot}"
    async with coord.connect(url, ttl=5) as client, client.mutex("logged"):
        pass
    debug = [r for r in caplog.records if r.name.startswith("coord.backends.zookeeper")]
    assert any(r.levelno == logging.DEBUG for r in debug), "no DEBUG line: this proves nothing"
    assert all("s3cret-pw" not in r.getMessage() for r in caplog.records)
