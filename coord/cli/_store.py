"""Where the commands connect: ``--url`` (or ``COORD_URL``) and ``--connect-timeout``, and
for the commands that hold something, ``--ttl`` and ``--identity``.

Commands that only read (``status``, ``leader``, ``queue ls``, ``queue dlq``) open no
session (:func:`coord.connect` with ``sessions=False``): no lease, so nothing in the store
while they run, and a store that does not answer is a connection failure, said as such.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

import coord
from coord._core.url import parse_url

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["OneLineUsageError", "Store", "read_options", "store_options"]

_F = TypeVar("_F", bound="Callable[..., Any]")


@dataclass(frozen=True)
class Store:
    """Where to connect and as whom: from ``--url``/``COORD_URL``, ``--connect-timeout``,
    and (for commands that hold something) ``--ttl`` and ``--identity``."""

    url: str
    connect_timeout: float
    ttl: float = 10.0
    identity: str | None = None
    sessions: bool = True

    def connect(self) -> coord.Client:
        """An unopened client for this store (use it with ``async with``)."""
        return coord.connect(
            self.url,
            ttl=self.ttl,
            identity=self.identity,
            connect_timeout=self.connect_timeout,
            sessions=self.sessions,
        )


class OneLineUsageError(click.UsageError):
    """A usage error shown as one line, ``coord: message`` (exit status 2): for a
    request that is well-formed but refused."""

    def show(self, file: Any = None) -> None:
        click.echo(f"coord: {self.format_message()}", err=True)


def _check_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    if not value:
        raise click.UsageError(
            "no store given: pass --url or set COORD_URL (e.g. etcd://127.0.0.1:2379/myapp; "
            "`coord dev` starts a local etcd and ZooKeeper)",
            ctx,
        )
    try:
        parsed = parse_url(value)
    except coord.ConfigurationError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
    if parsed.scheme == "memory":
        raise OneLineUsageError(
            "memory:// is a store inside one process: nothing is shared between processes, "
            "so a lock taken here would exclude nobody; use etcd:// or zk:// (`coord dev` "
            "starts both)"
        )
    return value


_URL = click.option(
    "--url",
    envvar="COORD_URL",
    callback=_check_url,
    help="The store: etcd://host:port[/namespace] or zk://host:port[/chroot] "
    "(default: $COORD_URL). Not memory://: nothing in it is shared between processes.",
)
_CONNECT_TIMEOUT = click.option(
    "--connect-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="Seconds to wait for the store to answer at first (a server of another kind, "
    "or a refused port, fails at once).",
)


def read_options(command: _F) -> _F:
    """Add ``--url`` and ``--connect-timeout``; the command gets ``store: Store``, whose
    client opens no session."""

    @_URL
    @_CONNECT_TIMEOUT
    @functools.wraps(command)
    def wrapper(url: str, connect_timeout: float, **kwargs: Any) -> Any:
        return command(store=Store(url, connect_timeout, sessions=False), **kwargs)

    return wrapper  # type: ignore[return-value]


def store_options(command: _F) -> _F:
    """Add ``--url``, ``--connect-timeout``, ``--ttl`` and ``--identity``; the command
    gets ``store: Store``."""

    @_URL
    @_CONNECT_TIMEOUT
    @click.option(
        "--ttl",
        type=click.FloatRange(min=1),
        default=10.0,
        show_default=True,
        help="Seconds the store keeps this process's keys after it stops answering.",
    )
    @click.option(
        "--identity",
        "--name",
        "identity",
        metavar="TEXT",
        help="A name recorded with host and pid in this process's keys (shown by status).",
    )
    @functools.wraps(command)
    def wrapper(
        url: str, connect_timeout: float, ttl: float, identity: str | None, **kwargs: Any
    ) -> Any:
        return command(store=Store(url, connect_timeout, ttl, identity), **kwargs)

    return wrapper  # type: ignore[return-value]
