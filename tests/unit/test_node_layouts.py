"""kazoo's and Curator's rules (coord/_locks/node_layouts.py) on listings made by hand:
names, order, and whom each contender waits for, as their sources have it."""

from __future__ import annotations

import re

import pytest

from coord import ConfigurationError
from coord._core.exceptions import EntryGoneError
from coord._locks.node_layouts import CURATOR_LEASE, layout_side

K_LOCK, K_READ = "c" * 32 + "__lock__", "d" * 32 + "__rlock__"


def test_kazoo_names_and_predecessors() -> None:
    mutex, read, write = (layout_side("kazoo", k) for k in ("mutex", "read", "write"))
    assert re.fullmatch(r"[0-9a-f]{32}__lock__", mutex.node_name())
    assert re.fullmatch(r"[0-9a-f]{32}__rlock__", read.node_name())
    children = [
        "a__lock__0000000003",
        "b__rlock__0000000002",
        "c__lock__0000000000",
        "d__rlock__0000000001",
        "other",
    ]
    # Lock: the nearest __lock__ ahead (readers ignored, kazoo's _EXCLUDE_NAMES).
    assert mutex.blocker(children, "a__lock__0000000003") == "c__lock__0000000000"
    # WriteLock: the nearest of either kind; ReadLock: the nearest writer.
    assert write.blocker(children, "a__lock__0000000003") == "b__rlock__0000000002"
    assert read.blocker(children, "b__rlock__0000000002") == "c__lock__0000000000"
    assert read.blocker(children, "d__rlock__0000000001") == "c__lock__0000000000"
    assert write.blocker(children, "c__lock__0000000000") is None
    assert mutex.order(children) == ["c__lock__0000000000", "a__lock__0000000003"]
    with pytest.raises(EntryGoneError):
        mutex.blocker(children, "z__lock__0000000009")


def test_curator_names_and_predecessors() -> None:
    mutex, latch = layout_side("curator", "mutex"), layout_side("curator", "election")
    assert re.fullmatch(r"_c_[0-9a-f-]{36}-lock-", mutex.node_name())
    assert re.fullmatch(r"_c_[0-9a-f-]{36}-latch-", latch.node_name())
    # Every child is sorted, by the text after the last "lock-": a kazoo node (no
    # "lock-") sorts by its whole name, after the digits (anchors: Curator sorts
    # kazoo's names by the whole string).
    children = ["_c_u1-lock-0000000002", "k__lock__0000000000", "_c_u2-lock-0000000001"]
    assert mutex.order(children) == [children[2], children[0], children[1]]
    assert mutex.blocker(children, children[0]) == children[2]
    assert mutex.blocker(children, children[2]) is None
    assert mutex.blocker(children, children[1]) == children[0]


def test_curator_read_write() -> None:
    read, write = layout_side("curator", "read"), layout_side("curator", "write")
    w0, r1, w2, r3 = (
        "_c_a-__WRIT__0000000000",
        "_c_b-__READ__0000000001",
        "_c_c-__WRIT__0000000002",
        "_c_d-__READ__0000000003",
    )
    children = [r3, w2, r1, w0]
    assert write.order(children) == [w0, r1, w2, r3]
    assert write.blocker(children, w2) == r1  # the node right ahead, any kind
    assert read.blocker(children, r3) == w0  # the *first* writer ahead (Curator's)
    assert read.blocker([r1, r3], r3) is None
    assert read.side_of(w2) is write


def test_refused_recipes() -> None:
    with pytest.raises(ConfigurationError, match="no semaphore"):
        layout_side("kazoo", "semaphore")
    with pytest.raises(ConfigurationError, match="no semaphore"):
        layout_side("curator", "semaphore")


def test_curator_lease_nodes() -> None:
    """InterProcessSemaphoreV2's leases: protected ``lease-`` nodes, in sequence order
    (for status views: who holds is counted, see curator_semaphore)."""
    name = CURATOR_LEASE.node_name()
    assert re.fullmatch(r"_c_[0-9a-f-]{36}-lease-", name)
    a, b = "_c_ffff-lease-0000000001", "_c_0000-lease-0000000002"
    assert CURATOR_LEASE.order([b, a]) == [a, b]
