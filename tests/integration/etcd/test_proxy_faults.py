"""Faults between one client and etcd, injected with coord.testing.TcpProxy: replies that
come back too late (a lost registration reply), a client cut off from the store; and what
an outage logs (one line when it starts, one when it ends, not one per attempt)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import coord
from coord.testing import TcpProxy, wait_for_no_waiters
from coord.testing._faults import _wait_for_queue as wait_for_queue
from coord.testing.pytest_plugin import fresh_namespace

from .._stall import holder_stalled_past_its_ttl, holder_stalled_within_its_ttl

if TYPE_CHECKING:
    from coord.testing import EtcdServer

pytestmark = [pytest.mark.anyio, pytest.mark.etcd]


async def _keys(client: coord.Client, name: str) -> list[str]:
    return [e.key for e in (await client.backend.entries(name + "/")).entries]


async def test_registration_whose_replies_come_too_late_is_not_duplicated(
    etcd_server: EtcdServer, proxy: TcpProxy
) -> None:
    """Every reply arrives after the attempt's deadline: the registration is applied by
    etcd, the client never hears of it and tries again. Once replies are on time again,
    the acquire gets the lock with the key it created first: one key, not two.

    The observer holds the lock and the client has a waiter queued, so that the client
    knows the queue's tail and its next registration is applied at once (a client that
    does not know it reads it first, and with every reply late it never gets that far)."""
    namespace = fresh_namespace()
    async with (
        coord.connect(f"etcd://{proxy.endpoint}/{namespace}", ttl=6, request_timeout=1) as client,
        coord.connect(f"{etcd_server.url}/{namespace}", ttl=6) as observer,
    ):
        gate = observer.mutex("late")
        await gate.acquire()
        async with anyio.create_task_group() as tg:
            got: list[coord.Hold] = []

            async def acquire() -> None:
                async with client.mutex("late") as hold:
                    got.append(hold)
                    keys = await _keys(observer, "late")
                    assert keys[0] == hold.key
                    assert keys.count(hold.key) == 1

            # The first registration's answer must have reached the client (etcd may
            # apply it, and the observer see it, with the reply still on its way: under
            # load, past the delay below, and then the client knew no tail; CI failure).
            registrar = client.backend._registrar  # type: ignore[attr-defined]
            register, answered = registrar.register, anyio.Event()

            async def registering(*args: Any) -> Any:
                position = await register(*args)
                answered.set()
                return position

            registrar.register = registering
            tg.start_soon(acquire)
            with anyio.fail_after(5):
                await answered.wait()
            del registrar.register
            proxy.delay(1.5)  # past each attempt's deadline (1 s), under ttl / 3
            tg.start_soon(acquire)
            with anyio.fail_after(5):
                await wait_for_queue(observer, "late", lambda n: n == 3)
            await anyio.sleep(3)  # attempts time out, one after another
            assert len(await _keys(observer, "late")) == 3
            assert not got
            proxy.heal()
            await gate.release()
        assert len(got) == 2
        assert got[0].fence < got[1].fence
        assert not client.session.lost
        assert await _keys(observer, "late") == []


async def test_giving_up_while_replies_are_late_leaves_no_key(
    etcd_server: EtcdServer, proxy: TcpProxy
) -> None:
    """The caller gives up while no reply comes back in time: the key that etcd did
    create must not stay behind, bound to a live lease (everyone else, the same client
    included, would queue behind it forever)."""
    namespace = fresh_namespace()
    async with (
        coord.connect(f"etcd://{proxy.endpoint}/{namespace}", ttl=6, request_timeout=1) as client,
        coord.connect(f"{etcd_server.url}/{namespace}", ttl=6) as other,
    ):
        proxy.delay(1.5)
        with pytest.raises(TimeoutError), anyio.fail_after(2.5):
            await client.mutex("abandoned").acquire()
        proxy.heal()
        with anyio.fail_after(10):
            await wait_for_no_waiters(other, "abandoned")
            async with other.mutex("abandoned"), anyio.create_task_group():
                pass
            async with client.mutex("abandoned"):  # and the same client, again
                pass
        assert not client.session.lost


async def test_a_client_cut_off_past_its_ttl_is_told_and_comes_back(
    etcd_server: EtcdServer, proxy: TcpProxy
) -> None:
    namespace = fresh_namespace()
    async with (
        coord.connect(f"etcd://{proxy.endpoint}/{namespace}", ttl=2) as client,
        coord.connect(f"{etcd_server.url}/{namespace}", ttl=2) as other,
    ):
        first = client.session
        with anyio.fail_after(10), pytest.raises(coord.LockLost):
            async with client.mutex("cut") as hold:
                proxy.blackhole()
                await anyio.sleep_forever()
        assert hold.lost
        with anyio.fail_after(10):  # the store expired it too: another client gets it
            async with other.mutex("cut") as next_hold:
                assert next_hold.fence > hold.fence
        proxy.heal()
        with anyio.fail_after(10):  # the same client, a new session, no restart
            async with client.mutex("cut") as again:
                assert again.session is not first


async def test_a_holder_stalled_past_its_ttl_gets_lock_lost(
    etcd_server: EtcdServer, proxy: TcpProxy
) -> None:
    namespace = fresh_namespace()
    await holder_stalled_past_its_ttl(
        f"etcd://{proxy.endpoint}/{namespace}", f"{etcd_server.url}/{namespace}", proxy
    )


async def test_an_outage_shorter_than_the_ttl_logs_two_lines(
    proxy: TcpProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="coord")
    async with coord.connect(f"etcd://{proxy.endpoint}/{fresh_namespace()}", ttl=6) as client:
        lease = client.session.id
        caplog.clear()
        proxy.refuse()
        proxy.reset()
        await anyio.sleep(3)  # keepalives are retried every 0.25 s meanwhile
        proxy.heal()
        await anyio.sleep(2.5)  # the next retry gets through (gRPC reconnects at once)
        assert not client.session.lost
    lines = [f"{r.levelname} {r.getMessage()}" for r in caplog.records if r.levelno >= logging.INFO]
    failed = [line for line in lines if "keepalive failed" in line]
    assert len(failed) == 1, lines
    assert failed[0].startswith(f"WARNING lease {lease:#x}: a keepalive failed ("), lines
    (renewed,) = [line for line in lines if "renewed after" in line]
    count = int(renewed.split("after ")[1].split()[0])
    assert count >= 5, renewed  # attempts folded into the two lines
    assert len(lines) <= 4, lines


async def test_a_holder_stalled_within_its_ttl_keeps_its_hold(etcd_server: EtcdServer) -> None:
    await holder_stalled_within_its_ttl(f"{etcd_server.url}/{fresh_namespace()}")
