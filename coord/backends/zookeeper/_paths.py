"""Where coord's keys live in the ZooKeeper tree, and how waiter nodes are named.

A key ``"orders/42/@<hex>"`` of the contract is the znode ``<root>/orders/42/@<hex>-<seq>``:
the waiter id (a fresh GUID per acquire attempt, Curator's protected mode) followed by the
10-digit sequence number that ZooKeeper appends to an EPHEMERAL_SEQUENTIAL node. The GUID
finds the node again after a create whose reply was lost; the sequence orders the queue.

In a long queue a waiter node is moved into a *shard* (``_waitqueue.py`` says when and why):
``<parent>/@<seq // SHARD:08x>/<waiter id>:<czxid:016x>-<seq>``, a container per block of
SHARD sequence numbers. Its name keeps the sequence (its place in the queue) and adds the
czxid of the node it was moved from (its fence); its key is the parent's prefix plus that
name, and :meth:`Paths.path` puts the shard directory back in.

The root is the URL's path (``zk://host/myapp`` -> ``/myapp``). coord prefixes paths
itself instead of using kazoo's chroot, so that a missing root is simply created (as a
container, like every parent) rather than being an error.
"""

from __future__ import annotations

import heapq
import operator
from dataclasses import dataclass

from ..._core.keys import WAITER_MARK
from .._common.limits import check_key

__all__ = [
    "SHARD",
    "Paths",
    "WaiterName",
    "fence_of_name",
    "is_sharded",
    "nearest_before",
    "parse_waiter",
    "sequence_of",
    "shard_dir",
    "shard_dirs",
    "shard_index",
    "sharded_name",
    "waiter_names",
    "waiters_before",
    "waiters_in_order",
]

_SEQUENCE_DIGITS = 10
#: Sequence numbers per shard directory.
SHARD = 256
_FENCE_DIGITS = 16
# ":<fence>-<sequence>" at the end of a shard node's name.
_SHARD_TAIL = 1 + _FENCE_DIGITS + 1 + _SEQUENCE_DIGITS
_sequence_digits = operator.itemgetter(slice(-_SEQUENCE_DIGITS, None))


@dataclass(frozen=True)
class WaiterName:
    """A parsed waiter node name: ``<waiter id>-<sequence>``."""

    name: str
    waiter_id: str
    sequence: int


def parse_waiter(name: str) -> WaiterName | None:
    """Parse a child name (of a queue's node, or of a shard); None if it is not a waiter
    node made by coord."""
    if not name.startswith(WAITER_MARK):
        return None
    waiter_id, dash, digits = name.rpartition("-")
    if not dash or len(digits) != _SEQUENCE_DIGITS or not digits.isdigit():
        return None
    if is_sharded(name):
        waiter_id = waiter_id[: -_FENCE_DIGITS - 1]
    return WaiterName(name, waiter_id, int(digits))


def is_sharded(name: str) -> bool:
    """Whether a waiter name is a shard node's (``<waiter id>:<fence>-<sequence>``)."""
    return len(name) > _SHARD_TAIL and name[-_SHARD_TAIL] == ":" and name[0] == WAITER_MARK


def sharded_name(name: str, czxid: int) -> str:
    """The shard node name of waiter node *name* created at *czxid*."""
    waiter_id, _, digits = name.rpartition("-")
    return f"{waiter_id}:{czxid:0{_FENCE_DIGITS}x}-{digits}"


def fence_of_name(name: str) -> int | None:
    """The fence a shard node's name carries, or None for any other name."""
    if not is_sharded(name):
        return None
    return int(name[-_SHARD_TAIL + 1 : -_SEQUENCE_DIGITS - 1], 16)


def shard_dir(sequence: int) -> str:
    """The name of the shard directory of *sequence* (a child of the queue's node)."""
    return f"{WAITER_MARK}{sequence // SHARD:08x}"


_SHARD_NAME = 9  # the length of a shard directory's name


def shard_index(name: str) -> int | None:
    """The block number of a shard directory's name, or None if it is not one."""
    if len(name) != _SHARD_NAME or name[0] != WAITER_MARK:
        return None
    try:
        return int(name[1:], 16)
    except ValueError:
        return None


def shard_dirs(children: list[str]) -> list[str]:
    """The shard directories among a queue node's *children*, in order. (The length is
    checked before :func:`shard_index` is called: a listing of thousands of waiters.)"""
    return sorted(d for d in children if len(d) == _SHARD_NAME and shard_index(d) is not None)


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
    before = waiters_before(children, mine, kind)
    if limit is None:
        before.sort(reverse=True)
    else:
        before = heapq.nlargest(limit, before)
    return [child for _, child in before]


def waiters_before(
    children: list[str], sequence: int, kind: str | None = None
) -> list[tuple[int, str]]:
    """``(sequence, name)`` of the waiter nodes among *children* before *sequence* (only
    those whose name starts with *kind*, if given), in listing order."""
    found = []
    for child in children:
        if kind is not None and not child.startswith(kind):
            continue
        s = sequence_of(child)
        if s is not None and s < sequence:
            found.append((s, child))
    return found


def waiters_in_order(children: list[str]) -> list[str]:
    """The names of the waiter nodes among *children*, in queue (sequence) order, with
    one name per sequence number: a node moved into its shard between two listings is
    in both, and its name in the shard is the current one.

    For the head of a queue of thousands of jobs, read again and again: the names are
    sorted by their last ten characters (the sequence, zero-padded) without parsing
    each one (a sixth of :func:`waiter_names`' time); names that are odd (no digits
    there, a sequence twice) take the slow path.
    """
    dash = slice(-_SEQUENCE_DIGITS - 1, -_SEQUENCE_DIGITS)
    found = [c for c in children if c[dash] == "-" and c[:1] == WAITER_MARK]
    found.sort(key=_sequence_digits)
    tails = list(map(_sequence_digits, found))
    if all(map(str.isdigit, tails)) and len(set(tails)) == len(tails):
        return found
    by_sequence: dict[int, str] = {}
    for waiter in waiter_names(children):
        if waiter.sequence not in by_sequence or is_sharded(waiter.name):
            by_sequence[waiter.sequence] = waiter.name
    return list(by_sequence.values())


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
        path = f"{self.root}/{check_key(key, 'ZooKeeper')}"
        slash = path.rfind("/")
        name = path[slash + 1 :]
        if is_sharded(name):
            return f"{path[:slash]}/{shard_dir(int(name[-_SEQUENCE_DIGITS:]))}/{name}"
        return path

    def key(self, path: str) -> str:
        """The key of a znode path under the root (a shard node's without its shard)."""
        key = path[len(self.root) + 1 :]
        head, slash, name = key.rpartition("/")
        above, _, shard = head.rpartition("/")
        if slash and is_sharded(name) and shard_index(shard) is not None:
            return f"{above}/{name}"
        return key

    @staticmethod
    def child(node: str, name: str) -> str:
        """The path of waiter node *name* of the queue whose node is *node* (in its
        shard, for a shard node's name)."""
        if is_sharded(name):
            return f"{node}/{shard_dir(int(name[-_SEQUENCE_DIGITS:]))}/{name}"
        return f"{node}/{name}"

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
