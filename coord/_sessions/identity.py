"""Who waits and who holds: the identity each waiter key carries, and the queue as read.

Each waiter key of a mutex, semaphore or read-write lock holds a small JSON value saying
who registered it — host, pid, and the client's name given to ``connect(...,
identity=...)`` — so that ``await mutex.waiters()`` (and tools built on it) can show who
holds and who waits, in order, with fences. A group member's and an election candidate's
entry carry the same record beside the value the user gave (a member's in base64 in the
JSON, :func:`wrap`; a candidate's raw after it, :mod:`coord._election.leader`), so that
``group.members()`` and ``election.leader()`` say who, too.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._core.checks import check_str
from .._core.exceptions import ConfigurationError
from .._core.keys import fence_of

if TYPE_CHECKING:
    from ..abc import Entry

__all__ = [
    "Waiter",
    "Wrapped",
    "check_identity",
    "identity",
    "parse_identity",
    "since_of",
    "unwrap",
    "waiter_value",
    "waiter_value_size",
    "wrap",
    "wrapped_room",
]

MAX_IDENTITY_LENGTH = 128


def check_identity(name: object) -> str | None:
    """Return *name* if it is a valid client name (or None), else raise ConfigurationError
    (TypeError if it is neither a str nor None)."""
    if name is None:
        return None
    name = check_str(name, "identity")
    if not name or len(name) > MAX_IDENTITY_LENGTH or not name.isprintable():
        raise ConfigurationError(
            f"identity must be 1 to {MAX_IDENTITY_LENGTH} printable characters: {name!r}"
        )
    return name


def identity(name: str | None = None) -> dict[str, Any]:
    """Who this process is: host, pid, and the client's *name* if given."""
    who: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    if name:
        who["name"] = name
    return who


def waiter_value(who: dict[str, Any], *, since: float | None = None, **extra: Any) -> bytes:
    """The value of a new waiter key: *who* registers it (and *extra*, what the recipe
    records), and ``since``, the wall-clock time of the registration (Unix seconds, now
    unless given), so that tools can show how long each has waited or held."""
    record = {**who, **extra, "since": round(time.time(), 3) if since is None else since}
    return json.dumps(record, separators=(",", ":")).encode()


#: The widest registration time :func:`waiter_value` writes (until the year 2286): sizes
#: checked with it hold whatever the clock says when the value is written.
_WIDEST_TIME = 9_999_999_999.999


def waiter_value_size(who: dict[str, Any], **extra: Any) -> int:
    """The most bytes ``waiter_value(who, **extra)`` takes, whenever it is written (the
    same answer at every call: a size check must not pass a moment and fail the next)."""
    return len(waiter_value(who, since=_WIDEST_TIME, **extra))


def parse_identity(value: bytes) -> dict[str, Any]:
    """The identity recorded in a waiter key's value: the whole of it, or its first line
    (a candidate's entry holds its value after it); empty if it records none."""
    for text in (value, value.partition(b"\n")[0]):
        try:
            who = json.loads(text)
        except ValueError:
            continue
        return who if isinstance(who, dict) else {}
    return {}


def wrap(who: dict[str, Any], value: bytes, **extra: Any) -> bytes:
    """A waiter value (:func:`waiter_value`: *who*, *extra*, when) around a user's
    *value*, which goes in as base64."""
    return waiter_value(who, **extra, value=base64.b64encode(value).decode())


def wrapped_room(who: dict[str, Any], max_value_size: int, **extra: Any) -> int:
    """The largest user value that :func:`wrap` fits in *max_value_size* bytes (the
    record as this client writes it, JSON escapes included, the registration time at its
    widest; base64 takes 4 bytes for 3)."""
    return max((max_value_size - waiter_value_size(who, **extra, value="")) // 4 * 3, 0)


@dataclass(frozen=True)
class Wrapped:
    """What :func:`unwrap` read: who wrote the record (without ``since`` and the value),
    the user's value (None if the record holds none: a value written by something
    else), and when it was registered (None if it does not say)."""

    identity: dict[str, Any]
    value: bytes | None
    since: float | None


def unwrap(raw: bytes) -> Wrapped:
    """The record :func:`wrap` made of *raw*, as far as *raw* is one."""
    record = parse_identity(raw)
    encoded = record.pop("value", None)
    since = since_of(record.pop("since", None))
    try:
        value = base64.b64decode(encoded, validate=True) if isinstance(encoded, str) else None
    except (binascii.Error, ValueError):
        value = None
    return Wrapped(record, value, since)


def since_of(since: object) -> float | None:
    """A recorded registration time, if it is one (Unix seconds)."""
    if not isinstance(since, (int, float)) or isinstance(since, bool):
        return None
    return float(since)


@dataclass(frozen=True)
class Waiter:
    """One entry of a lock's queue, as read from the store.

    :ivar key: the waiter key
    :ivar fence: its fencing token (from its creation revision, as :attr:`Hold.fence`;
        a client in cohort mode hands one key's hold to several of its tasks in turn,
        with fences counting up from this one)
    :ivar holding: whether it holds (its turn has come), else it waits
    :ivar identity: who registered it: ``host``, ``pid``, ``name`` (when the client was
        given one); empty for keys written by something else
    :ivar since: when it registered (Unix seconds, the registering machine's clock), or
        None if the key does not say
    """

    key: str
    fence: int
    holding: bool
    identity: dict[str, Any] = field(default_factory=dict, compare=False)
    since: float | None = field(default=None, compare=False)

    @classmethod
    def _of(cls, entry: Entry, holding: bool, *, raw_fence: bool = False) -> Waiter:
        who = parse_identity(entry.value)
        since = since_of(who.pop("since", None))
        fence = entry.revision if raw_fence else fence_of(entry.revision)
        return cls(entry.key, fence, holding, who, since)
