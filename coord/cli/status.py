"""``coord status [PREFIX]``: who holds and who waits, for every lock, election and queue."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

import anyio
import click

import coord

from . import _snapshot
from ._common import count, run, show_identity
from ._store import Store, read_options

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rich.table import Table

__all__ = ["status"]

#: How often --watch re-reads the list of names, to find names that appear (the store
#: contract has no recursive watch); changes to the names already shown wake it at once.
RESCAN = 2.0


@click.command()
@click.argument("prefix", default="")
@click.option("--json", "as_json", is_flag=True, help="JSON for scripts (the schema is above).")
@click.option("--watch", is_flag=True, help="Show it again at every change, until Ctrl-C.")
@click.option(
    "--layout",
    type=click.Choice(["coord", "etcd", "kazoo", "curator"]),
    default="coord",
    show_default=True,
    help="'etcd': the locks and elections of etcd's Go layout (`etcdctl lock`/`elect`, "
    "`coord lock --layout etcd`) instead of coord's; 'kazoo', 'curator': those of kazoo's "
    "and Curator's recipes on ZooKeeper.",
)
@read_options
def status(store: Store, prefix: str, as_json: bool, watch: bool, layout: str) -> None:
    """List the mutexes, semaphores, read-write locks, elections, groups, queues and
    partitioners at or under
    PREFIX (default: everything), with who holds and who waits, in order: fence and
    identity (host, pid, --identity) of each, and how long ago it registered (for a
    waiter, how long it has waited; for a holder, its wait and its hold so far: the
    store does not record the grant), by the registering machine's clock.

    --watch re-reads at every change of what is shown (by watching, not polling) and
    re-reads the list of names every 2 s to find new ones.

    \b
    --json prints {"version": 2, "prefix": PREFIX, "objects": [...]} (one line per
    reading with --watch). Each object has "name" and "kind":
      mutex, semaphore, rwlock, election: "entries", in queue order, each
        {"key", "fence", "holding": bool, "identity": {"host", "pid", "name"?},
        "since": Unix time of the registration, or null},
        plus "mode" ("read"/"write") in an rwlock, "value" (text) in an election;
        a semaphore also has "limit";
      group: "entries" as above (every one "holding"), with "value" (text): the
        members in join order;
      queue: "depth", "in_flight", "parked", "dead", "idle_clients" (clients whose
        workers wait for a job), and "claims":
        [{"job", "fence", "identity"}];
      partitioner: "partitions" and "generation" (of the stored assignment, or
        null), "members": [{"id", "fence", "identity", "value", "since"}] in join
        order, and "owners": [{"partition", "fence", "identity"}], the holder of
        each partition's lock, by partition;
      etcd (with --layout etcd): "entries" as for a mutex, oldest key first (the
        holder or leader), each also with "lease" (hex) and, for a key that records
        no identity but a value (an election's candidate), "value";
      kazoo, curator (with --layout kazoo|curator): "entries" in the peer's order,
        each also with "session" (hex), "value" as for etcd, and "mode" in a
        read-write lock; the fence is the node's czxid. A Curator semaphore
        (InterProcessSemaphoreV2) lists its leases, then the waiters on its "locks"
        mutex, and has "limit" if a coord client's lease records it.
    """
    run(lambda _: _status(store, prefix, as_json=as_json, watch=watch, layout=layout))


async def _status(
    store: Store, prefix: str, *, as_json: bool, watch: bool, layout: str = "coord"
) -> int:
    prefix = prefix.strip("/")
    async with store.connect() as client:
        if not watch:
            _print(await _snapshot.read(client, prefix, layout=layout), as_json=as_json)
            return 0
        live = _live() if sys.stdout.isatty() and not as_json else None
        with live or _no_live():
            while True:
                snapshot = await _snapshot.read(client, prefix, layout=layout)
                if live is not None:
                    live.update(_table(snapshot), refresh=True)
                else:
                    _print(snapshot, as_json=as_json, stamp=True)
                await _changed(client, snapshot)


def _print(snapshot: _snapshot.Snapshot, *, as_json: bool, stamp: bool = False) -> None:
    if as_json:
        click.echo(json.dumps(snapshot.as_json(), indent=None if stamp else 2))
    elif sys.stdout.isatty() and snapshot.objects:
        from rich.console import Console

        Console().print(_table(snapshot))
    else:
        if stamp:
            click.echo(f"--- {time.strftime('%H:%M:%S')}")
        click.echo("\n".join(_lines(snapshot)) or _nothing(snapshot.prefix))


def _nothing(prefix: str) -> str:
    return f"nothing under {prefix}/" if prefix else "nothing in the store"


def _lines(snapshot: _snapshot.Snapshot) -> Iterator[str]:
    """Plain text: a line per object, then a line per entry or claim."""
    for obj in snapshot.objects:
        if obj["kind"] == "queue":
            yield (
                f"queue {obj['name']}: {count(obj['depth'], 'job')}, {obj['in_flight']} in "
                f"flight, {obj['parked']} parked, {obj['dead']} dead, "
                f"{count(obj['idle_clients'], 'idle client')}"
            )
            for claim in obj["claims"]:
                yield f"  claims  fence {claim['fence']}  job {claim['job']}  {_who(claim)}"
            continue
        if obj["kind"] == "partitioner":
            yield from _partitioner_lines(obj)
            continue
        limit = f" (limit {obj['limit']})" if "limit" in obj else ""
        yield f"{obj['kind']} {obj['name']}{limit}"
        for entry in obj["entries"]:
            age = _age(entry)
            age = f"  (registered {age} ago)" if age else ""
            yield f"  {_state(obj, entry):<6}  fence {entry['fence']}  {_who(entry)}{age}"


def _partitioner_lines(obj: dict[str, Any]) -> Iterator[str]:
    size = f"{obj['partitions']} partitions" if obj["partitions"] else "no assignment"
    owned = count(len(obj["owners"]), "owned partition")
    yield f"partitioner {obj['name']} ({size}, {count(len(obj['members']), 'member')}, {owned})"
    for member in obj["members"]:
        yield f"  member  fence {member['fence']}  {_who(member)}"
    for owner in obj["owners"]:
        yield f"  owns {owner['partition']:<4}  fence {owner['fence']}  {_who(owner)}"


def _state(obj: dict[str, Any], entry: dict[str, Any]) -> str:
    if obj["kind"] == "group":
        return "member"
    if obj["kind"] == "election":
        return "leads" if entry["holding"] else "waits"
    mode = f"/{entry['mode'][0]}" if "mode" in entry else ""
    return ("holds" if entry["holding"] else "waits") + mode


def _age(entry: dict[str, Any]) -> str:
    """How long ago the entry registered, e.g. ``4.2s`` or ``3m05s``; "" if unknown."""
    since = entry.get("since")
    if since is None:
        return ""
    seconds = max(time.time() - since, 0.0)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def _who(entry: dict[str, Any]) -> str:
    """Who registered *entry*, and the value it gave (a candidate's, a member's)."""
    value = repr(entry["value"]) if "value" in entry else ""
    if "lease" in entry:  # the etcd layout: which session (a Go peer records nobody)
        value = f"lease {entry['lease']}  {value}".rstrip()
    if "session" in entry:  # kazoo's and Curator's layouts: which ZooKeeper session
        value = f"session {entry['session']}  {value}".rstrip()
    if not entry.get("identity"):
        return value or "unknown"
    who = show_identity(entry["identity"])
    return f"{who}  {value}" if value else who


def _table(snapshot: _snapshot.Snapshot) -> Table:
    from rich.table import Table

    title = f"coord status {snapshot.prefix or '(everything)'}"
    if not snapshot.objects:
        title += ": nothing"
    table = Table(title=title, expand=False)
    for column in ("name", "kind", "state", "fence", "who", "registered"):
        table.add_column(column)
    for obj in snapshot.objects:
        if obj["kind"] == "queue":
            jobs = count(obj["depth"], "job")
            summary = f"{jobs}, {obj['in_flight']} in flight, {obj['dead']} dead"
            table.add_row(obj["name"], "queue", summary, "", f"{obj['idle_clients']} idle", "")
            for claim in obj["claims"]:
                table.add_row(
                    "", "", f"claims {claim['job'][:8]}", str(claim["fence"]), _who(claim), ""
                )
            continue
        if obj["kind"] == "partitioner":
            rows = [("member", m) for m in obj["members"]]
            rows += [(f"owns {o['partition']}", o) for o in obj["owners"]]
            for i, (state, entry) in enumerate(rows or [("no members", {})]):
                name, kind = (obj["name"], "partitioner") if i == 0 else ("", "")
                table.add_row(name, kind, state, str(entry.get("fence", "")), _who(entry), "")
            continue
        for i, entry in enumerate(obj["entries"]):
            style = "bold green" if entry["holding"] else "yellow"
            state = f"[{style}]{_state(obj, entry)}[/]"
            name, kind = (obj["name"], obj["kind"]) if i == 0 else ("", "")
            age = _age(entry)
            table.add_row(name, kind, state, str(entry["fence"]), _who(entry), age and f"{age} ago")
    return table


def _live() -> Any:
    from rich.live import Live

    return Live(auto_refresh=False)


def _no_live() -> Any:
    from contextlib import nullcontext

    return nullcontext()


async def _changed(client: coord.Client, snapshot: _snapshot.Snapshot) -> None:
    """Return at the first change of what *snapshot* shows, or when the names change."""
    backend = client.backend
    async with anyio.create_task_group() as tg:

        async def watch(prefix: str, revision: int) -> None:
            try:
                async with backend.watch(prefix, revision=revision) as changes:
                    async for _ in changes:
                        break
            except coord.ResyncNeeded:
                pass
            tg.cancel_scope.cancel()

        async def rescan() -> None:
            while True:
                await anyio.sleep(RESCAN)
                if await backend.names(snapshot.prefix) != snapshot.names:
                    tg.cancel_scope.cancel()

        async def keys(start: str, revision: int) -> None:  # any key (child) under it
            await backend.wait_keys_changed(start, revision=revision)
            tg.cancel_scope.cancel()

        for prefix, revision in snapshot.revisions.items():
            tg.start_soon(watch, prefix, revision)
        for name, revision in snapshot.revisions_of_nodes.items():
            tg.start_soon(keys, name and name + "/", revision)
        if snapshot.etcd_revision is not None:
            tg.start_soon(keys, snapshot.prefix and snapshot.prefix + "/", snapshot.etcd_revision)
        elif not snapshot.revisions_of_nodes:
            tg.start_soon(rescan)
