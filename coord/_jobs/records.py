"""Queued jobs as stored: one durable entry per job, its state in a small header.

A job's entry value is ``b"cq1" + <4-byte header length> + <JSON header> + <payload>``.
The header holds what changes while the job waits (attempt, backoff, parked, which claim
holds it); the payload is the caller's bytes, untouched. Every change of the header is a
guarded :class:`~coord.abc.Update` of the whole value, so a payload must leave room for
the header within the store's value limit: :func:`check_payload` says so at ``put``.

The header's room (:data:`HEADER_ROOM`) is that of the largest header coord writes: the
longest key, every field at its widest, and a failure message cut to
:data:`MAX_ERROR_SIZE` bytes *as stored* (JSON escapes a non-ASCII character as 6 or 12
bytes, so a cut by characters could not bound it). So a job that ``put`` accepted can be
claimed, retried, parked and dead-lettered whatever its body raised.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from .._core.checks import check_bytes
from .._core.exceptions import ConfigurationError
from .._core.keys import waiter_id_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._locks.hold import Hold
    from ..abc import Entry

__all__ = [
    "HEADER_ROOM",
    "LOOKER_MARK",
    "MAX_ERROR_SIZE",
    "MAX_JOB_ID_LENGTH",
    "MAX_KEY_LENGTH",
    "MAX_PRIORITY",
    "DeadLetter",
    "Job",
    "JobRef",
    "NewJob",
    "State",
    "check_key",
    "check_payload",
    "cut_error",
    "decode",
    "encode",
    "has_priority",
    "id_of",
    "is_looker",
    "max_payload",
    "to_json",
]

_MAGIC = b"cq1"
#: What the id of a looker's presence among the claims starts with (``N/_claims/@l<id>``,
#: see ``Looker._announce``): no job's claim (those are ``@c<id>``).
LOOKER_MARK = "@l"
_LENGTH = struct.Struct(">I")
MAX_KEY_LENGTH = 256
#: The longest job id a put takes (``put(..., job_id=)``), in characters.
MAX_JOB_ID_LENGTH = 256
#: The most a failure message takes in a job's header, in bytes as stored (JSON-escaped,
#: quotes included); a longer one is cut, and ends with :data:`_CUT`.
MAX_ERROR_SIZE = 2048
_CUT = "..."
#: A job's priority is an int from ``-MAX_PRIORITY`` to ``MAX_PRIORITY`` (0 by default).
MAX_PRIORITY = 2**31 - 1
_PRIORITY_FIELD = b'"priority":'
_LENGTH_AT = len(_MAGIC)
_HEADER_AT = _LENGTH_AT + _LENGTH.size
#: The header's fields that State has (any other is kept in State.extra).
_FIELDS = frozenset(
    {"id", "key", "attempt", "not_before", "parked", "claim", "error", "priority", "timeout"}
)


@dataclass(frozen=True)
class JobRef:
    """A job as put: ``await queue.put(...)`` returns it.

    :ivar id: the job's id (for :meth:`Queue.requeue` and logs)
    :ivar key: its ordering key, or None
    :ivar seq: its place in the queue: increasing in put order (the creation revision
        of its entry; jobs put in one transaction share one: those of a
        :meth:`Queue.put_many` batch, and those one client puts at once)
    """

    id: str
    key: str | None
    seq: int


@dataclass(frozen=True)
class NewJob:
    """A job to put with :meth:`coord.Queue.put_many`: the arguments of
    :meth:`coord.Queue.put`, as one value (checked by ``put_many``, not here).

    :ivar payload: its bytes
    :ivar key: its ordering key, or None
    :ivar job_id: its id, making its put repeatable (see :meth:`coord.Queue.put`)
    :ivar priority: higher first among claimable jobs (a queue opened with
        ``priorities=True``)
    :ivar delay: seconds from now before it can be claimed
    :ivar not_before: a wall-clock time (``time.time()``) before which it cannot be
        claimed (not with *delay*)
    :ivar timeout: seconds its claim's body may run before it is cancelled
    """

    payload: bytes
    key: str | None = None
    job_id: str | None = None
    priority: int = 0
    delay: float | None = None
    not_before: float | None = None
    timeout: float | None = None


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
    priority: int = 0
    timeout: float | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def with_(self, **changes: Any) -> State:
        """This header with *changes* (field names of State). Not
        :func:`dataclasses.replace`, a quarter of whose cost this is: headers are made
        anew at every claim and ending (no field has a check or a derived value)."""
        if not changes.keys() <= _STATE_FIELDS:
            raise TypeError(f"State has no field {sorted(changes.keys() - _STATE_FIELDS)}")
        new = object.__new__(State)
        fields = new.__dict__
        fields.update(self.__dict__)
        fields.update(changes)
        return new


_STATE_FIELDS = frozenset(f.name for f in fields(State))


def id_of(key: str) -> str:
    """The job id in an entry key ``.../@j<id>[-<sequence>]`` (also claims, ``@c``)."""
    return waiter_id_of(key)[2:].partition("-")[0]


def is_looker(key: str) -> bool:
    """Whether the entry *key* among a queue's claims is a looker's presence, not a claim."""
    return waiter_id_of(key).startswith(LOOKER_MARK)


def cut_error(error: str) -> str:
    """*error*, cut so that it takes at most :data:`MAX_ERROR_SIZE` bytes as stored (a cut
    one ends with ``...``). Cutting again changes nothing."""
    # Every character takes at least a byte: no prefix longer than that can fit.
    if len(error) <= MAX_ERROR_SIZE and len(to_json(error)) <= MAX_ERROR_SIZE:
        return error
    low, high = 0, min(len(error), MAX_ERROR_SIZE)
    while low < high:  # the longest prefix that fits with the mark
        middle = (low + high + 1) // 2
        if len(to_json(error[:middle] + _CUT)) <= MAX_ERROR_SIZE:
            low = middle
        else:
            high = middle - 1
    return error[:low] + _CUT


#: json.dumps with separators makes an encoder per call; one for all (it keeps no state).
_ENCODER = json.JSONEncoder(separators=(",", ":"))
#: json.loads on bytes detects the encoding and checks the whitespace around the value;
#: a header as coord writes it is ASCII with none (see _header).
_DECODER = json.JSONDecoder()


def to_json(value: object) -> bytes:
    """*value* as compact JSON (``json.dumps`` with no spaces), encoded."""
    return _ENCODER.encode(value).encode()


def _header(raw: bytes) -> Any:
    """The JSON header *raw*, as :func:`json.loads` reads it (and failing as it does), at
    half its cost for a header coord wrote."""
    try:
        text = raw.decode()
        header, end = _DECODER.raw_decode(text)
    except ValueError:
        return json.loads(raw)  # (its own error, or what raw_decode does not take)
    if end != len(text):
        return json.loads(raw)  # (whitespace after it, or more: as json.loads takes it)
    return header


def encode(state: State, payload: bytes) -> bytes:
    """The entry value of a job: the header (its failure message cut by
    :func:`cut_error`) and the payload."""
    header = {
        "id": state.id,
        "key": state.key,
        "attempt": state.attempt,
        "not_before": state.not_before,
        "parked": state.parked,
        "claim": state.claim,
        "error": None if state.error is None else cut_error(state.error),
        **state.extra,
    }
    # Written only when set: most jobs have neither (and a looker tells a job with a
    # priority by the field's presence, see has_priority).
    if state.priority:
        header["priority"] = state.priority
    if state.timeout is not None:
        header["timeout"] = state.timeout
    raw = to_json(header)
    return _MAGIC + _LENGTH.pack(len(raw)) + raw + payload


def _header_room() -> int:
    """The largest header coord writes, in bytes: every field at its widest (a key of
    characters that JSON escapes as 12 bytes each, the longest float), and a failure
    message of MAX_ERROR_SIZE bytes in place of ``null``."""
    widest = State(
        id="\U0010ffff" * MAX_JOB_ID_LENGTH,  # a caller's job_id (put's own: 32 hex)
        key="\U0010ffff" * MAX_KEY_LENGTH,
        attempt=2**63,
        not_before=-1.7976931348623157e308,
        parked=False,
        claim="f" * 32,
        priority=-MAX_PRIORITY,
        timeout=2.2250738585072014e-308,  # the longest positive float as JSON writes it
    )
    return len(encode(widest, b"")) - len(b"null") + MAX_ERROR_SIZE


#: Room kept for the header when checking a payload's size: the largest header coord
#: writes (see :func:`_header_room`).
HEADER_ROOM = _header_room()


def decode(entry: Entry) -> tuple[State, bytes]:
    """The header and payload of a job entry. An entry that is not a job (written by
    something else) decodes as a parked job with that error, so that it is neither
    handed out nor silently dropped. (A look decodes every job it reads that changed
    since: keep it lean.)"""
    value = entry.value
    try:
        if not value.startswith(_MAGIC):
            raise ValueError("no job header")
        (length,) = _LENGTH.unpack_from(value, _LENGTH_AT)
        header = _header(value[_HEADER_AT : _HEADER_AT + length])
        get = header.get  # (AttributeError: not an object)
        key, claim, error, timeout = get("key"), get("claim"), get("error"), get("timeout")
        if (
            (key is not None and not isinstance(key, str))
            or (claim is not None and not isinstance(claim, str))
            or (error is not None and not isinstance(error, str))
        ):
            raise TypeError("its key, claim and error must be strings or null")
        not_before = float(get("not_before", 0.0))  # (OverflowError: a huge integer)
        if timeout is not None:
            timeout = float(timeout)
            if not (math.isfinite(timeout) and timeout > 0):  # (as put checks it)
                raise ValueError(f"its timeout must be a number of seconds > 0, not {timeout}")
        if not math.isfinite(not_before):
            raise ValueError(f"its not_before must be a finite time, not {not_before}")
        extra = (
            {}
            if header.keys() <= _FIELDS
            else {k: v for k, v in header.items() if k not in _FIELDS}
        )
        state = State(
            str(header["id"]),
            key,
            int(get("attempt", 0)),  # (OverflowError: infinite)
            not_before,
            bool(get("parked", False)),
            claim,
            error,
            int(get("priority", 0)),
            timeout,
            extra,
        )
        return state, value[_HEADER_AT + length :]
    except (
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        OverflowError,
        RecursionError,  # (nested too deep for json)
        struct.error,
    ) as exc:
        return State(id=id_of(entry.key), parked=True, error=f"not a job: {exc}"), value


def has_priority(entry: Entry) -> bool:
    """Whether the job *entry* has a priority other than 0, read without decoding it:
    the field is written only then, and in JSON its name in quotes followed by a colon
    cannot occur inside a string (a quote there is escaped)."""
    value = entry.value
    if not value.startswith(_MAGIC) or len(value) < len(_MAGIC) + _LENGTH.size:
        return False
    (length,) = _LENGTH.unpack_from(value, len(_MAGIC))
    start = len(_MAGIC) + _LENGTH.size
    return value.find(_PRIORITY_FIELD, start, start + length) >= 0


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


def max_payload(limit: int) -> int:
    """The largest payload a store whose values take at most *limit* bytes can queue:
    every header coord may write for it fits beside it."""
    return limit - HEADER_ROOM


def check_payload(payload: object, limit: int) -> bytes:
    """Return *payload* if it is bytes that fit the store with room for the header."""
    data = check_bytes(payload, "a job payload")
    room = max_payload(limit)
    if len(data) > room:
        raise ConfigurationError(
            f"the job payload is {len(data):,} bytes; this store takes at most {room:,} per "
            "job (every put, claim and ack rewrites it through consensus: store large data "
            "elsewhere and queue a reference)"
        )
    return data


class Job:
    """A claimed job, as given by ``async with queue.claim() as job``.

    :ivar id: the job's id
    :ivar key: its ordering key, or None
    :ivar seq: its place in put order
    :ivar attempt: how many earlier attempts failed (0 on the first)
    :ivar payload: its bytes
    :ivar fence: strictly increasing over every claim of every job of the store: pass it
        with side effects (an idempotency token) so that a worker whose claim was lost
        cannot overwrite the work of the next one
    """

    def __init__(self, hold: Hold, entry: Entry, state: State, payload: bytes) -> None:
        self.id: str = state.id
        self.key: str | None = state.key
        self.seq: int = entry.revision
        self.attempt: int = state.attempt
        self.payload: bytes = payload
        self.fence: int = hold.fence
        self._hold = hold
        self._entry = entry
        self._state = state
        self._deferred = False
        #: Called once its ack is done (the claiming looker learns its key is free).
        self._acked: Callable[[], None] | None = None
        #: Called when it is given back as it was (the claiming looker's stock, read
        #: while it was claimed, holds only younger jobs: it must read again).
        self._given_back: Callable[[], None] | None = None

    def defer(self) -> None:
        """Give the job back when the block exits, as it was: not acked, no attempt
        counted, still at the head of its key, claimable again at once. For a failure
        that is not the job's (a dependency that is down, a worker shutting down); the
        block's own exception, if any, still propagates. Not a checkpoint."""
        self._deferred = True

    def __repr__(self) -> str:
        return (
            f"<coord.Job {self.id} key={self.key!r} seq={self.seq} attempt={self.attempt} "
            f"fence={self.fence}{' lost' if self.lost else ''}>"
        )

    @property
    def lost(self) -> bool:
        """True once the claim is lost or must be presumed lost (no checkpoint needed)."""
        return self._hold.lost

    async def wait_lost(self) -> None:
        """Return when the claim is lost. A checkpoint."""
        await self._hold.wait_lost()
