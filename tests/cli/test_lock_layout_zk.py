"""``coord lock|elect|leader|status --layout kazoo`` beside a real kazoo service
(``tests/integration/zookeeper/_kazoo_peer.py``) on one ZooKeeper."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ._support import Coord, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator

    from coord.testing import ZooKeeperServer

pytestmark = [pytest.mark.zookeeper]

_PEER = Path(__file__).parents[1] / "integration" / "zookeeper" / "_kazoo_peer.py"


@pytest.fixture
def zk_cli(zookeeper_url: str, tmp_path: Path) -> Iterator[Coord]:
    cli = Coord(zookeeper_url, tmp_path)
    yield cli
    cli.close()


@pytest.fixture
def kazoo(zookeeper_server: ZooKeeperServer) -> Iterator[subprocess.Popen[str]]:
    peer = subprocess.Popen(
        [sys.executable, str(_PEER), zookeeper_server.endpoint, "5"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert _ask(peer) == "ready"
        yield peer
    finally:
        peer.kill()
        peer.communicate()


def _ask(peer: subprocess.Popen[str], line: str = "") -> str:
    assert peer.stdin is not None
    assert peer.stdout is not None
    if line:
        peer.stdin.write(line + "\n")
        peer.stdin.flush()
    return peer.stdout.readline().strip()


def test_coord_lock_waits_for_kazoo_and_status_shows_both(
    zk_cli: Coord, kazoo: subprocess.Popen[str]
) -> None:
    path = "/" + zk_cli.url.rsplit("/", 1)[1] + "/job"
    assert _ask(kazoo, f"lock {path} kazoo-worker").startswith("locked")
    waiter = zk_cli.start(
        "lock", "--layout", "kazoo", "--name", "w", "job", "--", "sh", "-c", 'echo "$COORD_FENCE"'
    )
    try:
        wait_until(
            lambda: len(zk_cli.entries("job", layout="kazoo")) == 2, "coord's node beside kazoo's"
        )
        entries = zk_cli.entries("job", layout="kazoo")
        assert [e["holding"] for e in entries] == [True, False]
        assert (entries[0]["value"], entries[0]["identity"]) == ("kazoo-worker", {})
        assert entries[1]["identity"]["name"] == "w"
        assert entries[0]["session"] != entries[1]["session"]
        text = zk_cli.run("status", "--layout", "kazoo")
        assert f"kazoo job\n  holds/w  fence {entries[0]['fence']}" in text.stdout, text.stdout
        assert f"session {entries[0]['session']}  'kazoo-worker'" in text.stdout
        assert waiter.poll() is None, "coord ran its command while kazoo held the lock"
        assert _ask(kazoo, "unlock") == "unlocked"
        out, err = waiter.communicate(timeout=10)
        assert waiter.returncode == 0, err
        assert int(out) == entries[1]["fence"]
    finally:
        waiter.kill()
        waiter.communicate()


def test_coord_leader_and_elect_beside_kazoo(zk_cli: Coord, kazoo: subprocess.Popen[str]) -> None:
    path = "/" + zk_cli.url.rsplit("/", 1)[1] + "/sched"
    assert _ask(kazoo, f"elect {path} kazoo-leader") == f"leader {path} kazoo-leader"
    shown = zk_cli.run("leader", "--layout", "kazoo", "--json", "sched")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["leader"]["value"] == "kazoo-leader"
    candidate = zk_cli.start(
        "elect", "--layout", "kazoo", "--value", "py", "sched", "--", "sh", "-c", "echo led"
    )
    try:
        wait_until(
            lambda: len(zk_cli.entries("sched", layout="kazoo")) == 2, "coord's candidate node"
        )
        assert candidate.poll() is None, "coord led while kazoo did"
        assert _ask(kazoo, "unlock") == "unlocked"
        out, err = candidate.communicate(timeout=10)
        assert (candidate.returncode, out) == (0, "led\n"), err
    finally:
        candidate.kill()
        candidate.communicate()
