"""Names of coordination objects and the key layout under which they live.

A recipe object has a *name* such as ``"orders/42"``: slash-separated segments. Its waiters
live under the *prefix* ``"orders/42/"`` (always ending in ``/``, so that ``lock`` and
``lock2`` never share a range; etcd #6278), one key per acquire attempt.

Waiter ids start with ``@``, a character no name segment may start with, and backends list
only keys of the form ``<prefix>@...``. So the queue of ``"a"`` never contains the waiters
of ``"a/b"`` (a nested name would otherwise be listed as a waiter of its parent, and a
holder of ``a/b`` acquiring ``a`` would wait on itself).

Recipes keep what they need under names of their own: a queue ``N`` its jobs under
``N/_jobs``, its claims under ``N/_claims``; a partitioner its partitions' locks under
``N/_partitions/<p>``. Those segments start with ``_``, which no segment of a user's name
may start with, so a user's name never reaches into a recipe's (``coord lock emails/_jobs``
would otherwise show as a job of the queue ``emails``). They are made by
:func:`internal_name` only.
"""

from __future__ import annotations

import re
import uuid
from typing import TYPE_CHECKING

from .checks import check_str
from .exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "EXCLUSIVE_MARK",
    "FENCE_SHIFT",
    "WAITER_MARK",
    "check_name",
    "check_plain_key",
    "fence_of",
    "internal_name",
    "is_waiter",
    "names_of",
    "new_waiter_id",
    "prefix_of",
    "split_order",
    "waiter_id_of",
]

#: First character of every waiter id; never the first character of a name segment.
WAITER_MARK = "@"

MAX_NAME_LENGTH = 512

#: The first character of the segments recipes add to a name for their own keys
#: (``_jobs``, ``_partitions``...); never the first character of a user's segment.
INTERNAL_MARK = "_"

# A segment starts with a letter or a digit (never "_", "@" or "."), then word characters
# or a few punctuation marks that are safe in etcd keys, ZooKeeper paths and URLs. No
# whitespace, no control characters, no "/" inside a segment.
_SEGMENT = re.compile(r"[^\W_][\w.:=+,~-]*\Z")
# Segments of namespaces and of the recipes' own names may also start with "_".
_ANY_SEGMENT = re.compile(r"\w[\w.:=+,~-]*\Z")
_RESERVED = frozenset({"zookeeper"})


_RULE = {
    False: "must start with a letter or digit and contain only letters, digits and "
    "'_.:=+,~-' (segments that start with '_' are the recipes' own, such as a queue's "
    "'_jobs')",
    True: "must start with a letter, digit or '_' and contain only letters, digits and '_.:=+,~-'",
}


class _InternalName(str):
    """A name made by :func:`internal_name`: valid by construction."""

    __slots__ = ()


def internal_name(name: str, *parts: str) -> str:
    """The name ``name/part/...`` that a recipe keeps its own keys under; the first
    *part* starts with :data:`INTERNAL_MARK`, so no user's name can be the same.
    :func:`check_name` accepts it (and nothing else spelled so). Not for users.

    :raises ConfigurationError: if *name* is not a valid name
    """
    check_name(name)
    assert parts, "a recipe's name adds a segment of its own"
    assert parts[0].startswith(INTERNAL_MARK), parts
    assert all(_ANY_SEGMENT.match(part) for part in parts), parts
    return _InternalName("/".join((name, *parts)))


def check_name(name: object, *, what: str = "name", internal: bool = False) -> str:
    """Return *name* if it is a valid coordination name, else raise ConfigurationError.

    :param name: the name to check, e.g. ``"orders/42"``
    :param what: how to call it in the error message
    :param internal: let segments start with ``_`` too: for a namespace (a store's root
        for names, which holds names but is none), or a recipe's own name as a test or
        an operator's tool reads it
    :raises TypeError: if *name* is not a str
    :raises ConfigurationError: with a message that says what is wrong
    """
    if type(name) is _InternalName:
        return name
    name = check_str(name, what)
    if not name:
        raise ConfigurationError(f"{what} must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"{what} is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}"
        )
    for segment in name.split("/"):
        if not segment:
            raise ConfigurationError(
                f"{what} {name!r} has an empty segment (leading, trailing or double '/')"
            )
        if segment.lower() in _RESERVED:
            raise ConfigurationError(f"{what} {name!r} uses the reserved segment {segment!r}")
        if not (_ANY_SEGMENT if internal else _SEGMENT).match(segment):
            raise ConfigurationError(f"{what} {name!r}: segment {segment!r} {_RULE[internal]}")
    return name


def prefix_of(name: str) -> str:
    """The prefix under which the waiters of *name* are registered (ends with ``/``)."""
    return check_name(name) + "/"


#: The mark of an exclusive waiter (a mutex, a semaphore slot, a candidate, a writer).
#: Only a read lock's readers are marked otherwise (``@r``); a reader selects the
#: entries ahead of it by this mark, so whatever else shares its name counts as a
#: writer, and recipes mixed on one name exclude each other rather than both holding.
EXCLUSIVE_MARK = WAITER_MARK + "w"


def new_waiter_id() -> str:
    """A fresh waiter id: unique per acquire attempt, never per session (etcd #10756)."""
    return f"{EXCLUSIVE_MARK}{uuid.uuid4().hex}"


#: Hex digits of the order number that the etcd backend puts at the start of a waiter
#: key's last segment, before the waiter id: ``@<order>@w...`` (key order is queue order).
ORDER_DIGITS = 16
_ORDERED = re.compile(rf"@[0-9a-f]{{{ORDER_DIGITS}}}(?=@)")


def split_order(key: str) -> tuple[int | None, str]:
    """The order number (None if the key has none) and the waiter id of a waiter key."""
    last = key.rpartition("/")[2]
    found = _ORDERED.match(last)
    if found is None:
        return None, last
    return int(last[1 : found.end()], 16), last[found.end() :]


def waiter_id_of(key: str) -> str:
    """The waiter id a waiter key was registered with (plus the sequence suffix a
    ZooKeeper name ends with): its last segment, without etcd's order number. Select
    waiters by kind with ``waiter_id_of(key).startswith(kind)``."""
    return split_order(key)[1]


#: What a backend's suffix after a waiter id starts with (:meth:`coord.abc.Backend.
#: register`); an id of :func:`new_waiter_id` contains neither.
SUFFIX_MARKS = ("-", ":")


def new_waiter_id_of(key: str) -> str:
    """The id of :func:`new_waiter_id` that the waiter key *key* was registered with,
    whatever the store added to it: the order number before it (:func:`waiter_id_of`
    drops it) and the suffix after it (from the first of :data:`SUFFIX_MARKS`). The same
    for the life of the entry on every store, also when a store renames the entry."""
    waiter = waiter_id_of(key)
    ends = [at for mark in SUFFIX_MARKS if (at := waiter.find(mark)) >= 0]
    return waiter[: min(ends)] if ends else waiter


def _is_waiter_segment(last: str) -> bool:
    # A bare mark is no waiter: it is the etcd backend's queue tail (see its _waitqueue).
    return last.startswith(WAITER_MARK) and last != WAITER_MARK


def is_waiter(key: str, prefix: str | None = None) -> bool:
    """Whether *key* is a waiter key (of *prefix*, if given): its last segment starts
    with ``@``."""
    parent, _, last = key.rpartition("/")
    if prefix is not None and parent + "/" != prefix:
        return False
    return _is_waiter_segment(last)


def check_plain_key(key: str, what: str) -> None:
    """Refuse to create a waiter key (or a key under one) by a plain write: only
    ``register`` makes them."""
    check_str(key, f"{what}: the key")
    if any(segment.startswith(WAITER_MARK) for segment in key.split("/")):
        raise ConfigurationError(
            f"{what} {key!r}: keys with a segment starting with {WAITER_MARK!r} are waiter "
            "entries; only register() creates them"
        )


def names_of(keys: Iterable[str], prefix: str) -> list[str]:
    """The names (sorted, distinct) whose waiter keys are among *keys*, at or under
    *prefix* (see :meth:`coord.abc.Backend.names`)."""
    names = set()
    for key in keys:
        name, _, last = key.rpartition("/")
        if _is_waiter_segment(last) and (
            not prefix or name == prefix or name.startswith(prefix + "/")
        ):
            names.add(name)
    return sorted(names)


#: A fence is ``revision << FENCE_SHIFT | seq``: the store revision that created the
#: waiter key, then the holder's place among the tasks one client hands the lock to in a
#: row without a round trip (cohort mode; 0 for the key's first holder). Strict and
#: cohort holds of one lock thus compare: a later key always wins over every local
#: handoff of an earlier one. A job's claim puts in *seq* its number among the claims
#: made by one transaction (``queue.run()`` groups its workers' joint claims), which
#: share the revision.
FENCE_SHIFT = 16


def fence_of(revision: int, seq: int = 0) -> int:
    """The fencing token of the *seq*-th holder of the key created at *revision*."""
    return revision << FENCE_SHIFT | seq
