"""``coord group NAME``: the members of a group, now or as they change."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from ._common import NAME, identity_in, run, show_identity
from ._store import Store, read_options

if TYPE_CHECKING:
    import coord

__all__ = ["group"]


@click.command()
@click.argument("name", callback=NAME)
@click.option("--watch", is_flag=True, help="Follow every change until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@read_options
def group(store: Store, name: str, watch: bool, as_json: bool) -> None:
    """Show the members of the group NAME, in join order: who joined, its value, when,
    and its fence.

    Exits 1 if the group has no member (without --watch). With --watch, prints the
    members, then again at every change (a join, a leave, a lost session) until Ctrl-C.
    With --json, each line is {"name": NAME, "members": [{"id", "value", "since",
    "fence", "identity"}]}: value as text (invalid UTF-8 replaced), since in Unix
    seconds, identity the host/pid/name that joined.
    """
    run(lambda _: _group(store, name, watch=watch, as_json=as_json))


async def _group(store: Store, name: str, *, watch: bool, as_json: bool) -> int:
    async with store.connect() as client:
        members_of = client.group(name)
        if not watch:
            members = await members_of.members()
            _print(name, members, as_json)
            return 0 if members else 1
        async for members in members_of.watch():
            _print(name, members, as_json)
    return 0  # pragma: no cover  (watch() never ends)


def _print(name: str, members: list[coord.Member], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"name": name, "members": [_record(m) for m in members]}))
        return
    if not members:
        click.echo(f"{name}: no members")
        return
    click.echo(f"{name}: {len(members)} member{'s' if len(members) > 1 else ''}")
    for member in members:
        value = member.value.decode(errors="replace")
        who = show_identity(identity_in(member.identity))
        click.echo(f"  {who}: {value!r} (fence {member.fence})")


def _record(member: coord.Member) -> dict[str, Any]:
    return {
        "id": member.id,
        "value": member.value.decode(errors="replace"),
        "since": member.since,
        "fence": member.fence,
        "identity": identity_in(member.identity),
    }
