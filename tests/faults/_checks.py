"""The checks of the fault suite, on the fenced store's history (pure functions).

* no lost update among accepted writes: they wrote 1, 2, 3, ... in order;
* fences increase in acquisition order, over the holds that were not lost;
* no two holders overlap, unless one of them got LockLost (or was killed);
* the holders that were paused or cut off got LockLost;
* every live process acquires again soon after a fault ended.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from ._store import Event

__all__ = [
    "Hold",
    "acquired_after",
    "check_fences_increase",
    "check_no_lost_update",
    "check_no_overlap",
    "check_reported_lost",
    "holds",
]


@dataclass
class Hold:
    """One hold, from its ENTER to its EXIT (None while open) and whether it was lost."""

    proc: str
    task: str
    fence: int
    entered: float
    exited: float | None = None
    lost: bool = False
    killed: bool = False  # its process was killed while it held
    key: str = ""  # the hold's (the term's) key in the store, as its worker reported it

    def __str__(self) -> str:
        end = f"{self.exited:.3f}" if self.exited is not None else "open"
        flags = " LOST" if self.lost else " KILLED" if self.killed else ""
        return f"{self.proc}/{self.task} fence {self.fence} [{self.entered:.3f}, {end}]{flags}"


def holds(events: Iterable[Event], killed: Iterable[str] = ()) -> list[Hold]:
    """Every hold of the history, in ENTER order. *killed*: processes that were
    SIGKILLed (their open holds ended with them)."""
    result: list[Hold] = []
    open_holds: dict[tuple[str, str, int], Hold] = {}
    for event in events:
        key = (event.proc, event.task, event.fence)
        if event.kind == "ENTER":
            hold = Hold(event.proc, event.task, event.fence, event.at, key=event.detail)
            open_holds[key] = hold
            result.append(hold)
        elif event.kind == "EXIT" and key in open_holds:
            open_holds[key].exited = event.at
        elif event.kind == "LOST" and key in open_holds:
            open_holds.pop(key).lost = True
    dead = set(killed)
    for hold in result:
        if hold.exited is None and not hold.lost and hold.proc in dead:
            hold.killed = True
    return result


def check_no_lost_update(events: Sequence[Event]) -> int:
    """Accepted writes wrote 1, 2, 3, ...: none was based on a stale read. Returns their
    number."""
    accepted = [e for e in events if e.kind == "WRITE" and e.accepted]
    for number, event in enumerate(accepted, start=1):
        assert event.value == number, (
            f"lost update: accepted write #{number} wrote {event.value} "
            f"({event.proc}/{event.task}, fence {event.fence}); "
            f"before it: {_last_writes(accepted, number)}"
        )
    return len(accepted)


def _last_writes(accepted: Sequence[Event], number: int) -> list[tuple[str, int, int]]:
    return [(e.proc, e.fence, e.value) for e in accepted[max(0, number - 4) : number]]


def _kept(all_holds: Sequence[Hold]) -> list[Hold]:
    return [h for h in all_holds if not h.lost and not h.killed]


def check_fences_increase(all_holds: Sequence[Hold]) -> None:
    """In acquisition order, the fences of the holds that were not lost increase."""
    kept = _kept(all_holds)
    for before, after in itertools.pairwise(kept):
        assert after.fence > before.fence, f"fences out of order: {before} was followed by {after}"


def check_no_overlap(all_holds: Sequence[Hold]) -> None:
    """No two holds that were not lost overlap in time (each EXIT is before the next
    ENTER). An open hold must be the last one."""
    kept = _kept(all_holds)
    for before, after in itertools.pairwise(kept):
        assert before.exited is not None, f"{before} is still open, but {after} entered"
        assert before.exited <= after.entered, f"two holders at once: {before} and {after}"


def check_reported_lost(all_holds: Sequence[Hold], proc: str, fence: int) -> None:
    """The hold of *proc* with *fence* ended in LockLost."""
    matching = [h for h in all_holds if h.proc == proc and h.fence == fence]
    assert matching, f"no hold of {proc} with fence {fence}"
    assert all(h.lost for h in matching), f"{matching[0]} was not told that it lost the lock"


def acquired_after(events: Iterable[Event], proc: str, since: float) -> float | None:
    """When *proc* first entered a hold after *since* (None if it did not)."""
    return next(
        (e.at for e in events if e.kind == "ENTER" and e.proc == proc and e.at > since), None
    )


def check_queue(events: Sequence[Event], remaining: set[str]) -> int:
    """Queue mode (every job has the same key): no job lost — every job whose put
    returned was acked or is still queued; none acked twice; and per-key order — in the
    order of their claims (the fence: a store revision), jobs were worked on in put
    order, a retry repeating its job. (Not in the order the acks were reported: a worker
    cut off after its ack was applied hears of it, and reports it, later.) Returns the
    acks."""
    put = {e.detail: e.value for e in events if e.kind == "PUT"}
    acks = [e for e in events if e.kind == "ACKED"]
    seen: dict[str, Event] = {}
    for ack in acks:
        assert ack.detail not in seen, f"job {ack.detail} acked twice: {seen[ack.detail]}, {ack}"
        seen[ack.detail] = ack
    # A job whose holder left its body (the ack was sent) and was then told ClaimLost with
    # outcome "unknown" may have been acked: when the reply is lost and the session is
    # presumed lost meanwhile, the outcome cannot be known, and ClaimLost says so. It is
    # accounted for if it is no longer queued (only an ack deletes a job here: nothing is
    # dead-lettered). An ack told "not done" must not have been applied: its job is
    # acked by someone else or still queued, like any other.
    unknown = _acks_of_unknown_outcome(events)
    lost = sorted(i for i in put if i not in seen and i not in remaining and i not in unknown)
    assert not lost, f"{len(lost)} jobs lost (put, never acked, not queued): {lost[:5]}"
    # The producer repeats a put that did not end done with the same job id until it
    # does (a repeat queues nothing more), so every job worked on was reported put, but
    # for the one put in flight when the producer stopped: the id after its last.
    worked = {e.detail for e in events if e.kind == "JOB"}
    numbers = [int(i.rpartition("-")[2]) for i in put]
    in_flight = {f"producer-{max(numbers, default=-1) + 1}"}
    unreported = worked - put.keys() - in_flight
    assert not unreported, f"jobs worked on that no put returned: {sorted(unreported)[:5]}"
    claims = sorted((e for e in events if e.kind == "JOB"), key=lambda e: e.fence)
    for before, after in itertools.pairwise(claims):
        assert before.value <= after.value, f"claimed out of put order: {before} then {after}"
    return len(acks)


def _acks_of_unknown_outcome(events: Sequence[Event]) -> set[str]:
    """The jobs whose holder reported JOB, then EXIT, then LOST (outcome unknown) for
    the same claim."""
    job_of: dict[tuple[str, str, int], str] = {}
    exited: set[tuple[str, str, int]] = set()
    unknown = set()
    for event in events:
        key = (event.proc, event.task, event.fence)
        if event.kind == "JOB":
            job_of[key] = event.detail
        elif event.kind == "EXIT" and key in job_of:
            exited.add(key)
        elif event.kind == "LOST" and key in exited and event.detail == "unknown":
            unknown.add(job_of[key])
    return unknown
