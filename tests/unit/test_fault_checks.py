"""The fault suite's checks fail when they should (a check that cannot fail is a
defect): synthetic histories with a lost update, two holders at once, fences out of
order, and a holder never told."""

from __future__ import annotations

import pytest

from tests.faults import _checks
from tests.faults._store import Event


def _hold(proc: str, fence: int, enter: float, leave: float, *, lost: bool = False) -> list[Event]:
    events = [
        Event(enter, "ENTER", proc, "t0", fence),
        Event(leave, "EXIT", proc, "t0", fence),
    ]
    return [*events, Event(leave, "LOST", proc, "t0", fence)] if lost else events


def _write(proc: str, fence: int, value: int, at: float, *, accepted: bool = True) -> Event:
    return Event(at, "WRITE", proc, "t0", fence, value, accepted)


def test_a_clean_history_passes() -> None:
    events = [*_hold("a", 10, 1, 2), *_hold("b", 12, 3, 4), *_hold("a", 15, 5, 6)]
    writes = [_write("a", 10, 1, 1.5), _write("b", 12, 2, 3.5), _write("a", 15, 3, 5.5)]
    holds = _checks.holds(sorted(events + writes, key=lambda e: e.at))
    assert _checks.check_no_lost_update(writes) == 3
    _checks.check_fences_increase(holds)
    _checks.check_no_overlap(holds)


def test_a_lost_update_is_caught() -> None:
    writes = [_write("a", 10, 1, 1), _write("b", 12, 2, 2), _write("a", 13, 2, 3)]
    with pytest.raises(AssertionError, match="lost update"):
        _checks.check_no_lost_update(writes)
    # a stale writer rejected by its fence is no lost update
    rejected = [_write("a", 10, 1, 1), _write("b", 12, 2, 2), _write("a", 10, 2, 3, accepted=False)]
    assert _checks.check_no_lost_update(rejected) == 2


def test_two_holders_at_once_are_caught_unless_one_was_told() -> None:
    overlapping = [*_hold("a", 10, 1, 3), *_hold("b", 12, 2, 4)]
    with pytest.raises(AssertionError, match="two holders"):
        _checks.check_no_overlap(_checks.holds(sorted(overlapping, key=lambda e: e.at)))
    told = [*_hold("a", 10, 1, 3, lost=True), *_hold("b", 12, 2, 4)]
    _checks.check_no_overlap(_checks.holds(sorted(told, key=lambda e: e.at)))


def test_fences_out_of_order_are_caught() -> None:
    events = [*_hold("a", 12, 1, 2), *_hold("b", 10, 3, 4)]
    with pytest.raises(AssertionError, match="fences out of order"):
        _checks.check_fences_increase(_checks.holds(events))


def test_a_holder_never_told_is_caught() -> None:
    holds = _checks.holds(_hold("a", 10, 1, 2))
    with pytest.raises(AssertionError, match="not told"):
        _checks.check_reported_lost(holds, "a", 10)


def test_a_killed_holder_does_not_count_as_overlapping() -> None:
    events = [Event(1, "ENTER", "a", "t0", 10), *_hold("b", 12, 2, 3)]
    with pytest.raises(AssertionError, match="still open"):
        _checks.check_no_overlap(_checks.holds(events))
    _checks.check_no_overlap(_checks.holds(events, killed=["a"]))


def _job(
    proc: str, fence: int, job: str, seq: int, at: float, end: str | None, outcome: str = ""
) -> list[Event]:
    events = [
        Event(at, "ENTER", proc, "t0", fence),
        Event(at + 0.1, "JOB", proc, "t0", fence, seq, detail=job),
        Event(at + 0.2, "EXIT", proc, "t0", fence),
    ]
    if end == "LOST":  # as the store records a ClaimLost: its outcome
        events.append(Event(at + 0.3, end, proc, "t0", fence, detail=outcome))
    elif end is not None:
        events.append(Event(at + 0.3, end, proc, "t0", fence, seq, detail=job))
    return events


def test_queue_checks() -> None:
    puts = [
        Event(0.1 * i, "PUT", "producer", "producer", 0, i, detail=f"producer-{i}")
        for i in (1, 2, 3)
    ]
    acked = [
        *_job("a", 10, "producer-1", 1, 1, "ACKED"),
        *_job("b", 12, "producer-2", 2, 2, "ACKED"),
    ]
    assert _checks.check_queue(puts + acked, {"producer-3"}) == 2
    with pytest.raises(AssertionError, match="1 jobs lost"):
        _checks.check_queue(puts + acked, set())  # j3 neither acked nor queued
    with pytest.raises(AssertionError, match="acked twice"):
        _checks.check_queue(
            puts + acked + _job("c", 13, "producer-2", 2, 3, "ACKED"), {"producer-3"}
        )
    with pytest.raises(AssertionError, match="out of put order"):
        _checks.check_queue(puts + acked + _job("c", 11, "producer-3", 3, 3, "ACKED"), set())
    # An ack whose outcome was unknown (the holder left its body, then was told
    # ClaimLost, outcome unknown) accounts for a job that is gone; a claim lost before
    # its body ended does not, nor an ack the store refused ("not done").
    unknown = _job("c", 13, "producer-3", 3, 3, "LOST", "unknown")
    assert _checks.check_queue(puts + acked + unknown, set()) == 2
    cut_off = [e for e in unknown if e.kind != "EXIT"]
    with pytest.raises(AssertionError, match="1 jobs lost"):
        _checks.check_queue(puts + acked + cut_off, set())
    refused = _job("c", 13, "producer-3", 3, 3, "LOST", "not_done")
    with pytest.raises(AssertionError, match="1 jobs lost"):
        _checks.check_queue(puts + acked + refused, set())

    # The producer repeats a put by job id until it returns: a job worked on that no
    # put returned is a duplicate, but for the one in flight at the stop (the next id).
    in_flight = _job("c", 13, "producer-4", 4, 3, "ACKED")
    assert _checks.check_queue(puts + acked + in_flight, {"producer-3"}) == 3
    stray = _job("c", 13, "producer-9", 4, 3, "ACKED")
    with pytest.raises(AssertionError, match="no put returned"):
        _checks.check_queue(puts + acked + stray, {"producer-3"})
