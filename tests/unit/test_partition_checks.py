"""The partitioner fault test's checker (tests/faults/_partition_checks.py) on synthetic
histories: it must reject each of these (found by an adversarial review: it used to pass
them), and accept a clean handoff and a faulted one that was told."""

from __future__ import annotations

import pytest

from tests.faults import _partition_checks as checks
from tests.faults._store import Event


def ev(at: float, kind: str, proc: str, p: int, fence: int, detail: str = "") -> Event:
    return Event(at=at, kind=kind, proc=proc, task=str(p), fence=fence, detail=detail)


CLEAN = [
    ev(0, "OWN", "A", 0, 1),
    ev(1, "DROP", "A", 0, 1, "ended"),
    ev(2, "OWN", "B", 0, 2),
    ev(3, "DROP", "B", 0, 2, "ended"),
]


def test_a_clean_handoff_and_a_told_faulted_one_pass() -> None:
    assert checks.check_history(CLEAN, {}, ()) == 1
    faulted = [
        ev(0, "OWN", "A", 0, 1),
        ev(3, "OWN", "B", 0, 2),  # during A's pause
        ev(4.5, "DROP", "A", 0, 1, "lost"),  # told once it resumed
        ev(6, "DROP", "B", 0, 2, "ended"),
    ]
    assert checks.check_history(faulted, {"A": [(1, 4)]}, ()) == 1


@pytest.mark.parametrize(
    ("events", "faults"),
    [
        pytest.param(  # B's second block under one fence hid its first, during A's
            [
                ev(0, "OWN", "A", 0, 1),
                ev(1, "OWN", "B", 0, 2),
                ev(2, "DROP", "B", 0, 2, "ended"),
                ev(3, "DROP", "A", 0, 1, "ended"),
                ev(4, "OWN", "B", 0, 2),
            ],
            {},
            id="a fence begun twice",
        ),
        pytest.param(  # A's second block under one fence ran past B's start
            [
                ev(0, "OWN", "A", 0, 1),
                ev(0.5, "OWN", "A", 0, 1),
                ev(1, "DROP", "A", 0, 1, "ended"),
                ev(2, "OWN", "B", 0, 2),
                ev(5, "DROP", "A", 0, 1, "ended"),
                ev(6, "DROP", "B", 0, 2, "ended"),
            ],
            {},
            id="a fence ended twice",
        ),
        pytest.param(  # paused, not killed, and never told
            [ev(0, "OWN", "A", 0, 1), ev(5, "OWN", "B", 0, 2), ev(6, "DROP", "B", 0, 2, "ended")],
            {"A": [(1, 2)]},
            id="faulted and never told",
        ),
        pytest.param(  # a short pause long before does not excuse an overlap
            [
                ev(0, "OWN", "A", 0, 1),
                ev(100, "OWN", "B", 0, 2),
                ev(101, "DROP", "A", 0, 1, "lost"),
                ev(102, "DROP", "B", 0, 2, "ended"),
            ],
            {"A": [(1, 1.1)]},
            id="an unrelated fault",
        ),
        pytest.param(
            [*CLEAN, Event(at=4, kind="ERROR", proc="A", task="member", detail="RuntimeError x")],
            {},
            id="a member's error other than a lost membership",
        ),
    ],
)
def test_a_bad_history_is_rejected(
    events: list[Event], faults: dict[str, list[tuple[float, float]]]
) -> None:
    with pytest.raises(AssertionError):
        checks.check_history(events, faults, ())


def test_a_lost_membership_is_no_error() -> None:
    lost = Event(at=4, kind="ERROR", proc="A", task="member", detail="MLOST 'x' was lost")
    assert checks.check_history([*CLEAN, lost], {}, ()) == 1


def test_the_moves_of_a_fault_end_at_the_stop() -> None:
    """A member still running at the stop takes the leavers' partitions: those moves are
    the leaves', not the fault's (the clean-clone CI's leader-kill failure)."""
    events = [
        ev(0, "OWN", "A", 0, 1),
        ev(1, "OWN", "B", 1, 2),
        ev(12, "OWN", "B", 1, 3),  # after the fault (10): B takes its own back
        ev(21, "DROP", "A", 0, 1, "ended"),  # the stop (20): A leaves first
        ev(22, "OWN", "B", 0, 4),
    ]
    assert checks.taken(events, 10, 20) == [("B", 1)]
