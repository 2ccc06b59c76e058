"""What the partitioner's history must show (issue 19): read from the fenced store's events
(``OWN``/``PWRITE``/``DROP`` per partition, see ``_store.py``).

* **Ownership**: the owner of a partition is its last ``OWN`` (the highest fence) that no
  ``DROP`` of the same fence ended.
* **No overlap**: between two successive owners of a partition, the first one's block
  ended (``DROP``) before the second one's began (``OWN``), unless the first was faulted
  (paused, cut off or killed) — then it must have been told (``DROP lost``, or killed),
  and none of its writes after the second began may have been accepted.
* **Fences** strictly increase from owner to owner of each partition.
* **Balance**: each live member owns ⌊P/M⌋ or ⌈P/M⌉.
* **Moves**: a join or a leave moves at most what the balance needs (:func:`need`); a
  fault that every session survives moves none, between the fault and the stop
  (:func:`taken`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Collection

    from ._store import Event

__all__ = ["FAULT_GRACE", "Tenure", "check_history", "need", "owners", "taken", "tenures"]

#: Seconds after a fault's end during which a takeover still counts as the fault's.
FAULT_GRACE = 1.0


@dataclass
class Tenure:
    """One owner's time with one partition."""

    partition: int
    proc: str
    fence: int
    began: float
    ended: float | None = None
    why: str = ""  # "lost" or "ended", from the DROP
    owns: int = 1  # OWN events of this fence (the worker starts one block per fence)
    drops: int = 0


def tenures(events: list[Event]) -> dict[int, list[Tenure]]:
    """Every partition's owners, in fence order."""
    found: dict[tuple[int, int], Tenure] = {}
    for event in events:
        if event.kind == "OWN":
            key = (int(event.task), event.fence)
            if key in found:  # (checked: a fence is one block of one owner)
                found[key].owns += 1
                continue
            found[key] = Tenure(int(event.task), event.proc, event.fence, event.at)
        elif event.kind == "DROP":
            tenure = found.get((int(event.task), event.fence))
            if tenure is not None:
                tenure.drops += 1
                if tenure.ended is None:
                    tenure.ended, tenure.why = event.at, event.detail
    by_partition: dict[int, list[Tenure]] = {}
    for tenure in sorted(found.values(), key=lambda t: (t.partition, t.fence)):
        by_partition.setdefault(tenure.partition, []).append(tenure)
    return by_partition


def owners(events: list[Event], dead: Collection[str] = ()) -> dict[int, str]:
    """Each partition's current owner: its newest tenure, if not ended and its process
    not *dead* (killed, or paused: it owns nothing that counts)."""
    current = {}
    for partition, held in tenures(events).items():
        last = held[-1]
        if last.ended is None and last.proc not in dead:
            current[partition] = last.proc
    return current


def taken(events: list[Event], since: float, until: float) -> list[tuple[str, int]]:
    """Who took which partition after *since* and before *until*: (member, partition) of
    each ``OWN`` in between. *until* is when the stop began: as the members leave, those
    still running take the leavers' partitions (on a loaded machine a worker may get to
    its SIGTERM after another's leave was given out), moves the leaves make, not the
    fault."""
    return [(e.proc, int(e.task)) for e in events if e.kind == "OWN" and since < e.at < until]


def need(before: dict[int, str], members: Collection[str], partitions: int) -> int:
    """The fewest partitions that must change owner to reach a balance from *before*
    among *members*: those of no member, plus the excess over the larger shares."""
    counts = dict.fromkeys(members, 0)
    orphans = 0
    for partition in range(partitions):
        owner = before.get(partition)
        if owner in counts:
            counts[owner] += 1
        else:
            orphans += 1
    share, extra = divmod(partitions, len(members))
    caps = [share + 1] * extra + [share] * (len(members) - extra)
    ordered = sorted(counts.values(), reverse=True)
    return orphans + sum(max(0, have - cap) for have, cap in zip(ordered, caps, strict=True))


def check_history(
    events: list[Event], faults: dict[str, list[tuple[float, float]]], killed: Collection[str]
) -> int:
    """The safety checks over the whole history; returns the number of handoffs checked.

    :param faults: per process, when it was paused or cut off (start, end)
    :param killed: processes that were SIGKILLed
    """

    def faulted(before: Tenure, after: Tenure) -> bool:
        # The next owner began during a fault of the first (or just after it ended),
        # and the first owned the partition before that fault ended.
        windows = faults.get(before.proc, [])
        return any(
            start <= after.began <= end + FAULT_GRACE and before.began <= end
            for start, end in windows
        )

    accepted: dict[tuple[int, int], list[float]] = {}
    for event in events:
        if event.kind == "PWRITE" and event.accepted:
            accepted.setdefault((int(event.task), event.fence), []).append(event.at)
        # A worker reports a lost membership (MLOST), which it survives by joining
        # again; any other error is a failure of the library or of the worker.
        if event.kind == "ERROR" and not event.detail.startswith("MLOST"):
            raise AssertionError(f"{event.proc}: {event.task} {event.detail}")
    handoffs = 0
    for partition, held in tenures(events).items():
        for tenure in held:
            assert tenure.owns == 1, f"partition {partition}: fence {tenure.fence} began twice"
            assert tenure.drops <= 1, f"partition {partition}: fence {tenure.fence} ended twice"
            assert tenure.ended is not None or tenure.proc in killed, (
                f"partition {partition}: {tenure.proc}'s fence {tenure.fence} never ended "
                "(not told, and not killed)"
            )
        for before, after in itertools.pairwise(held):
            handoffs += 1
            assert after.fence > before.fence
            late = [t for t in accepted.get((partition, before.fence), []) if t > after.began]
            assert not late, (
                f"partition {partition}: fence {before.fence} ({before.proc}) wrote after "
                f"fence {after.fence} ({after.proc}) began, and it was accepted"
            )
            if before.ended is not None and before.ended <= after.began:
                continue  # told, and stopped, before the next owner began
            assert faulted(before, after) or before.proc in killed, (
                f"partition {partition}: {after.proc} began (fence {after.fence}) at "
                f"{after.began:.3f} before {before.proc} stopped (fence {before.fence}, "
                f"ended {before.ended}), and {before.proc} was not faulted"
            )
            if before.proc not in killed and before.ended is not None:
                assert before.why == "lost", (partition, before)
    return handoffs
