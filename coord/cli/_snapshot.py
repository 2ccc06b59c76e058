"""What ``coord status`` shows: every lock, election and queue under a prefix, read from
the store, as plain data (the ``--json`` schema, version 2).

The kind of a name is read from its entries, since the store records no type: readers'
keys (``@r``) make a read-write lock, a recorded ``limit`` a semaphore, a recorded
candidate role (or no identity at all: a foreign writer) an election, another recorded
identity a mutex (or, with a joined ``value``, a group), the
``_jobs``/``_claims``/``_dead``/``_idle``/``_ids`` names of one parent a queue, and the
``_assignment`` and ``_partitions/<p>`` names of one parent a partitioner (its members
are the parent's entries).

With the etcd layout (``coord status --layout etcd``) it lists instead the locks and
elections of etcd's Go ``client/v3/concurrency`` layout: keys ``<name>/<lease id in
hex>`` bound to that very lease (mutex.go, election.go), oldest first: the holder or
leader, then the waiters. The two layouts cannot be told apart from a Go peer's keys, so
their kind is ``etcd``. With kazoo's or Curator's layout (``--layout kazoo|curator``) it
lists those recipes' locks and elections (:mod:`._node_snapshot`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from coord._core import keys as _keys
from coord._core.keys import WAITER_MARK, fence_of, waiter_id_of
from coord._election.leader import CANDIDATE, candidate_value
from coord._jobs import records as _records
from coord._jobs.claim import seq_of
from coord._membership.group import Member
from coord._membership.member import newest_record, records_of
from coord._membership.partition import lock_name
from coord._sessions.identity import parse_identity

from ._common import identity_in
from ._node_snapshot import read_nodes

if TYPE_CHECKING:
    import coord
    from coord._locks.task_lock import TaskLock
    from coord.abc import Entry

__all__ = ["SCHEMA_VERSION", "Snapshot", "read"]

SCHEMA_VERSION = 2
_QUEUE_PARTS = ("_jobs", "_claims", "_dead", "_idle", "_ids")
_PARTITIONER_PART = re.compile(r"(?P<parent>.+)/(_assignment|_partitions/(?P<p>[0-9]+))\Z")


class Snapshot:
    """The objects read (JSON-ready dicts), and the store revision at which each waiter
    prefix was read (to watch from)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.objects: list[dict[str, Any]] = []
        self.revisions: dict[str, int] = {}
        self.names: list[str] = []
        #: The revision of the read of the etcd layout's keys (None: not read).
        self.etcd_revision: int | None = None
        #: The nodes listed for kazoo's or Curator's layout, with their revisions.
        self.revisions_of_nodes: dict[str, int] = {}

    def as_json(self) -> dict[str, Any]:
        return {"version": SCHEMA_VERSION, "prefix": self.prefix, "objects": self.objects}


async def read(client: coord.Client, prefix: str, *, layout: str = "coord") -> Snapshot:
    """Read everything under *prefix*. A checkpoint; a few reads per name (one read of
    every key under *prefix* in the etcd layout)."""
    snapshot = Snapshot(prefix)
    if layout == "etcd":
        await _etcd_layout(client, snapshot)
        return snapshot
    if layout in ("kazoo", "curator"):
        snapshot.objects, snapshot.revisions_of_nodes = await read_nodes(client, prefix, layout)
        return snapshot
    snapshot.names = await client.backend.names(prefix)
    queues = sorted(
        {n.rpartition("/")[0] for n in snapshot.names if n.rpartition("/")[2] in _QUEUE_PARTS}
    )
    parts = {n: m for n in snapshot.names if (m := _PARTITIONER_PART.match(n))}
    partitioners = sorted({m["parent"] for m in parts.values()})
    for name in snapshot.names:
        parent, _, last = name.rpartition("/")
        if (parent in queues and last in _QUEUE_PARTS) or name in parts or name in partitioners:
            continue
        snapshot.objects.append(await _lock(client, name, snapshot.revisions))
    for name in queues:
        snapshot.objects.append(await _queue(client, name, snapshot.revisions))
    for name in partitioners:
        held = sorted(int(m["p"]) for m in parts.values() if m["parent"] == name and m["p"])
        snapshot.objects.append(await _partitioner(client, name, held, snapshot.revisions))
    snapshot.objects.sort(key=lambda o: str(o["name"]))
    return snapshot


async def _lock(client: coord.Client, name: str, revisions: dict[str, int]) -> dict[str, Any]:
    listing = await client.backend.entries(name + "/")
    revisions[name + "/"] = listing.revision
    kind, limit, lock = _kind_of(client, name, listing.entries)
    values = {e.key: e.value for e in listing.entries}
    members = {e.key: Member._of(e) for e in listing.entries}
    entries = []
    for waiter in await lock.waiters():
        record: dict[str, Any] = {
            "key": waiter.key,
            "fence": waiter.fence,
            "holding": waiter.holding,
            "identity": identity_in(waiter.identity),
            "since": waiter.since,
        }
        if kind == "rwlock":
            reader = waiter_id_of(waiter.key).startswith(WAITER_MARK + "r")
            record["mode"] = "read" if reader else "write"
        if kind == "election":
            record["value"] = candidate_value(values.get(waiter.key, b"")).decode(errors="replace")
        if kind == "group":  # every member is in; its value is what it joined with
            record["holding"] = True
            record["value"] = members[waiter.key].value.decode(errors="replace")
        entries.append(record)
    found: dict[str, Any] = {"name": name, "kind": kind, "entries": entries}
    if limit is not None:
        found["limit"] = limit
    return found


def _kind_of(
    client: coord.Client, name: str, entries: tuple[Entry, ...]
) -> tuple[str, int | None, TaskLock]:
    """The kind, the semaphore limit, and a recipe object that reads the queue by the
    kind's rule."""
    who = [parse_identity(e.value) for e in entries]
    if any(waiter_id_of(e.key).startswith(WAITER_MARK + "r") for e in entries):
        return "rwlock", None, client.rwlock(name).write
    limits = [w["limit"] for w in who if isinstance(w.get("limit"), int)]
    if limits:
        return "semaphore", max(limits), client.semaphore(name, max(limits))
    mutex = who and all("pid" in w and w.get("role") != CANDIDATE for w in who)
    if mutex and all("value" in w for w in who):
        return "group", None, client.mutex(name)
    kind = "mutex" if mutex else "election"
    return kind, None, client.mutex(name)


async def _queue(client: coord.Client, name: str, revisions: dict[str, int]) -> dict[str, Any]:
    backend = client.backend
    for part in ("_jobs", "_dead"):
        revisions[f"{name}/{part}/"] = (await backend.entries(f"{name}/{part}/", limit=1)).revision
    claims = await backend.entries(f"{name}/_claims/")
    revisions[f"{name}/_claims/"] = claims.revision
    idle = await backend.entries(f"{name}/_idle/")
    revisions[f"{name}/_idle/"] = idle.revision
    stats = await client.queue(name).stats()
    return {
        "name": name,
        "kind": "queue",
        "depth": stats.depth,
        "in_flight": stats.in_flight,
        "parked": stats.parked,
        "dead": stats.dead,
        "idle_clients": len(idle.entries),
        # (Not the presence of lookers in contention: no job's claim.)
        "claims": [_claim(e) for e in claims.entries if not _records.is_looker(e.key)],
    }


def _claim(entry: Entry) -> dict[str, Any]:
    who = parse_identity(entry.value)
    job = who.pop("job", None) or _records.id_of(entry.key)
    fence = fence_of(entry.revision, seq_of(entry))  # (as the worker's job.fence)
    return {"job": job, "fence": fence, "identity": identity_in(who)}


async def _partitioner(
    client: coord.Client, name: str, held: list[int], revisions: dict[str, int]
) -> dict[str, Any]:
    """A partitioner: its members, its stored assignment, and each held partition's owner
    (the head of its lock's queue) with the partition's fence."""
    backend = client.backend
    members = await backend.entries(name + "/")
    revisions[name + "/"] = members.revision
    records = await backend.entries(records_of(name))
    revisions[records_of(name)] = records.revision
    record = newest_record(records)
    owners: list[dict[str, Any]] = []
    for partition in held:
        prefix = _keys.prefix_of(lock_name(name, partition))
        head = await backend.entries(prefix, limit=1)
        revisions[prefix] = head.revision
        owners.extend(
            {
                "partition": partition,
                "fence": fence_of(entry.revision),
                "identity": identity_in(parse_identity(entry.value)),
            }
            for entry in head.entries
        )
    return {
        "name": name,
        "kind": "partitioner",
        "partitions": record.partitions if record else None,
        "generation": record.generation if record else None,
        "members": [_member(Member._of(entry)) for entry in members.entries],
        "owners": owners,
    }


_LEASE_HEX = re.compile(r"[0-9a-f]{1,16}\Z")


async def _etcd_layout(client: coord.Client, snapshot: Snapshot) -> None:
    """The Go layout's locks and elections under the snapshot's prefix, by name."""
    listing = await client.backend.keys_by_creation(snapshot.prefix and snapshot.prefix + "/")
    snapshot.etcd_revision = listing.revision
    by_name: dict[str, list[Entry]] = {}
    for entry in listing.entries:
        name, _, last = entry.key.rpartition("/")
        if name and _LEASE_HEX.match(last) and entry.lease == int(last, 16):
            by_name.setdefault(name, []).append(entry)
    for name, entries in sorted(by_name.items()):
        shown = [_etcd_entry(entry, holding=not i) for i, entry in enumerate(entries)]
        snapshot.objects.append({"name": name, "kind": "etcd", "entries": shown})


def _etcd_entry(entry: Entry, *, holding: bool) -> dict[str, Any]:
    who = identity_in(parse_identity(entry.value))
    record: dict[str, Any] = {
        "key": entry.key,
        "fence": entry.revision,  # the create revision, as a Go holder has it
        "holding": holding,
        "identity": who,
        "since": None,
        "lease": f"{entry.lease:x}",
    }
    if not who and entry.value:  # a candidate's value (a coord client records who)
        record["value"] = entry.value.decode(errors="replace")
    return record


def _member(member: Member) -> dict[str, Any]:
    return {
        "id": member.id,
        "fence": member.fence,
        "identity": identity_in(member.identity),
        "value": member.value.decode(errors="replace"),
        "since": member.since,
    }
