"""Backoff between attempts of a request that failed (never between looks at a lock).

Retrying a failed request is not polling: it happens only after an error, and the caller
stops as soon as the session behind the request is lost. The delays grow to one second
and are jittered, so that many clients cut off together do not come back in step.
"""

from __future__ import annotations

import itertools
import random
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["attempts", "backoff", "delay"]

_FIRST = 0.05
_CAP = 1.0


def attempts() -> Iterator[int]:
    """0, 1, 2, ... for ``for attempt in attempts():`` loops."""
    return itertools.count()


def delay(attempt: int, *, cap: float = _CAP) -> float:
    """The delay after failed attempt number *attempt* (0, 1, ...): doubling from 50 ms
    up to *cap* seconds, jittered (between half and all of the nominal delay)."""
    nominal = min(_FIRST * float(2 ** min(attempt, 30)), cap)
    return nominal * (0.5 + random.random() / 2)


async def backoff(attempt: int, *, cap: float = _CAP) -> None:
    """Sleep :func:`delay` seconds. A checkpoint."""
    await anyio.sleep(delay(attempt, cap=cap))
