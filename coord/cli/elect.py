"""``coord elect NAME -- CMD...`` and ``coord leader NAME``: leader election at the shell."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from coord._sessions.identity import parse_identity

from ._common import (
    FAILURE,
    NAME,
    Interrupt,
    identity_in,
    run,
    show_identity,
    waiting,
)
from ._store import Store, read_options, store_options
from .lock import GRACE, LAYOUT, WrapsCommand, lost_how, run_holding

if TYPE_CHECKING:
    from collections.abc import Sequence

    import coord

__all__ = ["elect", "leader"]

SELECTOR = click.option(
    "--selector",
    is_flag=True,
    help="With --layout curator: Curator's LeaderSelector (its InterProcessMutex on NAME) "
    "instead of its LeaderLatch.",
)


@click.command(cls=WrapsCommand)
@click.argument("name", callback=NAME)
@click.argument("command", nargs=-1, required=True, metavar="-- CMD [ARGS]...")
@click.option(
    "--value",
    help="What `coord leader` shows while this process leads (default: its host, pid "
    "and --identity, as JSON).",
)
@GRACE
@LAYOUT
@SELECTOR
@store_options
def elect(
    store: Store,
    name: str,
    command: tuple[str, ...],
    value: str | None,
    grace: float,
    layout: str,
    selector: bool,
) -> None:
    """Run CMD only while this process leads the election NAME.

    Campaigns (candidates lead in the order they joined; a spinner on a terminal shows
    who leads meanwhile), then runs CMD with COORD_ELECTION=NAME and COORD_FENCE=<term>
    in its environment; the fence strictly increases from term to term.

    If leadership is lost, CMD and every process it started get SIGTERM (SIGKILL after
    --grace seconds), one line goes to stderr, and coord campaigns again: CMD runs again
    when it leads again. When CMD exits on its own, coord resigns and exits with CMD's
    status. Ctrl-C or SIGTERM is passed on to them (exit status 130 or 143).

    \b
    Example, on every node of a pool:
        coord elect --value "$(hostname)" scheduler -- ./run-scheduler
    """
    run(
        lambda interrupt: _elect(
            store, name, command, value, grace, interrupt, layout, selector=selector
        )
    )


async def _elect(
    store: Store,
    name: str,
    command: Sequence[str],
    value: str | None,
    grace: float,
    interrupt: Interrupt,
    layout: str = "coord",
    *,
    selector: bool = False,
) -> int:
    async with store.connect() as client:
        election = client.election(name, layout=layout, selector=selector)
        payload = (value or json.dumps(client.identity)).encode()
        while True:
            campaign = election.campaign(payload)
            async with waiting(lambda: _campaigning(election)):
                term = await campaign.acquire()
            env = {"COORD_ELECTION": name, "COORD_FENCE": str(term.fence)}
            status, lost = await run_holding(campaign, term, command, env, grace, interrupt)
            if lost is None and status is not None:
                return status
            if status is not None:  # it ended by itself: done, never run again
                click.echo(f"coord: leadership lost, {lost_how(command, status)}: {lost}", err=True)
                return FAILURE
            click.echo(
                f"coord: leadership lost, {command[0]!r} stopped: {lost}; campaigning again",
                err=True,
            )


async def _campaigning(election: coord.Election) -> str:
    return f"campaigning for {election.name} (leader: {_show(await election.leader())})"


@click.command()
@click.argument("name", callback=NAME)
@click.option("--watch", is_flag=True, help="Follow every change until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@LAYOUT
@SELECTOR
@read_options
def leader(
    store: Store, name: str, watch: bool, as_json: bool, layout: str, selector: bool
) -> None:
    """Show who leads the election NAME: its value and term fence.

    Exits 1 if nobody leads (without --watch). With --watch, prints the leader, then a
    line at every change (a new leader, a new value, no leader) until Ctrl-C.
    With --json, each line is {"name": NAME, "leader": null | {"key", "value",
    "fence", "identity", "since"}}: value as text, identity the leader's host, pid and
    --identity name, since when it campaigned (Unix seconds; null if unknown).
    """
    run(
        lambda _: _leader(
            store, name, watch=watch, as_json=as_json, layout=layout, selector=selector
        )
    )


async def _leader(
    store: Store,
    name: str,
    *,
    watch: bool,
    as_json: bool,
    layout: str = "coord",
    selector: bool = False,
) -> int:
    async with store.connect() as client:
        election = client.election(name, layout=layout, selector=selector)
        if not watch:
            now = await election.leader()
            _print(name, now, as_json)
            return 0 if now is not None else FAILURE
        async for now in election.observe():
            _print(name, now, as_json)
    return 0  # pragma: no cover  (observe() never ends)


def _print(name: str, now: coord.Leader | None, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"name": name, "leader": _record(now)}))
    elif now is None:
        click.echo(f"{name}: no leader")
    else:
        click.echo(f"{name}: {_show(now)} (fence {now.fence})")


def _record(now: coord.Leader | None) -> dict[str, Any] | None:
    if now is None:
        return None
    value = now.value.decode(errors="replace")
    who = _who(now)
    return {"key": now.key, "value": value, "fence": now.fence, "identity": who, "since": now.since}


def _who(now: coord.Leader) -> dict[str, Any]:
    # (An entry of an older coord held only the value: its default value was JSON.)
    return identity_in(now.identity or parse_identity(now.value))


def _show(now: coord.Leader | None) -> str:
    """The leader as a person reads it: its value (unless it only repeats who leads, as a
    `coord elect` without --value does) and who leads."""
    if now is None:
        return "nobody"
    who = _who(now)
    value = repr(now.value.decode(errors="replace"))
    if not who:
        return value
    if identity_in(parse_identity(now.value)) == who:
        return show_identity(who)
    return f"{value} by {show_identity(who)}"
