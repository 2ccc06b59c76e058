"""The peer layouts on ZooKeeper: how kazoo's and Curator's recipes name, sort and wait.

Rules only (no I/O): each answers, from a raw listing of the lock's node, which node a
contender waits for (None: its turn has come). Read in the peers' sources:

* **kazoo** (python-zk/kazoo ``kazoo/recipe/lock.py``): a node
  ``<uuid4 hex><marker><10-digit sequence>`` holding the identifier, the marker
  ``__lock__`` (``Lock``, ``WriteLock``; an ``Election`` is a ``Lock``,
  ``kazoo/recipe/election.py``) or ``__rlock__`` (``ReadLock``). ``_get_predecessor``
  keeps the children matching ``(?:<excluded markers>)(-?\\d{10})$`` whose sequence is
  below mine (compared as strings) and waits for the highest: a ``Lock`` and a
  ``WriteLock`` exclude ``__lock__`` (the ``WriteLock`` also ``__rlock__``), a
  ``ReadLock`` only ``__lock__``. ``contenders()`` lists them in that order.
  ``_ensure_path`` makes the parent a persistent node, once per Lock object.
* **Curator** (apache/curator ``curator-recipes/.../locks/LockInternals.java``,
  ``StandardLockInternalsDriver.java``, ``InterProcessMutex.java``,
  ``InterProcessReadWriteLock.java``, ``leader/LeaderLatch.java``; protected mode in
  ``curator-framework/.../imps/CreateBuilderImpl.java``): a node
  ``_c_<uuid>-<lock name><sequence>`` (``lock-`` for a mutex, ``latch-`` for a latch,
  ``__WRIT__``/``__READ__`` for the two sides of the read-write lock). *Every* child is
  sorted, stably, by the text after the last lock name in it (``fixForSorting``; the
  read-write lock strips both names), and a contender at index *i* holds if ``i <
  maxLeases`` (1), else waits for the child at ``i - 1``; a reader holds unless a writer
  comes first, and then waits for that first writer.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._core.exceptions import ConfigurationError, EntryGoneError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["CURATOR_LEASE", "LAYOUTS", "Side", "layout_side"]


@dataclass(frozen=True)
class Side:
    """One kind of contender of a layout: its node's marker and its rule.

    :ivar marker: the text between the GUID and the sequence
    :ivar family: the markers of the nodes its queue is made of (their order, and who
        holds, is read among those)
    :ivar blocker: ``blocker(children, mine)``: the child my node waits for, None if my
        turn has come; raises EntryGoneError if *mine* is not listed
    :ivar order: ``order(children)``: the contenders of the family, first first
    """

    layout: str
    marker: str
    family: tuple[str, ...]
    blocker: Callable[[Sequence[str], str], str | None]
    order: Callable[[Sequence[str]], list[str]]

    def node_name(self) -> str:
        """The name of a new node, before its sequence: a GUID fresh per attempt, so
        that a create whose reply was lost is found again."""
        if self.layout == "kazoo":
            return uuid.uuid4().hex + self.marker
        return f"_c_{uuid.uuid4()}-{self.marker}"

    def side_of(self, child: str) -> Side:
        """The side of the same layout that made *child* (a read-write lock's queue
        holds both)."""
        for side in _SIDES[self.layout].values():
            if side.family == self.family and side.marker in child:
                return side
        return self


def _missing(mine: str) -> EntryGoneError:
    return EntryGoneError(f"{mine} is not among the lock's children any more")


# -- kazoo ------------------------------------------------------------------------------


def _kazoo_pattern(markers: Sequence[str]) -> re.Pattern[str]:
    return re.compile(r"(?:{})(-?\d{{10}})$".format("|".join(map(re.escape, markers))))


def _kazoo(marker: str, excludes: tuple[str, ...], family: tuple[str, ...]) -> Side:
    waits_for = _kazoo_pattern(excludes)
    contenders = _kazoo_pattern(family)

    def blocker(children: Sequence[str], mine: str) -> str | None:
        if mine not in children:
            raise _missing(mine)
        sequence = mine[-10:]
        before = [
            (m.group(1), child)
            for child in children
            if (m := waits_for.search(child)) is not None and m.group(1) < sequence
        ]
        return max(before)[1] if before else None

    def order(children: Sequence[str]) -> list[str]:
        found = [(m.group(1), c) for c in children if (m := contenders.search(c)) is not None]
        return [child for _, child in sorted(found)]

    return Side("kazoo", marker, family, blocker, order)


# -- Curator ----------------------------------------------------------------------------


def _fix(child: str, name: str) -> str:
    """StandardLockInternalsDriver.standardFixForSorting."""
    index = child.rfind(name)
    return child[index + len(name) :] if index >= 0 else child


def _curator(marker: str, names: tuple[str, ...], *, reader: bool = False) -> Side:
    def order(children: Sequence[str]) -> list[str]:
        def key(child: str) -> str:
            for name in names:
                child = _fix(child, name)
            return child

        return sorted(children, key=key)  # stable, as Java's sort

    def blocker(children: Sequence[str], mine: str) -> str | None:
        ordered = order(children)
        if mine not in ordered:
            raise _missing(mine)
        index = ordered.index(mine)
        if not reader:
            return ordered[index - 1] if index else None
        writers = [c for c in ordered[:index] if _WRITE in c]  # the first writer ahead
        return writers[0] if writers else None

    return Side("curator", marker, names, blocker, order)


_READ, _WRITE = "__READ__", "__WRIT__"  # InterProcessReadWriteLock (same length)
_RW = (_READ, _WRITE)

_SIDES: dict[str, dict[str, Side]] = {
    "kazoo": {
        "mutex": _kazoo("__lock__", ("__lock__",), ("__lock__",)),
        "election": _kazoo("__lock__", ("__lock__",), ("__lock__",)),
        "write": _kazoo("__lock__", ("__lock__", "__rlock__"), ("__lock__", "__rlock__")),
        "read": _kazoo("__rlock__", ("__lock__",), ("__lock__", "__rlock__")),
    },
    "curator": {
        "mutex": _curator("lock-", ("lock-",)),
        "election": _curator("latch-", ("latch-",)),
        "write": _curator(_WRITE, _RW),
        "read": _curator(_READ, _RW, reader=True),
    },
}

#: The layouts of this module, and whether their parents are containers.
LAYOUTS = {"kazoo": False, "curator": True}

#: The lease nodes of Curator's ``InterProcessSemaphoreV2`` (``_c_<uuid>-lease-<seq>``
#: under ``<path>/leases``): their names, and their order (by sequence) for status
#: views. Who holds a lease is counted, not waited for: its blocker is not the rule
#: (see :mod:`coord._locks.curator_semaphore`).
CURATOR_LEASE = _curator("lease-", ("lease-",))


def layout_side(layout: str, kind: str) -> Side:
    """The side of *layout* for a recipe of *kind* (``"mutex"``, ``"election"``,
    ``"read"``, ``"write"``), or ConfigurationError at the call."""
    side = _SIDES[layout].get(kind)
    if side is None:
        raise ConfigurationError(f"the {layout!r} layout has no {kind} (use layout='coord')")
    return side
