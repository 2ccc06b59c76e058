"""TLS (with client certificates) and user/password authentication against real etcd."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from aetcd import rpc

import coord
from coord.backends.etcd._grpc import Channel
from coord.testing import EtcdServer, server_wakeups, wait_for_waiters
from coord.testing.pytest_plugin import fresh_namespace

from ._handoff import etcd_of

pytestmark = [pytest.mark.anyio, pytest.mark.etcd]


async def test_tls_with_client_certificate(tls_etcd: EtcdServer, certs: dict[str, str]) -> None:
    url = f"{tls_etcd.url}/{fresh_namespace()}"
    files: dict[str, Any] = {
        "ca_file": certs["ca.pem"],
        "cert_file": certs["client.pem"],
        "key_file": certs["client.key"],
    }
    async with coord.connect(url, ttl=5, **files) as a, coord.connect(url, ttl=5, **files) as b:
        async with a.mutex("tls") as first:
            pass
        async with b.mutex("tls") as second:
            assert second.fence > first.fence
        channels = [etcd_of(client)._conn._channel for client in (a, b)]
        connections = [conn for channel in channels if channel for conn in channel._live]
    # Closed, not closing: a TLS transport says goodbye first, and one still closing when
    # the event loop ends leaves its socket open (a ResourceWarning in a later test).
    assert connections
    assert all(connection.shut.is_set() for connection in connections)


async def test_tls_refused_without_client_certificate(
    tls_etcd: EtcdServer, certs: dict[str, str]
) -> None:
    with anyio.fail_after(10), pytest.raises(coord.BackendError):
        async with coord.connect(tls_etcd.url, ca_file=certs["ca.pem"], request_timeout=1):
            pass


async def test_plaintext_client_cannot_talk_to_tls_server(tls_etcd: EtcdServer) -> None:
    with anyio.fail_after(10), pytest.raises(coord.BackendError):
        async with coord.connect(tls_etcd.url, request_timeout=1):
            pass


def test_tls_options_are_checked_at_the_call() -> None:
    with pytest.raises(coord.ConfigurationError, match="together"):
        coord.connect("etcd://127.0.0.1:2379", cert_file="client.pem")
    with pytest.raises(TypeError, match="path"):
        coord.connect("etcd://127.0.0.1:2379", ca_file=42)
    with pytest.raises(coord.ConfigurationError, match="unknown etcd option"):
        coord.connect("etcd://127.0.0.1:2379", cafile="ca.pem")
    with pytest.raises(coord.ConfigurationError, match="request_timeout"):
        coord.connect("etcd://127.0.0.1:2379", request_timeout=0)


async def test_missing_tls_file_is_refused_at_the_call() -> None:
    with pytest.raises(coord.ConfigurationError, match="cannot read TLS file"):
        coord.connect("etcd://127.0.0.1:2379", ca_file="/nonexistent/ca.pem")
    with pytest.raises(coord.ConfigurationError, match="not a regular file"):
        coord.connect("etcd://127.0.0.1:2379", ca_file="/")


async def _enable_auth(server: EtcdServer, password: str) -> None:
    host, port = server.endpoint.rsplit(":", 1)
    async with Channel(host, int(port)) as channel:  # (coord's own: on any event loop)
        auth = rpc.AuthStub(channel)
        await auth.RoleAdd(rpc.AuthRoleAddRequest(name="root"), timeout=5)
        await auth.UserAdd(rpc.AuthUserAddRequest(name="root", password=password), timeout=5)
        grant = rpc.AuthUserGrantRoleRequest(user="root", role="root")
        await auth.UserGrantRole(grant, timeout=5)
        await auth.AuthEnable(rpc.AuthEnableRequest(), timeout=5)


@pytest.fixture
async def auth_url(auth_etcd: EtcdServer) -> str:
    if not getattr(auth_etcd, "_auth_enabled", False):
        await _enable_auth(auth_etcd, "s3cr%t")
        auth_etcd._auth_enabled = True  # type: ignore[attr-defined]
    return f"etcd://root:s3cr%25t@{auth_etcd.endpoint}/{fresh_namespace()}"


async def test_user_and_password(auth_url: str) -> None:
    async with coord.connect(auth_url, ttl=5) as a, coord.connect(auth_url, ttl=5) as b:
        async with a.mutex("auth"):
            with pytest.raises(coord.LockedError):
                await b.mutex("auth").try_acquire()


async def test_expired_token_is_renewed(auth_url: str) -> None:
    # The server forgets a simple token after 2 s without use (--auth-token-ttl=2).
    async with coord.connect(auth_url, ttl=30) as client:
        await anyio.sleep(3)
        async with client.mutex("token") as hold:
            assert hold.fence > 0


async def test_wrong_password_fails_at_connect(auth_url: str) -> None:
    bad = auth_url.replace("s3cr%25t", "wrong")
    with anyio.fail_after(10), pytest.raises(coord.BackendError, match="authenticate"):
        async with coord.connect(bad):
            pass


async def test_streams_reauthenticate_after_restart(auth_etcd: EtcdServer, auth_url: str) -> None:
    """Simple tokens live in the server's memory: after a restart every stream must log in
    again, or the waiter's resumed watch and the keepalive would fail forever."""
    async with coord.connect(auth_url, ttl=10) as a, coord.connect(auth_url, ttl=10) as b:
        holder = a.mutex("auth-restart")
        await holder.acquire()
        async with anyio.create_task_group() as tg:
            got = anyio.Event()

            async def waiter() -> None:
                async with b.mutex("auth-restart"):
                    got.set()

            tg.start_soon(waiter)
            await wait_for_waiters(a, "auth-restart", 2)
            await anyio.to_thread.run_sync(auth_etcd.restart)
            await anyio.sleep(2)  # the streams notice the restart and reconnect
            # Waiting is quiet again: no watch re-created in a loop with a stale token
            # (that loop sent about 600 messages a second).
            before = await server_wakeups(a)
            await anyio.sleep(1)
            assert await server_wakeups(a) - before < 20
            await holder.release()
            with anyio.fail_after(10):
                await got.wait()
        assert not a.session.lost
        assert not b.session.lost


async def _logins(server: EtcdServer) -> float:
    return await anyio.to_thread.run_sync(
        lambda: server.metric("grpc_server_handled_total", grpc_method="Authenticate")
    )


async def test_one_login_per_expired_token(auth_etcd: EtcdServer, auth_url: str) -> None:
    """Fifty requests that fail together on an expired token log in once, not fifty
    times (each login costs a bcrypt hash on the server: 50 took 3.5 s)."""
    async with coord.connect(auth_url, ttl=30) as client:
        await anyio.sleep(3)  # the token expires after 2 s without use
        before = await _logins(auth_etcd)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for i in range(50):
                    tg.start_soon(client.backend.get, f"k{i}")
        logins = await _logins(auth_etcd) - before
    assert 1 <= logins <= 2, f"{logins:g} logins for one expired token"


async def _change_password(server: EtcdServer, old: str, new: str) -> None:
    host, port = server.endpoint.rsplit(":", 1)
    async with Channel(host, int(port)) as channel:  # (coord's own: on any event loop)
        auth = rpc.AuthStub(channel)
        login = rpc.AuthenticateRequest(name="root", password=old)
        token = (await auth.Authenticate(login, timeout=5)).token
        request = rpc.AuthUserChangePasswordRequest(name="root", password=new)
        await auth.UserChangePassword(request, timeout=5, metadata=(("token", token),))


async def test_a_refused_login_kills_no_background_task(
    auth_etcd: EtcdServer, auth_url: str
) -> None:
    """The password is changed under a running client and the server restarted: every
    stream must log in again, and cannot. A background task that died of it took the
    keepalive (and the client's task group) down without telling anyone. Instead: the
    watch stream keeps trying; the keepalive, which etcd 3.4 serves without a login,
    keeps the lease, so the holder still holds and nobody else gets the lock; and once
    the password is back, everything works again (the watch stream included)."""
    new_url = auth_url.replace("s3cr%25t", "rotated")
    restored = False
    async with coord.connect(auth_url, ttl=3) as client:
        try:
            with anyio.fail_after(20):
                async with client.mutex("rotated") as hold:
                    await _change_password(auth_etcd, "s3cr%t", "rotated")
                    await anyio.to_thread.run_sync(auth_etcd.restart)
                    await anyio.sleep(4.5)  # longer than the TTL, logins refused meanwhile
                    assert not hold.lost, client.session.reason
                    async with coord.connect(new_url, ttl=3) as other:
                        with pytest.raises(coord.LockedError):
                            await other.mutex("rotated").try_acquire()
                    await _change_password(auth_etcd, "rotated", "s3cr%t")
                    restored = True
        finally:
            if not restored:
                await _change_password(auth_etcd, "rotated", "s3cr%t")
        # The watch stream has logged in again: a waiter is woken by a release.
        async with coord.connect(auth_url, ttl=3) as other:
            holder = other.mutex("after")
            await holder.acquire()
            got = anyio.Event()
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:

                    async def waiter() -> None:
                        async with client.mutex("after"):
                            got.set()

                    tg.start_soon(waiter)
                    await wait_for_waiters(other, "after", 2)
                    await holder.release()
                    await got.wait()
        assert client.statistics().sessions_lost == 0
