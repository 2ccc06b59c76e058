"""Counters of one client: acquires, waits, losses, and wait and hold time histograms.

Updated on every acquire and release, so they cost an int increment each: fixed
buckets (Prometheus' cumulative-free layout, one count per bucket), found by bisection;
no allocation, no lock (the event loop is one thread). Read as frozen snapshots,
:class:`Histogram`, inside :class:`coord.ClientStatistics`.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from dataclasses import dataclass
from typing import Protocol

__all__ = ["TIME_BUCKETS", "Counters", "Histogram", "StatisticsObserver"]

_log = logging.getLogger("coord")

#: Upper bounds, in seconds, of the wait and hold time buckets; a last bucket takes the
#: rest (up to infinity).
TIME_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)


@dataclass(frozen=True)
class Histogram:
    """How long things took, in fixed buckets. A frozen snapshot.

    :ivar bounds: the buckets' upper bounds in seconds, increasing
    :ivar counts: one count per bucket: ``counts[i]`` took at most ``bounds[i]`` (and more
        than ``bounds[i - 1]``); the last one, ``counts[len(bounds)]``, took longer than
        every bound
    :ivar count: how many were recorded (the sum of *counts*)
    :ivar sum: their total, in seconds
    """

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    count: int
    sum: float

    def __repr__(self) -> str:
        mean = f" mean={self.sum / self.count:.4g}s" if self.count else ""
        return f"<coord.Histogram count={self.count}{mean} p99<={self.quantile(0.99):g}s>"

    def quantile(self, q: float) -> float:
        """An upper bound of the *q* quantile (0 to 1): the bound of the bucket it falls
        in (``inf`` if that is the last one; 0.0 if nothing was recorded)."""
        if not 0 <= q <= 1:
            raise ValueError(f"q must be between 0 and 1, not {q!r}")
        rank = q * self.count
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if count and seen >= rank:
                return self.bounds[index] if index < len(self.bounds) else float("inf")
        return 0.0


class _Recorder:
    """A histogram being recorded (mutable; see :class:`Histogram`)."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts: list[int] = [0] * (len(TIME_BUCKETS) + 1)
        self.sum: float = 0.0

    def add(self, seconds: float) -> None:
        self.counts[bisect_left(TIME_BUCKETS, seconds)] += 1
        self.sum += seconds

    def snapshot(self) -> Histogram:
        counts = tuple(self.counts)
        return Histogram(TIME_BUCKETS, counts, sum(counts), self.sum)


class StatisticsObserver(Protocol):
    """Told of every counted acquire and release, as they happen (:mod:`coord.otel`).
    Called on the event loop, in the acquiring or releasing task; must not block."""

    def acquired(self, what: str, name: str, fence: int, wait: float, waited: bool) -> None:
        """A hold of the *what* (``"mutex"``...) *name* was granted after *wait* seconds."""

    def released(self, what: str, name: str, fence: int, held: float, lost: bool) -> None:
        """That hold ended after *held* seconds; *lost* if it ended lost."""


class Counters:
    """What the locks of one client did (mutable; read through
    :meth:`coord.Client.statistics`).

    :ivar acquires: holds granted (mutex, semaphore, either side of a read-write lock,
        election terms); re-entering a reentrant mutex is not one
    :ivar waits: those acquires that had to wait for a holder ahead of them
    :ivar losses: holds that ended lost (:exc:`coord.LockLost` at the release)
    """

    __slots__ = ("acquires", "hold_time", "losses", "observers", "wait_time", "waits")

    def __init__(self) -> None:
        self.acquires: int = 0
        self.waits: int = 0
        self.losses: int = 0
        self.wait_time: _Recorder = _Recorder()
        self.hold_time: _Recorder = _Recorder()
        #: Told of each event (none unless :mod:`coord.otel` is in use).
        self.observers: tuple[StatisticsObserver, ...] = ()

    def acquired(self, what: str, name: str, fence: int, wait: float, waited: bool) -> None:
        self.acquires += 1
        self.waits += waited
        self.wait_time.add(wait)
        for observer in self.observers:
            try:
                observer.acquired(what, name, fence, wait, waited)
            except Exception:  # an exporter's failure must never fail an acquire
                _log.exception("a statistics observer failed on an acquire")

    def released(self, what: str, name: str, fence: int, held: float, lost: bool) -> None:
        self.losses += lost
        self.hold_time.add(held)
        for observer in self.observers:
            try:
                observer.released(what, name, fence, held, lost)
            except Exception:  # nor replace what the released block raised
                _log.exception("a statistics observer failed on a release")
