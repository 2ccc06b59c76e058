"""What ``coord status --layout kazoo|curator`` shows: the locks and elections of kazoo's
and Curator's recipes under a prefix, read from ZooKeeper's tree.

A walk from the prefix's node: a node whose children are a layout's contenders
(``<uuid hex>__lock__<seq>``, ``__rlock__``; ``_c_<uuid>-lock-<seq>``, ``-latch-``,
``__READ__``, ``__WRIT__``) is shown with them, in the peer's order, each with whether it
holds by the peer's rule, its node, its fence (czxid), its session (ephemeralOwner) and
its data (a coord client's identity, or the peer's identifier, id or IP address); the
walk goes on below the other children. A node whose ``leases`` child holds
``_c_<uuid>-lease-<seq>`` nodes is Curator's ``InterProcessSemaphoreV2``: shown with its
leases, then the waiters on its ``locks`` mutex (not as a mutex of its own). The kind of
each object is the layout's name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from coord._locks.curator_semaphore import LEASES, LOCKS, lease_contenders
from coord._locks.node_layouts import CURATOR_LEASE, layout_side
from coord._locks.node_turn import node_contenders
from coord._sessions.identity import parse_identity

from ._common import identity_in

if TYPE_CHECKING:
    import coord
    from coord._locks.node_layouts import Side

__all__ = ["read_nodes"]

#: The most nodes the walk lists (a status of a whole ensemble stays bounded).
MAX_NODES = 2000


def _side(layout: str, children: tuple[str, ...]) -> Side | None:
    """The side whose family the contenders among *children* are, if any."""
    for kind in ("write", "election", "mutex"):  # (a read-write lock's family first)
        side = layout_side(layout, kind)
        if any(_is_contender(side, child) for child in children):
            return side
    return None


def _is_contender(side: Side, child: str) -> bool:
    if side.layout == "kazoo":
        return bool(side.order([child]))
    # Curator sorts every child: a contender is one that its recipe made.
    return child.startswith("_c_") and any(marker in child for marker in side.family)


async def read_nodes(
    client: coord.Client, prefix: str, layout: str
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The peer layout's locks and elections under *prefix*, and the revision of each
    node listed (to watch from)."""
    backend = client.backend
    objects: list[dict[str, Any]] = []
    revisions: dict[str, int] = {}
    level, listed = [prefix], 0
    while level and listed < MAX_NODES:
        below = []
        for name in level:
            children = await backend.child_names(name + "/" if name else "")
            listed += 1
            revisions[name] = children.revision
            side = _side(layout, children.names)
            if side is not None and name:
                objects.append(await _object(backend, name, side))
            semaphore = None
            if layout == "curator" and side is None and name and "leases" in children.names:
                semaphore = await _semaphore(backend, name, revisions)
                if semaphore is not None:
                    objects.append(semaphore)
            below += [
                f"{name}/{child}" if name else child
                for child in children.names
                if side is None or not _is_contender(side, child)
                if semaphore is None or child not in ("leases", "locks")
                if name or child != "zookeeper"
            ]
        level = sorted(below)
    return objects, revisions


async def _object(backend: Any, name: str, side: Side) -> dict[str, Any]:
    found, _ = await node_contenders(backend, name + "/", side)
    entries = [_entry(side, entry, holding) for entry, holding in found]
    return {"name": name, "kind": side.layout, "entries": entries}


async def _semaphore(backend: Any, name: str, revisions: dict[str, int]) -> dict[str, Any] | None:
    """Curator's ``InterProcessSemaphoreV2`` at *name*, if ``leases`` holds its leases:
    the leases, then the waiters on its ``locks`` mutex (its limit if a coord client's
    lease records it: Curator's record none). The revisions of both nodes' listings go
    to *revisions* (to watch from)."""
    leases = await backend.child_names(name + "/" + LEASES)
    if not any(_is_contender(CURATOR_LEASE, child) for child in leases.names):
        return None
    revisions[name + "/leases"] = leases.revision
    revisions[name + "/locks"] = (await backend.child_names(name + "/" + LOCKS)).revision
    found, limit = await lease_contenders(backend, prefix=name + "/", limit=None)
    entries = [_entry(CURATOR_LEASE, entry, holding) for entry, holding in found]
    found_object: dict[str, Any] = {"name": name, "kind": "curator", "entries": entries}
    if limit is not None:
        found_object["limit"] = limit
    return found_object


def _entry(side: Side, entry: coord.abc.Entry, holding: bool) -> dict[str, Any]:
    who = identity_in(parse_identity(entry.value))
    child = entry.key.rpartition("/")[2]
    record: dict[str, Any] = {
        "key": entry.key,
        "fence": entry.revision,  # the czxid, as a peer reads it in the node's stat
        "holding": holding,
        "identity": who,
        "since": None,
        "session": f"{entry.lease:x}",
    }
    if len(side.family) > 1:  # a read-write lock's
        reader = side.side_of(child).marker in ("__rlock__", "__READ__")
        record["mode"] = "read" if reader else "write"
    if not who and entry.value:  # a peer's identifier, id or address
        record["value"] = entry.value.decode(errors="replace")
    return record
