"""``coord lock --layout etcd`` and ``coord status --layout etcd`` beside the real
``etcdctl lock`` (Debian's etcd-client) on one etcd."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

from ._support import Coord, wait_until

if TYPE_CHECKING:
    from coord.testing import EtcdServer

pytestmark = [pytest.mark.etcd]


def test_coord_lock_waits_for_etcdctl_and_status_shows_both(
    coord_cli: Coord, etcd_server: EtcdServer, etcdctl: str
) -> None:
    name = urlsplit(coord_cli.url).path.strip("/") + "/job"
    go = subprocess.Popen(
        [etcdctl, f"--endpoints={etcd_server.endpoint}", "lock", name],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "ETCDCTL_API": "3"},
    )
    try:
        assert go.stdout is not None
        held = go.stdout.readline().strip()  # etcdctl prints its key once it holds
        assert held.startswith(name + "/")
        script = 'echo "fence $COORD_FENCE"'
        waiter = coord_cli.start(
            "lock", "--layout", "etcd", "--name", "w", "job", "--", "sh", "-c", script
        )

        def both() -> bool:
            return len(_etcd_entries(coord_cli)) == 2

        wait_until(both, "coord's key beside etcdctl's")
        entries = _etcd_entries(coord_cli)
        assert [e["holding"] for e in entries] == [True, False]
        assert name.rpartition("/")[0] + "/" + entries[0]["key"] == held
        assert entries[0]["identity"] == {}  # a Go peer records nobody
        assert entries[1]["identity"]["name"] == "w"
        assert entries[1]["lease"] == entries[1]["key"].rpartition("/")[2]
        text = coord_cli.run("status", "--layout", "etcd")
        assert text.returncode == 0, text.stderr
        assert (
            f"etcd job\n  holds   fence {entries[0]['fence']}  lease {entries[0]['lease']}"
            in text.stdout
        )
        assert waiter.poll() is None, "coord ran its command while etcdctl held the lock"
        go.send_signal(signal.SIGTERM)  # etcdctl unlocks
        out, err = waiter.communicate(timeout=10)
        assert waiter.returncode == 0, err
        assert int(out.split()[1]) == entries[1]["fence"]
    finally:
        go.kill()
        go.communicate()


def _etcd_entries(cli: Coord, name: str = "job") -> list[dict[str, Any]]:
    done = cli.run("status", "--layout", "etcd", "--json")
    assert done.returncode == 0, done.stderr
    objects = json.loads(done.stdout)["objects"]
    assert all(o["kind"] == "etcd" for o in objects)
    return [e for o in objects if o["name"] == name for e in o["entries"]]


def test_coord_leader_and_elect_beside_etcdctl_elect(
    coord_cli: Coord, etcd_server: EtcdServer, etcdctl: str
) -> None:
    name = urlsplit(coord_cli.url).path.strip("/") + "/sched"
    go = subprocess.Popen(
        [etcdctl, f"--endpoints={etcd_server.endpoint}", "elect", name, "go-leader"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "ETCDCTL_API": "3"},
    )
    try:
        assert go.stdout is not None
        key = go.stdout.readline().strip()  # printed once it leads: its key, its value
        assert go.stdout.readline().strip() == "go-leader"
        shown = coord_cli.run("leader", "--layout", "etcd", "--json", "sched")
        assert shown.returncode == 0, shown.stderr
        leader = json.loads(shown.stdout)["leader"]
        assert (leader["value"], name.rpartition("/")[0] + "/" + leader["key"]) == (
            "go-leader",
            key,
        )
        script = "echo led"
        candidate = coord_cli.start(
            "elect", "--layout", "etcd", "--value", "py", "sched", "--", "sh", "-c", script
        )
        wait_until(lambda: len(_etcd_entries(coord_cli, "sched")) == 2, "coord's candidate key")
        assert candidate.poll() is None, "coord led while etcdctl did"
        go.send_signal(signal.SIGTERM)  # etcdctl resigns
        out, err = candidate.communicate(timeout=10)
        assert (candidate.returncode, out) == (0, "led\n"), err
    finally:
        go.kill()
        go.communicate()
