"""etcd request pieces: compare/sort constants, key ranges, watch events as Changes."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from aetcd import rpc

from ...abc import Change, ChangeKind, Entry

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._watch import Watch

__all__ = ["Changes", "range_end"]

_CREATE = rpc.Compare.CompareTarget.Value("CREATE")
_MOD = rpc.Compare.CompareTarget.Value("MOD")
_LEASE = rpc.Compare.CompareTarget.Value("LEASE")
_VALUE = rpc.Compare.CompareTarget.Value("VALUE")
_VERSION = rpc.Compare.CompareTarget.Value("VERSION")
_EQUAL = rpc.Compare.CompareResult.Value("EQUAL")
_GREATER = rpc.Compare.CompareResult.Value("GREATER")
_DESCEND = rpc.RangeRequest.SortOrder.Value("DESCEND")
_ASCEND = rpc.RangeRequest.SortOrder.Value("ASCEND")
_BY_CREATE = rpc.RangeRequest.SortTarget.Value("CREATE")
_DELETE = rpc.Event.EventType.Value("DELETE")


def range_end(prefix: bytes) -> bytes:
    """The end of the key range of *prefix* (etcd's GetPrefixRangeEnd)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


class Changes:
    """The changes of one watch, event by event (an iterator, not a generator, so that
    leaving the ``async for`` early leaves nothing to finalize)."""

    def __init__(self, watch: Watch, to_entry: Callable[[Any], Entry]) -> None:
        self._watch = watch
        self._to_entry = to_entry
        self._pending: deque[Any] = deque()

    def __aiter__(self) -> Changes:
        return self

    async def __anext__(self) -> Change:
        while True:
            while not self._pending:
                self._pending.extend(await self._watch.__anext__())
            event = self._pending.popleft()
            if event.kv.key.endswith(b"\0"):  # a waiter's link (_waitqueue.py): no entry
                continue
            entry = self._to_entry(event.kv)
            if event.type == _DELETE:
                return Change(ChangeKind.DELETE, Entry(entry.key), event.kv.mod_revision)
            if event.kv.version == 1:  # a creation; later versions are value changes
                return Change(ChangeKind.PUT, entry, event.kv.mod_revision)
