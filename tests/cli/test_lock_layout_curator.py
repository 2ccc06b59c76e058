"""``coord lock|elect|leader|status --layout curator`` beside a real Apache Curator peer
(``tests/integration/zookeeper/curator/CuratorPeer.java``: InterProcessMutex and
LeaderLatch) on one ZooKeeper."""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING

import anyio
import pytest

from ..integration.zookeeper import _curator
from ._support import Coord, wait_until

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator
    from pathlib import Path

    from ..integration.zookeeper._curator import CuratorPeers

pytestmark = [pytest.mark.zookeeper, pytest.mark.timeout(60)]

# The Curator peer's fixtures, registered for these tests.
curator_classpath = _curator.curator_classpath
curator_peers = _curator.curator_peers


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def zk_cli(zookeeper_url: str, tmp_path: Path) -> Iterator[Coord]:
    cli = Coord(zookeeper_url, tmp_path)
    yield cli
    cli.close()


async def _ended(process: subprocess.Popen[str]) -> tuple[str, str]:
    return await anyio.to_thread.run_sync(partial(process.communicate, timeout=15))


async def test_coord_lock_waits_for_curator_and_status_shows_both(
    zk_cli: Coord, curator_peers: CuratorPeers
) -> None:
    """Curator's InterProcessMutex holds ``/job``: ``coord lock --layout curator job``
    queues behind it and does not run its command; ``coord status`` shows both nodes,
    Curator's first and holding; when Curator releases, coord runs with its node's fence."""
    peer = await curator_peers.start(zk_cli.url)
    await peer.send("lock /job")
    await peer.expect("locked /job")
    waiter = zk_cli.start(
        "lock", "--layout", "curator", "--name", "w", "job", "--", "sh", "-c", 'echo "$COORD_FENCE"'
    )
    try:
        await anyio.to_thread.run_sync(
            lambda: wait_until(
                lambda: len(zk_cli.entries("job", layout="curator")) == 2, "coord's node"
            )
        )
        entries = await anyio.to_thread.run_sync(partial(zk_cli.entries, "job", layout="curator"))
        assert [e["holding"] for e in entries] == [True, False]
        assert "-lock-" in entries[0]["key"]
        assert "-lock-" in entries[1]["key"]
        assert entries[1]["identity"]["name"] == "w"
        assert entries[0]["session"] != entries[1]["session"]
        text = (await anyio.to_thread.run_sync(zk_cli.run, "status", "--layout", "curator")).stdout
        assert "curator job" in text, text
        assert f"fence {entries[0]['fence']}" in text, text
        assert waiter.poll() is None, "coord ran its command while Curator held the lock"
        await peer.send("unlock /job")
        await peer.expect("unlocked /job")
        out, err = await _ended(waiter)
        assert waiter.returncode == 0, err
        assert int(out) == entries[1]["fence"]
    finally:
        waiter.kill()
        waiter.communicate()


async def test_coord_leader_and_elect_beside_a_curator_latch(
    zk_cli: Coord, curator_peers: CuratorPeers
) -> None:
    """A Curator LeaderLatch leads ``/sched``: ``coord leader --layout curator`` names
    its id, ``coord elect`` waits as a candidate, and leads once the latch closes."""
    peer = await curator_peers.start(zk_cli.url)
    await peer.send("latch /sched curator-leader")
    await peer.expect("leader /sched curator-leader")
    shown = await anyio.to_thread.run_sync(
        zk_cli.run, "leader", "--layout", "curator", "--json", "sched"
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["leader"]["value"] == "curator-leader"
    candidate = zk_cli.start(
        "elect", "--layout", "curator", "--value", "py", "sched", "--", "sh", "-c", "echo led"
    )
    try:
        await anyio.to_thread.run_sync(
            lambda: wait_until(
                lambda: len(zk_cli.entries("sched", layout="curator")) == 2, "coord's candidate"
            )
        )
        assert candidate.poll() is None, "coord led while Curator's latch did"
        await peer.send("unlatch /sched")
        await peer.expect("unlatched /sched")
        out, err = await _ended(candidate)
        assert (candidate.returncode, out) == (0, "led\n"), err
    finally:
        candidate.kill()
        candidate.communicate()


async def test_coord_leader_and_elect_with_a_curator_leader_selector(
    zk_cli: Coord, curator_peers: CuratorPeers
) -> None:
    """``--selector``: a Curator LeaderSelector leads ``/pool``; ``coord leader`` names its
    id, ``coord elect`` waits on its mutex and leads once the selector's term ends."""
    peer = await curator_peers.start(zk_cli.url)
    await peer.send("selector /pool java-sel")
    await peer.expect("selected /pool java-sel")
    shown = await anyio.to_thread.run_sync(
        zk_cli.run, "leader", "--layout", "curator", "--selector", "--json", "pool"
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["leader"]["value"] == "java-sel"
    candidate = zk_cli.start(
        "elect", "--layout", "curator", "--selector", "--value", "py", "pool", "--", "echo", "led"
    )
    try:
        await anyio.to_thread.run_sync(
            lambda: wait_until(
                lambda: len(zk_cli.entries("pool", layout="curator")) == 2, "coord's candidate"
            )
        )
        assert candidate.poll() is None, "coord led while Curator's selector did"
        await peer.send("unselect /pool")
        await peer.expect("unselected /pool")
        out, err = await _ended(candidate)
        assert (candidate.returncode, out) == (0, "led\n"), err
    finally:
        candidate.kill()
        candidate.communicate()


def test_selector_outside_the_curator_layout_is_refused(zk_cli: Coord) -> None:
    done = zk_cli.run("leader", "--layout", "kazoo", "--selector", "pool")
    assert done.returncode != 0
    assert "layout='curator' only" in done.stderr, done.stderr
