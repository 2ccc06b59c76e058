"""Connecting: every failure is one line on stderr whatever a library logs, a server of
the other kind is named at once, a server that never answers fails after
``--connect-timeout``, and the commands that only read open no session."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest

from ._support import Coord, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from coord.testing import EtcdServer, ZooKeeperServer

#: The commands that only read: they must grant no lease.
READERS = [
    ["status"],
    ["status", "--watch"],
    ["leader", "job"],
    ["leader", "job", "--watch"],
    ["queue", "ls", "q"],
    ["queue", "dlq", "q"],
]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel does, from its backlog) and never
    answers a byte."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


@pytest.fixture
def cli(tmp_path: Path) -> Coord:
    cli = Coord("", tmp_path)
    cli.env.pop("COORD_URL", None)
    return cli


def _one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("coord: "), stderr
    return lines[0]


@pytest.mark.parametrize("scheme", ["etcd", "zk"])
@pytest.mark.parametrize("command", [["status"], ["lock", "job", "--", "true"]])
def test_a_store_that_never_answers_fails_in_one_line_about_connecting(
    cli: Coord, silent_port: int, scheme: str, command: list[str]
) -> None:
    url = f"{scheme}://127.0.0.1:{silent_port}"
    done = cli.run(command[0], "--url", url, "--connect-timeout", "0.5", *command[1:])
    assert done.returncode == 1
    line = _one_line(done.stderr)
    assert line.endswith(
        f": 127.0.0.1:{silent_port} accepted the connection but did not answer within 0.5s"
    ), line
    assert "lease" not in line


@pytest.mark.etcd
@pytest.mark.zookeeper
def test_a_server_of_the_other_kind_is_named_in_one_line_at_first_contact(
    cli: Coord, etcd_server: EtcdServer, zookeeper_server: ZooKeeperServer
) -> None:
    """Named at first contact (about 0.5 s here), not after the connect wait: given 30 s,
    the command still ends in a few seconds. (It used to wait out the whole connect
    timeout, then print the client library's own words. No tighter bound: a loaded CI
    machine takes seconds to start an interpreter.)"""
    cases = [
        (f"zk://{etcd_server.endpoint}", "the ZooKeeper protocol (it answers as an HTTP/2"),
        (f"etcd://{zookeeper_server.endpoint}", "(gRPC over HTTP/2) (it answers as a ZooKeeper"),
    ]
    for url, said in cases:
        started = time.monotonic()
        done = cli.run("lock", "--url", url, "--connect-timeout", "30", "demo", "--", "true")
        assert time.monotonic() - started < 15, url
        assert done.returncode == 1
        line = _one_line(done.stderr)
        assert f"{url.partition('://')[2]} does not speak " in line
        assert said in line


@pytest.fixture
def half_zookeeper() -> Iterator[int]:
    """A port that answers ZooKeeper's ``isro`` as a server would, and closes every
    session handshake: the client retries, and logs at DEBUG, until coord gives up."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                if connection.recv(64).startswith(b"isro"):
                    connection.sendall(b"rw")

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def test_a_failed_session_handshake_is_one_line(cli: Coord, half_zookeeper: int) -> None:
    url = f"zk://127.0.0.1:{half_zookeeper}"
    done = cli.run("status", "--url", url, "--connect-timeout", "1")
    assert done.returncode == 1
    assert _one_line(done.stderr).endswith("answered, but no session was opened within 1s")
    verbose = cli.run("-vv", "status", "--url", url, "--connect-timeout", "1")
    assert f"connecting to ZooKeeper 127.0.0.1:{half_zookeeper} failed" in verbose.stderr


@pytest.mark.etcd
def test_a_librarys_warnings_do_not_reach_stderr_on_etcd(cli: Coord, silent_port: int) -> None:
    """Whatever a library logs while coord fails (here gRPC's and asyncio's loggers, made
    to log as the command connects), stderr has coord's one line."""
    noisy = (
        "import logging, warnings, coord.backends.etcd as etcd, coord.cli\n"
        "enter = etcd.EtcdBackend.__aenter__\n"
        "async def noisy(self):\n"
        "    logging.getLogger('grpc._cython.cygrpc').warning('gRPC says something')\n"
        "    logging.getLogger('asyncio').error('asyncio says something')\n"
        "    warnings.warn('a library is deprecated', DeprecationWarning, stacklevel=1)\n"
        "    return await enter(self)\n"
        "etcd.EtcdBackend.__aenter__ = noisy\n"
        "coord.cli.main()\n"
    )
    url = f"etcd://127.0.0.1:{silent_port}"
    for verbose in ([], ["-v"]):
        argv = [sys.executable, "-W", "always", "-c", noisy, *verbose, "status", "--url", url]
        done = subprocess.run(
            [*argv, "--connect-timeout", "0.5"], capture_output=True, text=True, timeout=15
        )
        assert done.returncode == 1
        if not verbose:
            _one_line(done.stderr)
            continue
        for said in ("gRPC says something", "asyncio says something", "is deprecated"):
            assert said in done.stderr  # they did log


@pytest.mark.etcd
@pytest.mark.parametrize("command", READERS, ids=" ".join)
def test_commands_that_only_read_grant_no_lease(
    coord_cli: Coord, etcd_server: EtcdServer, command: list[str]
) -> None:
    granted = etcd_server.metric("etcd_debugging_lease_granted_total")
    if "--watch" in command:
        reader = coord_cli.start(*command)
        assert reader.stdout is not None
        wait_until(reader.stdout.readline, "its first output")
        reader.terminate()
        assert reader.wait(timeout=10) == 143
    else:
        done = coord_cli.run(*command)
        assert done.returncode in (0, 1), done.stderr  # `leader` exits 1 for no leader
    assert etcd_server.metric("etcd_debugging_lease_granted_total") == granted
