"""Where coord's keys live in the ZooKeeper tree, and how waiter nodes are named.

A key ``"orders/42/@<hex>"`` of the contract is the znode ``<root>/orders/42/@<hex>-<seq>``:
the waiter id (a fresh GUID per acquire attempt, Curator's protected mode) followed by the
10-digit sequence number that ZooKeeper appends to an EPHEMERAL_SEQUENTIAL node. The GUID
finds the node again after a create whose reply was lost; the sequence orders the queue.

The root is the URL's path (``zk://host/myapp`` -> ``/myapp``). coord prefixes paths
itself instead of using kazoo's chroot, so that a missing root is simply created (as a
container, like every parent) rather than being an error.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..._keys import WAITER_MARK
from .._txn import check_key

__all__ = [
    "Paths",
    "WaiterName",
    "nearest_before",
    "parse_waiter",
    "sequence_of",
    "waiter_names",
]

_SEQUENCE_DIGITS = 10


@dataclass(frozen=True)
class WaiterName:
    """A parsed waiter node name: ``<waiter id>-<sequence>``."""

    name: str
    waiter_id: str
    sequence: int


def parse_waiter(name: str) -> WaiterName | None:
    """Parse a child name; None if it is not a waiter node made by coord."""
    if not name.startswith(WAITER_MARK):
        return None
    waiter_id, dash, digits = name.rpartition("-")
    if not dash or len(digits) != _SEQUENCE_DIGITS or not digits.isdigit():
        return None
    return WaiterName(name, waiter_id, int(digits))


def sequence_of(name: str) -> int | None:
    """The sequence number of a waiter node name, or None if it is not one. The cheap
    test of :func:`parse_waiter`, for the hot path: it runs over every child of a queue
    at every registration."""
    if name[:1] != WAITER_MARK or name[-_SEQUENCE_DIGITS - 1 : -_SEQUENCE_DIGITS] != "-":
        return None
    digits = name[-_SEQUENCE_DIGITS:]
    return int(digits) if digits.isdigit() and len(name) > _SEQUENCE_DIGITS + 2 else None


def nearest_before(
    children: list[str], name: str, limit: int | None, kind: str | None = None
) -> list[str] | None:
    """The waiter nodes among *children* that come before waiter *name*, nearest first
    (at most *limit*; only those whose name starts with *kind*, if given); None if *name*
    is not among them. O(n), without sorting the whole queue: only the nearest are
    ordered."""
    mine = sequence_of(name)
    if mine is None or name not in children:
        return None
    before = []
    for child in children:
        if kind is not None and not child.startswith(kind):
            continue
        sequence = sequence_of(child)
        if sequence is not None and sequence < mine:
            before.append((sequence, child))
    if limit is None:
        before.sort(reverse=True)
    else:
        before = heapq.nlargest(limit, before)
    return [child for _, child in before]


def waiter_names(children: list[str]) -> list[WaiterName]:
    """The waiter nodes among *children*, in queue (sequence) order.

    Other children (nested names such as ``orders/42/sub``, plain keys) are left out.
    """
    parsed = [w for w in map(parse_waiter, children) if w is not None]
    parsed.sort(key=lambda w: w.sequence)
    return parsed


class Paths:
    """Maps contract keys to znode paths under a root, and back.

    :param namespace: the URL's path without slashes (``"a/b"``), or ``""``
    """

    def __init__(self, namespace: str) -> None:
        self.root = "/" + namespace.strip("/") if namespace.strip("/") else ""

    def path(self, key: str) -> str:
        """The znode path of *key* (a key never starts or ends with ``/``).

        :raises ConfigurationError: for a key over MAX_KEY_SIZE bytes: every request
            goes through here, so none can carry one to the server
        """
        return f"{self.root}/{check_key(key, 'ZooKeeper')}"

    def key(self, path: str) -> str:
        """The key of a znode path under the root."""
        return path[len(self.root) + 1 :]

    def parent(self, prefix: str) -> str:
        """The znode whose children are the queue of *prefix* (``"orders/42/"``)."""
        return self.path(prefix.rstrip("/"))

    def split(self, key: str) -> tuple[str, str, str]:
        """``(prefix, parent path, child name)`` of a key ``"orders/42/@x-0000000001"``."""
        prefix, _, name = key.rpartition("/")
        return prefix + "/", self.path(prefix), name

    def ancestors(self, path: str) -> list[str]:
        """Every proper ancestor of *path*, from the top down (``/a``, ``/a/b``, ...)."""
        parts = path.strip("/").split("/")[:-1]
        return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]
