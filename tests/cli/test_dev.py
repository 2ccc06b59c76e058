"""``coord dev``: local servers that answer, and nothing left behind after SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from coord.testing import EtcdServer, ServerNotFound, ZooKeeperServer


def _need_servers() -> None:
    """Skip loudly when etcd or ZooKeeper is not installed (fail under CI)."""
    try:
        EtcdServer().close()
        ZooKeeperServer().close()
    except ServerNotFound as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc} (CI is set: a missing server fails the run)")
        pytest.skip(f"SKIPPED LOUDLY: {exc}")


def _children(pid: int) -> list[int]:
    """The pids whose parent is *pid* (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.etcd
@pytest.mark.zookeeper
@pytest.mark.timeout(90)
@pytest.mark.parametrize("cluster", [False, True], ids=["single", "cluster"])
def test_dev_starts_servers_and_stops_them_on_sigterm(cluster: bool) -> None:
    _need_servers()
    argv = [sys.executable, "-m", "coord.cli", "dev", *(["--cluster", "--no-kafka"] * cluster)]
    members = 3 if cluster else 1
    dev = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert dev.stdout is not None
        lines: list[str] = []
        while not lines or not lines[-1].startswith("export COORD_URL="):
            line = dev.stdout.readline()
            assert line, f"coord dev ended: {dev.communicate()[1]}"
            lines.append(line.strip())
        servers = {line.split()[0]: line.split()[1] for line in lines[:-1]}
        assert lines[-1] == f"export COORD_URL={servers['etcd']}"
        assert servers["zookeeper"].startswith("zk://127.0.0.1:")
        for url in (servers["etcd"], servers["zookeeper"]):
            assert url.count("127.0.0.1:") == members, url
        data = [Path(d) for line in lines[:-1] for d in line.partition("(data: ")[2][:-1].split()]
        assert all(d.is_dir() for d in data)
        assert len(data) == members * 2 + ("kafka" in servers)
        children = _children(dev.pid)
        # etcd and ZooKeeper members, and Tansu if installed (not with --no-kafka)
        assert len(children) == members * 2 + ("kafka" in servers)

        for url in (servers["etcd"], servers["zookeeper"]):
            probe = [sys.executable, "-m", "coord.cli", "lock", "--url", url + "/devtest"]
            probe += ["probe", "--", "true"]
            assert subprocess.run(probe, capture_output=True, timeout=20).returncode == 0

        dev.send_signal(signal.SIGTERM)
        assert dev.wait(timeout=30) == 0
    finally:
        if dev.poll() is None:
            dev.kill()
        _, err = dev.communicate()
    assert err.splitlines()[-1] == "coord dev: stopped; data removed"
    assert [pid for pid in children if _alive(pid)] == []
    assert [d for d in data if d.exists()] == []
