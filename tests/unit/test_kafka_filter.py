"""coord.kafka.FenceFilter, the consumer side of fenced publishing: pure logic on records
(the dispatcher against real brokers is in tests/integration/kafka)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

pytest.importorskip("aiokafka")

from coord.kafka import Dropped, FenceFilter


@dataclass
class Record:
    value: bytes
    partition: int = 0
    fence: int | str | None = None
    job: str = ""
    topic: str = "t"
    dispatcher: str = "d"

    @property
    def headers(self) -> list[tuple[str, bytes]]:
        if self.fence is None:
            return []
        return [
            ("coord-fence", str(self.fence).encode()),
            ("coord-dispatcher", self.dispatcher.encode()),
            ("coord-job-id", self.job.encode()),
        ]


def test_drops_a_deposed_leaders_late_records_per_partition() -> None:
    seen: list[Dropped] = []
    fence = FenceFilter(on_drop=seen.append)
    records = [
        Record(b"a", 0, 10, "j1"),
        Record(b"b", 0, 10, "j2"),
        Record(b"c", 0, 20, "j3"),  # a new leader
        Record(b"late", 0, 10, "j4"),  # the old one, resumed after a pause: dropped
        Record(b"other partition", 1, 10, "j5"),  # partitions are independent
        Record(b"d", 0, 20, "j6"),
    ]
    assert [r.value for r in records if fence.accept(r)] == [
        b"a",
        b"b",
        b"c",
        b"other partition",
        b"d",
    ]
    assert [(d.record.value, d.reason, d.fence, d.highest) for d in seen] == [
        (b"late", "stale fence", 10, 20)
    ]
    assert fence.dropped == seen


def test_drops_duplicates_by_job_id_and_passes_foreign_records() -> None:
    fence = FenceFilter(remember=2)
    assert fence.accept(Record(b"x", fence=5, job="a"))
    assert not fence.accept(Record(b"x again", fence=7, job="a"))  # republished
    assert fence.accept(Record(b"plain"))  # not ours: passes
    assert fence.accept(Record(b"b", fence=7, job="b"))
    assert fence.accept(Record(b"c", fence=7, job="c"))
    assert fence.accept(Record(b"a, long forgotten", fence=7, job="a"))
    assert [d.reason for d in fence.dropped] == ["duplicate"]


async def _aiter(records: list[Record]):  # type: ignore[no-untyped-def]
    for record in records:
        yield record


@pytest.mark.anyio
async def test_filter_wraps_an_async_iterator() -> None:
    fence = FenceFilter()
    records = [Record(b"1", fence=3, job="1"), Record(b"2", fence=2, job="2")]
    assert [r.value async for r in fence.filter(_aiter(records))] == [b"1"]


def test_fences_of_different_dispatchers_are_not_compared() -> None:
    """Two dispatchers (two elections) publishing to one topic: their fences come from
    one store-wide counter, so the one elected first always has the lower fence. Neither
    is a zombie of the other."""
    fence = FenceFilter()
    records = [
        Record(b"eu-1", fence=2, job="e1", dispatcher="eu"),
        Record(b"us-1", fence=3, job="u1", dispatcher="us"),
        Record(b"eu-2", fence=2, job="e2", dispatcher="eu"),
    ]
    assert [r.value for r in records if fence.accept(r)] == [b"eu-1", b"us-1", b"eu-2"]


def test_a_malformed_fence_is_dropped_not_raised() -> None:
    fence = FenceFilter()
    assert not fence.accept(Record(b"x", fence="twelve", job="x"))
    assert [d.reason for d in fence.dropped] == ["malformed fence"]
