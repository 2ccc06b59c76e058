"""coord's ``semaphore(layout="curator")`` against Apache Curator's own
``InterProcessSemaphoreV2`` (the Java peer of ``_curator.py``): one set of leases, whoever
takes them. Each Curator peer holds one lease per path, so a test starts one peer per
lease it needs. Waits are read from the tree (a children watch), not slept."""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING

import anyio
import pytest

import coord
from coord.cli import _snapshot

from .._peer import Peer

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._curator import CuratorPeers

pytestmark = [pytest.mark.anyio, pytest.mark.zookeeper]

WAIT = 0.7  # how long a blocked peer is watched for a grant it must not get
LEASE = r"_c_[0-9a-f-]{36}-lease-\d{10}"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def connect(url: str) -> coord.Client:
    return coord.connect(url, ttl=4, layout="curator")


async def children_until(client: coord.Client, node: str, check: Callable[[int], bool]) -> int:
    """Until the number of *node*'s children passes *check* (by watch); that number."""
    backend = client.backend
    while True:
        children = await backend.child_names(node + "/")
        if check(len(children.names)):
            return len(children.names)
        await backend.wait_keys_changed(node + "/", revision=children.revision)


class Holder:
    """One coord task that takes a lease of *name* and holds it until :meth:`release`."""

    def __init__(self, client: coord.Client, name: str, limit: int) -> None:
        self.semaphore = client.semaphore(name, limit)
        self.got = anyio.Event()
        self.hold: coord.Hold | None = None
        self._release = anyio.Event()

    async def run(self) -> None:
        async with self.semaphore as hold:
            self.hold = hold
            self.got.set()
            await self._release.wait()

    def release(self) -> None:
        self._release.set()


async def test_limit_shared_both_ways(curator_peers: CuratorPeers, zookeeper_url: str) -> None:
    """Limit 2: Curator holds one and coord one; a third from either side waits, and gets
    the lease a holder of the other side returns."""
    with anyio.fail_after(30):
        c1 = await curator_peers.start(zookeeper_url)
        c2 = await curator_peers.start(zookeeper_url)
        async with connect(zookeeper_url) as client, anyio.create_task_group() as tg:
            await c1.send("semaphore /s 2")
            node = (await c1.expect("lease /s")).split()[2]
            assert re.fullmatch(LEASE, node), node
            mine = Holder(client, "s", 2)
            tg.start_soon(mine.run)
            await mine.got.wait()
            assert mine.hold is not None
            assert re.fullmatch(f"s/leases/{LEASE}", mine.hold.key)
            await c2.send("semaphore /s 2")  # a Curator third: waits
            await children_until(client, "s/leases", lambda n: n == 3)
            await c2.expect_none("lease /s", within=WAIT)
            mine.release()  # coord's lease returned: Curator's waiter gets it
            await c2.expect("lease /s")

            third = Holder(client, "s", 2)  # a coord third (Curator holds both): waits
            tg.start_soon(third.run)
            await children_until(client, "s/leases", lambda n: n == 3)
            holding = [w.holding for w in await third.semaphore.waiters()]
            assert holding == [True, True, False]
            assert not third.got.is_set()
            await c1.send("unsemaphore /s")  # Curator's lease returned: coord's waiter
            await c1.expect("unleased /s")
            await third.got.wait()
            await children_until(client, "s/locks", lambda n: n == 0)
            third.release()
            await c2.send("unsemaphore /s")
            await c2.expect("unleased /s")
        async with connect(zookeeper_url) as client:
            await children_until(client, "s/leases", lambda n: n == 0)


async def test_killed_curator_holder_frees_its_lease(
    curator_peers: CuratorPeers, zookeeper_url: str
) -> None:
    with anyio.fail_after(25):
        java = await curator_peers.start(zookeeper_url, session_timeout=4)
        await java.send("semaphore /k 1")
        await java.expect("lease /k")
        async with connect(zookeeper_url) as client, anyio.create_task_group() as tg:
            waiter = Holder(client, "k", 1)
            tg.start_soon(waiter.run)
            await children_until(client, "k/leases", lambda n: n == 2)
            killed = anyio.current_time()
            java.kill()  # SIGKILL: its lease lives until its session times out
            await waiter.got.wait()
            waited = anyio.current_time() - killed
            assert 1.0 < waited < 15, waited
            waiter.release()


HOLDER = """
import sys, anyio, coord
async def main():
    async with coord.connect(sys.argv[1], ttl=4, layout="curator") as client:
        async with client.semaphore("h", 1) as hold:
            print("held", hold.key, flush=True)
            await anyio.sleep_forever()
anyio.run(main)
"""


async def test_killed_coord_holder_frees_its_lease(
    curator_peers: CuratorPeers, zookeeper_url: str
) -> None:
    with anyio.fail_after(25):
        java = await curator_peers.start(zookeeper_url)
        holder = await anyio.open_process([sys.executable, "-c", HOLDER, zookeeper_url])
        async with holder, connect(zookeeper_url) as client:
            line = await Peer(holder).line()
            assert re.fullmatch(f"held h/leases/{LEASE}", line), line
            await java.send("semaphore /h 1")
            await children_until(client, "h/leases", lambda n: n == 2)
            await java.expect_none("lease /h", within=WAIT)
            killed = anyio.current_time()
            holder.kill()  # SIGKILL: no release; the session expires after its TTL
            await java.expect("lease /h", timeout=15)
            assert anyio.current_time() - killed > 1.0


async def test_cancelled_coord_waiter_leaves_nothing(
    curator_peers: CuratorPeers, zookeeper_url: str
) -> None:
    """A coord waiter (on the leases, holding the ``locks`` mutex) cancelled: its nodes
    go, and the Curator waiter queued behind it on the mutex gets the next lease."""
    with anyio.fail_after(30):
        c1 = await curator_peers.start(zookeeper_url)
        c2 = await curator_peers.start(zookeeper_url)
        await c1.send("semaphore /c 1")
        await c1.expect("lease /c")
        async with connect(zookeeper_url) as client:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(client.semaphore("c", 1).acquire)
                    await children_until(client, "c/leases", lambda n: n == 2)
                    await c2.send("semaphore /c 1")  # queued on c/locks behind coord's
                    await children_until(client, "c/locks", lambda n: n == 2)
                    scope.cancel()
            await children_until(client, "c/leases", lambda n: n == 2)  # now Curator's
            await children_until(client, "c/locks", lambda n: n == 1)
            await c2.expect_none("lease /c", within=WAIT)
            # Curator's leases record no limit: the newest, made by the holder of
            # c/locks, is the one that waits.
            [shown] = (await _snapshot.read(client, "", layout="curator")).objects
            assert (shown["name"], "limit" in shown) == ("c", False)
            assert [e["holding"] for e in shown["entries"]] == [True, False]
            await c1.send("unsemaphore /c")
            await c2.expect("lease /c")
            await children_until(client, "c/locks", lambda n: n == 0)
            assert await children_until(client, "c/leases", lambda n: n == 1) == 1
