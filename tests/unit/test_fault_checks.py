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
