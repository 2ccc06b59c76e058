"""The Curator peer harness (``_curator.py``) against itself: real Curator recipes in two
or three JVMs on the suite's ZooKeeper, so that a layout test that uses the peer can trust
what it prints. Each test checks one recipe's exclusion and hand-over as Curator does it."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import anyio
import pytest

if TYPE_CHECKING:
    from ._curator import CuratorPeers

pytestmark = [pytest.mark.anyio, pytest.mark.zookeeper]

WAIT = 0.7  # how long a blocked peer is watched for a grant it must not get


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the peer is another process: one event loop proves the harness


def sequence(line: str) -> int:
    """The sequence number at the end of a ``locked``/``lease`` line's node name."""
    found = re.search(r"-(?:lock|lease)-(\d{10})$", line)
    assert found is not None, line
    return int(found.group(1))


async def test_mutex_and_rwlock_exclude_across_peers(
    curator_peers: CuratorPeers, zookeeper_url: str
) -> None:
    a = await curator_peers.start(zookeeper_url)
    b = await curator_peers.start(zookeeper_url)
    await a.send("lock /shared/a")
    first = await a.expect("locked /shared/a")
    assert re.fullmatch(r"locked /shared/a _c_[0-9a-f-]{36}-lock-\d{10}", first), first
    await b.send("lock /shared/a")
    await b.expect_none("locked /shared/a", within=WAIT)  # A holds: B waits
    await a.send("unlock /shared/a")
    await a.expect("unlocked /shared/a")
    second = await b.expect("locked /shared/a")
    assert sequence(second) > sequence(first)  # B queued behind A

    await a.send("read /rw")
    await b.send("read /rw")
    await a.expect("read-locked /rw")
    await b.expect("read-locked /rw")  # readers share
    await b.send("unread /rw")
    await b.expect("read-unlocked /rw")
    await b.send("write /rw")
    await b.expect_none("write-locked /rw", within=WAIT)  # A still reads
    await a.send("unread /rw")
    await b.expect("write-locked /rw")


async def test_semaphore_of_two_admits_two(curator_peers: CuratorPeers, zookeeper_url: str) -> None:
    peers = [await curator_peers.start(zookeeper_url) for _ in range(3)]
    for peer in peers[:2]:
        await peer.send("semaphore /s 2")
        await peer.expect("lease /s")
    await peers[2].send("semaphore /s 2")
    await peers[2].expect_none("lease /s", within=WAIT)  # the third waits
    await peers[0].send("unsemaphore /s")
    await peers[0].expect("unleased /s")
    await peers[2].expect("lease /s")


async def test_latch_leadership_moves_when_the_leader_is_killed(
    curator_peers: CuratorPeers, zookeeper_url: str
) -> None:
    a = await curator_peers.start(zookeeper_url, session_timeout=2)
    b = await curator_peers.start(zookeeper_url, session_timeout=2)
    await a.send("latch /l a")
    await a.expect("leader /l a")
    await b.send("latch /l b")
    await b.expect_none("leader /l", within=WAIT)
    await b.send("leader-of /l")
    assert await b.expect("leader-of /l") == "leader-of /l a"
    killed = anyio.current_time()
    a.kill()  # SIGKILL: A's latch node lives until its session times out
    await b.expect("leader /l b", timeout=15)
    waited = anyio.current_time() - killed
    assert waited > 1.0, f"B led {waited:.2f} s after the kill: before A's session ended?"
    await b.send("leader-of /l")
    assert await b.expect("leader-of /l") == "leader-of /l b"
    await b.send("unlatch /l")
    await b.expect("unlatched /l")
    await b.send("leader-of /l")
    assert await b.expect("leader-of /l") == "leader-of /l NONE"


async def test_selector_holds_until_unselect(
    curator_peers: CuratorPeers, zookeeper_url: str
) -> None:
    a = await curator_peers.start(zookeeper_url)
    b = await curator_peers.start(zookeeper_url)
    await a.send("selector /e a")
    await a.expect("selected /e a")
    await b.send("selector /e b")
    await b.expect_none("selected /e", within=WAIT)
    await b.send("leader-of /e selector")
    assert await b.expect("leader-of /e") == "leader-of /e a"
    await a.send("unselect /e")
    await a.expect("unselected /e")
    await b.expect("selected /e b")
    await a.expect_none("not-selected /e", within=0)  # A's term ended, not interrupted


async def test_errors_are_one_line_and_fail_an_expect(
    curator_peers: CuratorPeers, zookeeper_url: str
) -> None:
    peer = await curator_peers.start(zookeeper_url)
    await peer.send("unlock /never-locked")
    line = await peer.expect("error unlock /never-locked:")
    assert "no mutex" in line
    await peer.send("frobnicate /x")
    with pytest.raises(AssertionError, match="unknown command frobnicate"):
        await peer.expect("locked /x", timeout=5)
