"""The ``coord`` command group."""

from __future__ import annotations

import logging
import os

import click

import coord

from .dev import dev
from .elect import elect, leader
from .group import group
from .lock import lock
from .queue import queue
from .status import status

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(coord.__version__, prog_name="coord")
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="Log coord's sessions and losses to stderr (-v); also each acquire and release (-vv).",
)
def cli(verbose: int) -> None:
    """coord at the shell: locks, leader election, who holds what, job queues, and a
    local etcd and ZooKeeper for trying it all.

    Commands that talk to a store take --url or read COORD_URL:
    etcd://host:port[/namespace] or zk://host:port[/chroot] (not memory://, which
    shares nothing between processes).

    \b
    Try it:
        coord dev                               # terminal 1: local servers
        export COORD_URL=etcd://127.0.0.1:2379  # the line coord dev prints
        coord lock demo -- sleep 10             # terminals 2 and 3
        coord status                            # terminal 4: holder and waiter

    Exit status: the wrapped command's, 1 for a failure (one line on stderr), 2 for a
    usage error, 128+N after signal N.
    """
    _log_to_stderr(verbose)


def _log_to_stderr(verbose: int) -> None:
    """Without -v, nothing is logged to stderr: a failure is coord's one line. Libraries
    log through Python's last-resort handler when nobody configured logging (asyncio's
    and aiokafka's WARNINGs) and gRPC's core
    prints its own: all silenced, and Python warnings with them. With -v, coord's lines
    (-vv: DEBUG too) and the libraries' WARNINGs (-vv: INFO) go through one handler."""
    logging.captureWarnings(True)
    root = logging.getLogger()
    if not verbose:
        root.addHandler(logging.NullHandler())
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # read when grpc is imported
        return
    handler = logging.StreamHandler()
    handler.setFormatter(_Lines())
    root.addHandler(handler)
    root.setLevel(logging.WARNING if verbose == 1 else logging.INFO)
    logging.getLogger("coord").setLevel(logging.INFO if verbose == 1 else logging.DEBUG)


class _Lines(logging.Formatter):
    """``12:00:00 message`` for coord's lines, ``12:00:00 aiokafka: message`` for a
    library's."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(message)s", "%H:%M:%S")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        if record.name == "coord" or record.name.startswith("coord."):
            return line
        stamp, _, message = line.partition(" ")
        return f"{stamp} {record.name}: {message}"


for _command in (dev, elect, group, leader, lock, queue, status):
    cli.add_command(_command)


def main() -> None:
    """The ``coord`` console script."""
    cli(prog_name="coord")
