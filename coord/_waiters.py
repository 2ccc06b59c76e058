"""Who waits and who holds: the identity each waiter key carries, and the queue as read.

Each waiter key of a mutex, semaphore or read-write lock holds a small JSON value saying
who registered it — host, pid, and the client's name given to ``connect(...,
identity=...)`` — so that ``await mutex.waiters()`` (and tools built on it) can show who
holds and who waits, in order, with fences.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._checks import check_str
from ._exceptions import ConfigurationError
from ._keys import fence_of

if TYPE_CHECKING:
    from .abc import Entry

__all__ = ["Waiter", "check_identity", "identity", "parse_identity", "waiter_value"]

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


def waiter_value(who: dict[str, Any], **extra: Any) -> bytes:
    """The value of a new waiter key: *who* registers it (and *extra*, what the recipe
    records), and ``since``, the wall-clock time of the registration (Unix seconds), so
    that tools can show how long each has waited or held."""
    record = {**who, **extra, "since": round(time.time(), 3)}
    return json.dumps(record, separators=(",", ":")).encode()


def parse_identity(value: bytes) -> dict[str, Any]:
    """The identity recorded in a waiter key's value; empty if it records none."""
    try:
        who = json.loads(value)
    except ValueError:
        return {}
    return who if isinstance(who, dict) else {}


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
    def _of(cls, entry: Entry, holding: bool) -> Waiter:
        who = parse_identity(entry.value)
        since = who.pop("since", None)
        if not isinstance(since, (int, float)) or isinstance(since, bool):
            since = None
        return cls(entry.key, fence_of(entry.revision), holding, who, since)
