"""Queued jobs as stored: one durable entry per job, its state in a small header.

A job's entry value is ``b"cq1" + <4-byte header length> + <JSON header> + <payload>``.
The header holds what changes while the job waits (attempt, backoff, parked, which claim
holds it); the payload is the caller's bytes, untouched. Every change of the header is a
guarded :class:`~coord.abc.Update` of the whole value, so a payload must leave room for
the header within the store's value limit: :func:`check_put` says so at ``put``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ._checks import check_bytes
from ._exceptions import ConfigurationError

if TYPE_CHECKING:
    from .abc import Entry

__all__ = [
    "MAX_KEY_LENGTH",
    "DeadLetter",
    "JobRef",
    "State",
    "check_key",
    "check_payload",
    "decode",
    "encode",
    "id_of",
]

_MAGIC = b"cq1"
_LENGTH = struct.Struct(">I")
MAX_KEY_LENGTH = 256
#: Room kept for the header when checking a payload's size (a key of MAX_KEY_LENGTH
#: characters, each up to 4 bytes in UTF-8 and escaped, plus an error message).
_HEADER_ROOM = 4 * 1024 + 6 * MAX_KEY_LENGTH


@dataclass(frozen=True)
class JobRef:
    """A job as put: ``await queue.put(...)`` returns it.

    :ivar id: the job's id (for :meth:`Queue.requeue` and logs)
    :ivar key: its ordering key, or None
    :ivar seq: its place in the queue: strictly increasing in put order (the creation
        revision of its entry)
    """

    id: str
    key: str | None
    seq: int


@dataclass(frozen=True)
class DeadLetter:
    """A job moved to the dead-letter list after its last attempt failed.

    :ivar id: the job's id (pass it to :meth:`Queue.requeue`)
    :ivar key: its ordering key, or None
    :ivar payload: its payload
    :ivar attempts: how many attempts failed
    :ivar error: the last attempt's error, as text
    :ivar seq: when it was dead-lettered (creation revision of the dead letter)
    """

    id: str
    key: str | None
    payload: bytes
    attempts: int
    error: str | None
    seq: int


@dataclass(frozen=True)
class State:
    """A job's header: everything but the payload."""

    id: str
    key: str | None = None
    attempt: int = 0
    not_before: float = 0.0
    parked: bool = False
    claim: str | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def with_(self, **changes: Any) -> State:
        return replace(self, **changes)


def id_of(key: str) -> str:
    """The job id in an entry key ``.../@j<id>[-<sequence>]`` (also claims, ``@c``)."""
    last = key.rpartition("/")[2]
    return last[2:].partition("-")[0]


def encode(state: State, payload: bytes) -> bytes:
    header = {
        "id": state.id,
        "key": state.key,
        "attempt": state.attempt,
        "not_before": state.not_before,
        "parked": state.parked,
        "claim": state.claim,
        "error": state.error,
        **state.extra,
    }
    raw = json.dumps(header, separators=(",", ":")).encode()
    return _MAGIC + _LENGTH.pack(len(raw)) + raw + payload


def decode(entry: Entry) -> tuple[State, bytes]:
    """The header and payload of a job entry. An entry that is not a job (written by
    something else) decodes as a parked job with that error, so that it is neither
    handed out nor silently dropped."""
    value = entry.value
    try:
        if not value.startswith(_MAGIC):
            raise ValueError("no job header")
        (length,) = _LENGTH.unpack_from(value, len(_MAGIC))
        start = len(_MAGIC) + _LENGTH.size
        header = json.loads(value[start : start + length])
        known = {"id", "key", "attempt", "not_before", "parked", "claim", "error"}
        state = State(
            id=str(header["id"]),
            key=header.get("key"),
            attempt=int(header.get("attempt", 0)),
            not_before=float(header.get("not_before", 0.0)),
            parked=bool(header.get("parked", False)),
            claim=header.get("claim"),
            error=header.get("error"),
            extra={k: v for k, v in header.items() if k not in known},
        )
        return state, value[start + length :]
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        return State(id=id_of(entry.key), parked=True, error=f"not a job: {exc}"), value


def check_key(key: object) -> str | None:
    """Return a valid ordering key (or None), else raise."""
    if key is None:
        return None
    if not isinstance(key, str):
        raise TypeError(f"a job key must be a str or None, not {type(key).__name__}")
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise ConfigurationError(
            f"a job key must be 1 to {MAX_KEY_LENGTH} printable characters, got {key!r:.80}"
        )
    return key


def check_payload(payload: object, limit: int) -> bytes:
    """Return *payload* if it is bytes that fit the store with room for the header."""
    data = check_bytes(payload, "a job payload")
    room = limit - _HEADER_ROOM
    if len(data) > room:
        raise ConfigurationError(
            f"the job payload is {len(data):,} bytes; this store takes at most {room:,} per "
            "job (every put, claim and ack rewrites it through consensus: store large data "
            "elsewhere and queue a reference)"
        )
    return data
