"""The partitioner's assignment on its own: balanced (⌊P/M⌋ or ⌈P/M⌉ each) and sticky (a
join or a leave moves only what the balance needs), over random histories; the record's
encoding; the key hash, pinned to values that another language must reproduce."""

from __future__ import annotations

import hashlib
import random

import pytest

from coord import ConfigurationError
from coord._membership.assignment import (
    MAX_PARTITIONS,
    Record,
    assign,
    check_partitions,
    partition_of,
)
from tests.faults._partition_checks import need


def moves(previous: dict[int, str], now: dict[int, str]) -> int:
    return sum(1 for p, owner in now.items() if previous.get(p) != owner)


@pytest.mark.parametrize("seed", range(300))
def test_every_step_is_balanced_and_moves_only_what_it_needs(seed: int) -> None:
    rng = random.Random(seed)
    partitions = rng.randint(1, 70)
    steps = [(rng.random() < 0.6, rng.randint(0, 20)) for _ in range(rng.randint(1, 25))]
    members: list[str] = []
    owners: dict[int, str] = {}
    joined = 0
    for join, which in steps:
        if join or not members:
            members.append(f"@m{joined}")
            joined += 1
        else:
            members.remove(members[which % len(members)])
        now = assign(owners, members, partitions)
        if not members:
            assert now == {}
            owners = now
            continue
        assert set(now) == set(range(partitions))
        assert set(now.values()) <= set(members)
        share = partitions // len(members)
        for member in members:
            assert share <= sum(1 for o in now.values() if o == member) <= share + 1
        assert moves(owners, now) == need(owners, members, partitions)
        assert assign(owners, members, partitions) == now, "the same inputs, the same result"
        owners = now


def test_a_join_takes_a_share_and_a_leave_gives_back_only_the_leavers() -> None:
    one = assign({}, ["@a"], 8)
    two = assign(one, ["@a", "@b"], 8)
    assert sorted(p for p, o in two.items() if o == "@b") == [4, 5, 6, 7]  # a's highest
    three = assign(two, ["@a", "@b", "@c"], 8)
    assert {p: o for p, o in three.items() if o != "@c"} == {
        p: o for p, o in two.items() if three[p] != "@c"
    }
    back = assign(three, ["@a", "@c"], 8)
    assert all(back[p] == three[p] for p in range(8) if three[p] != "@b")
    assert assign({}, [], 8) == {}


def test_more_members_than_partitions_leaves_some_with_none() -> None:
    owners = assign({}, ["@a", "@b", "@c"], 2)
    assert sorted(owners.values()) == ["@a", "@b"]


def test_a_record_reads_back_and_a_foreign_value_is_refused() -> None:
    record = Record(5, ("@a", "@b"), {0: "@a", 1: "@b", 3: "@a"})
    again = Record.decode(record.encode(), 42)
    assert again == Record(5, ("@a", "@b"), {0: "@a", 1: "@b", 3: "@a"}, 42)
    assert again.of("@a") == frozenset({0, 3})
    for value in (b"{}", b"[]", b'{"partitions":2,"members":["@a"],"owners":[0,1]}'):
        with pytest.raises((ValueError, KeyError, TypeError)):
            Record.decode(value, 1)


def test_the_key_hash_is_sha256_and_pinned() -> None:
    # What a client in another language must compute: the first 8 bytes of SHA-256 of
    # the key's bytes (UTF-8), big-endian, modulo the partition count.
    for key in ("", "a", "order-42", "ключ"):
        digest = hashlib.sha256(key.encode()).digest()
        assert partition_of(key, 64) == int.from_bytes(digest[:8], "big") % 64
    assert [partition_of(k, 64) for k in ("", "a", "order-42", "ключ")] == [20, 10, 47, 32]
    assert [partition_of(k, 1000) for k in ("", "a", "order-42", "ключ")] == [652, 250, 703, 24]
    assert partition_of(b"order-42", 64) == partition_of("order-42", 64)
    with pytest.raises(TypeError):
        partition_of(42, 64)  # type: ignore[arg-type]


def test_the_partition_count_is_checked() -> None:
    assert check_partitions(1) == 1
    assert check_partitions(MAX_PARTITIONS) == MAX_PARTITIONS
    for bad in (0, MAX_PARTITIONS + 1):
        with pytest.raises(ConfigurationError):
            check_partitions(bad)
    with pytest.raises(TypeError):
        check_partitions(True)
