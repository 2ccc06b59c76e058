"""The request records kazoo's codec lacks, or that we decode ourselves.

kazoo's ``kazoo.protocol.serialization`` encodes and decodes most requests; these are the
rest, in the same shape (``type`` is the opcode, ``serialize()`` the body,
``deserialize(frame, offset)`` the answer):

* :class:`CreateContainer` (opcode 19): a create2 whose node the server removes once
  its last child is gone;
* :class:`SetWatches` (opcode 101, sent with xid -8): re-arms a resumed session's watches
  on a new connection, relative to the last zxid the client saw;
* :class:`Multi` (opcode 14): kazoo's ``Transaction`` decodes create2-shaped results
  (those of container creates) wrongly, and mixes failed operations into the results;
* :func:`children2`: the answer to a ``getChildren2`` (a queue's listing, thousands of
  names) decoded in one pass when its names are all of one length, as a queue's are.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kazoo.protocol.serialization import (
    Create2,
    GetChildren2,
    read_string,
    stat_struct,
    write_string,
)
from kazoo.protocol.states import ZnodeStat

from ._errors import error_for

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

__all__ = [
    "CONTAINER",
    "EPHEMERAL",
    "SEQUENCE",
    "CreateContainer",
    "Multi",
    "MultiResults",
    "SetWatches",
    "children2",
    "set_watches_batches",
]

#: Create flags (ZooKeeper's CreateMode).
EPHEMERAL = 1
SEQUENCE = 2
CONTAINER = 4

_INT = struct.Struct("!i")
_LONG = struct.Struct("!q")
_MULTI_HEADER = struct.Struct("!iBi")  # opcode, done, err

#: The most path bytes one SetWatches carries (ZooKeeper's Java client uses the same
#: bound: a session with many watches would otherwise send a frame the server refuses).
SET_WATCHES_MAX_BYTES = 128 * 1024


class CreateContainer(Create2):  # type: ignore[misc]
    """createContainer: ``(path, data, acl, flags)``; answered like create2."""

    type = 19


@dataclass(frozen=True, slots=True)
class SetWatches:
    """setWatches: the paths of the watches to re-arm, by kind."""

    relative_zxid: int
    data: Sequence[str]
    exist: Sequence[str]
    child: Sequence[str]

    type: ClassVar[int] = 101

    def serialize(self) -> bytes:
        parts = [_LONG.pack(self.relative_zxid)]
        for paths in (self.data, self.exist, self.child):
            parts.append(_INT.pack(len(paths)))
            parts.extend(write_string(path) for path in paths)
        return b"".join(parts)


def set_watches_batches(
    zxid: int, data: Sequence[str], exist: Sequence[str], child: Sequence[str]
) -> Iterator[SetWatches]:
    """The SetWatches requests that re-arm these watches, each under the size bound."""
    batch: tuple[list[str], list[str], list[str]] = ([], [], [])
    size = 0
    for kind, paths in enumerate((data, exist, child)):
        for path in paths:
            cost = len(path.encode()) + 4
            if size + cost > SET_WATCHES_MAX_BYTES and size:
                yield SetWatches(zxid, *batch)
                batch, size = ([], [], []), 0
            batch[kind].append(path)
            size += cost
    if size:
        yield SetWatches(zxid, *batch)


class MultiResults(list):  # type: ignore[type-arg]
    """The results of a multi, one per operation, and the zxid its answer carried.

    :ivar zxid: the reply header's zxid. For a committed multi it is the multi's own
        transaction's, and so the czxid of every node it created: the server puts its
        last applied zxid in the header right after applying the request, and applies
        one write at a time (ZooKeeper's CommitProcessor lets "only a single write
        request" through at once; a standalone server has one thread). 0 if unknown.
    """

    zxid: int = 0


@dataclass(frozen=True, slots=True)
class Multi:
    """multi: several operations (kazoo records: Create, CreateContainer, Delete,
    SetData, CheckVersion) applied all or none."""

    ops: Sequence[Any]

    type: ClassVar[int] = 14

    def serialize(self) -> bytes:
        parts = []
        for op in self.ops:
            parts.append(_MULTI_HEADER.pack(op.type, 0, -1))
            parts.append(bytes(op.serialize()))
        parts.append(_MULTI_HEADER.pack(-1, 1, -1))
        return b"".join(parts)

    @classmethod
    def deserialize(cls, frame: bytes, offset: int) -> MultiResults:
        """One result per operation: a path (create), a ``(path, stat)`` (create2,
        container), True (delete, check), a stat (set data), or an exception instance
        (kazoo's, for that operation's error code). The reader sets the zxid."""
        results = MultiResults()
        while True:
            opcode, done, _ = _MULTI_HEADER.unpack_from(frame, offset)
            offset += _MULTI_HEADER.size
            if done:
                return results
            result, offset = _multi_result(opcode, frame, offset)
            results.append(result)


def _multi_result(opcode: int, frame: bytes, offset: int) -> tuple[Any, int]:
    if opcode == 1:  # create
        path, offset = read_string(frame, offset)
        return path, offset
    if opcode in (15, 19, 21):  # create2, createContainer, createTTL
        path, offset = read_string(frame, offset)
        stat = ZnodeStat._make(stat_struct.unpack_from(frame, offset))
        return (path, stat), offset + stat_struct.size
    if opcode in (2, 13):  # delete, check
        return True, offset
    if opcode == 5:  # setData
        stat = ZnodeStat._make(stat_struct.unpack_from(frame, offset))
        return stat, offset + stat_struct.size
    if opcode == -1:  # error
        (code,) = _INT.unpack_from(frame, offset)
        return error_for(code), offset + _INT.size
    raise ValueError(f"multi: an answer of opcode {opcode}")


def children2(frame: bytes, offset: int) -> tuple[list[str], ZnodeStat]:
    """The children and stat of a ``getChildren2`` answer at *offset*, as kazoo's
    ``GetChildren2.deserialize`` gives them. A queue's names are all of one length (an id
    of fixed size and a sequence of ten digits), so they are read as records of one
    shape in C (``struct.iter_unpack``): a look at a busy queue lists every job, and
    kazoo's loop of a call per name was about a tenth of the client's CPU on
    ZooKeeper. Any other listing goes through kazoo's loop (where a count of -1, a null
    list, which no server sends for getChildren2, gives no pair: a ProtocolError).

    :raises struct.error: if the frame is too short (as kazoo's would)
    """
    (count,) = _INT.unpack_from(frame, offset)
    if count > 0:
        (size,) = _INT.unpack_from(frame, offset + 4)
        end = offset + 4 + count * (4 + size)
        if size > 0 and end + stat_struct.size <= len(frame):
            records = list(struct.iter_unpack(f">i{size}s", frame[offset + 4 : end]))
            if all(length == size for length, _ in records):
                names = [name.decode() for _, name in records]
                return names, ZnodeStat._make(stat_struct.unpack_from(frame, end))
    children, stat = GetChildren2.deserialize(frame, offset)
    return children, stat
