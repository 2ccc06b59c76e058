"""The consumer side of :mod:`coord.kafka`: :class:`FenceFilter` and :class:`Dropped`
(re-exported there; no aiokafka needed here)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import AsyncIterable, AsyncIterator, Callable

__all__ = ["Dropped", "FenceFilter"]


@dataclass(frozen=True)
class Dropped:
    """A record :class:`FenceFilter` dropped, and why.

    :ivar record: the record (an aiokafka ``ConsumerRecord``)
    :ivar reason: ``"stale fence"``, ``"duplicate"`` or ``"malformed fence"``
    :ivar fence: its ``coord-fence`` (0 if malformed)
    :ivar highest: the highest fence accepted so far on its partition from its
        dispatcher (0 if malformed)
    """

    record: Any
    reason: str
    fence: int
    highest: int


class FenceFilter:
    """Drop what a deposed leader published late, and duplicates.

    Keeps, per (topic, partition, ``coord-dispatcher``), the highest ``coord-fence``
    accepted; a record with a lower fence comes from a leader that had lost its term when
    it published (it was paused, then resumed): dropped. A record whose fence is not a
    number is dropped too ("malformed fence"). A record whose ``coord-job-id`` was accepted before
    (a job published again after a crash or a takeover) is dropped too. Records without
    coord's headers pass.

    Example::

        fence = coord.kafka.FenceFilter()
        async for record in fence.filter(consumer):
            await handle(record)
        print(fence.dropped)

    :param remember: how many job ids to remember for de-duplication (oldest forgotten)
    :param on_drop: called with each :class:`Dropped`
    """

    def __init__(
        self, *, remember: int = 100_000, on_drop: Callable[[Dropped], None] | None = None
    ) -> None:
        self._highest: dict[tuple[str, int, bytes], int] = {}
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._remember = remember
        self._on_drop = on_drop
        #: Every record dropped so far, in order.
        self.dropped: list[Dropped] = []

    def accept(self, record: Any) -> bool:
        """Whether to process *record* (an aiokafka ``ConsumerRecord``); remembers it."""
        headers = dict(record.headers or ())
        if "coord-fence" not in headers:
            return True
        try:
            fence = int(headers["coord-fence"])
        except ValueError:
            return self._drop(Dropped(record, "malformed fence", 0, 0))
        # Fences of one dispatcher's election are compared; another dispatcher
        # publishing to the same topic has fences of its own.
        where = (record.topic, record.partition, headers.get("coord-dispatcher", b""))
        highest = self._highest.get(where, 0)
        job_id = headers.get("coord-job-id") or b""
        if fence < highest:
            return self._drop(Dropped(record, "stale fence", fence, highest))
        if job_id and job_id in self._seen:
            return self._drop(Dropped(record, "duplicate", fence, highest))
        self._highest[where] = fence
        if job_id:
            self._seen[job_id] = None
            if len(self._seen) > self._remember:
                self._seen.popitem(last=False)
        return True

    def _drop(self, dropped: Dropped) -> bool:
        self.dropped.append(dropped)
        if self._on_drop is not None:
            self._on_drop(dropped)
        return False

    async def filter(self, records: AsyncIterable[Any]) -> AsyncIterator[Any]:
        """The records of *records* (e.g. an ``AIOKafkaConsumer``) that :meth:`accept`
        lets through."""
        async for record in records:
            if self.accept(record):
                yield record
