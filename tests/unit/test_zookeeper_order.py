"""The order of a ZooKeeper queue's children (``waiters_in_order``): the head of a busy
queue is listed again and again, so it is sorted without parsing each name; it must
still be exactly the order of the parsed names, with one name per sequence (a node
moved into its shard, listed twice, by its shard name), whatever else is listed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coord._core.keys import WAITER_MARK
from coord.backends.zookeeper._paths import sharded_name, waiter_names, waiters_in_order


def parsed_order(children: list[str]) -> list[str]:
    """The order by parsing every name (what the listing did before)."""
    by_sequence: dict[int, str] = {}
    for waiter in waiter_names(children):
        if waiter.sequence not in by_sequence or ":" in waiter.name:
            by_sequence[waiter.sequence] = waiter.name
    return list(by_sequence.values())


def waiter(n: int, kind: str = "j") -> str:
    return f"{WAITER_MARK}{kind}{n * 7919:x}-{n:010d}"


_others = st.sampled_from(
    [
        "sub",  # a nested name
        f"{WAITER_MARK}00000001",  # a shard directory
        f"{WAITER_MARK}x-12345678ab",  # not digits
        f"{WAITER_MARK}x-123",  # too short a sequence
        "plain-0000000001",  # no mark
        f"{WAITER_MARK}-0000000002",  # no waiter id
    ]
)


@settings(max_examples=200, deadline=None)
@given(
    sequences=st.lists(st.integers(0, 10**6), unique=True, max_size=40),
    moved=st.sets(st.integers(0, 39)),
    others=st.lists(_others, max_size=4),
    data=st.data(),
)
def test_the_order_is_the_parsed_order(
    sequences: list[int], moved: set[int], others: list[str], data: st.DataObject
) -> None:
    children = [waiter(n) for n in sequences]
    children += [sharded_name(waiter(sequences[i]), 99) for i in moved if i < len(sequences)]
    children = data.draw(st.permutations(children + others))
    assert waiters_in_order(children) == parsed_order(children)


def test_a_plain_queue_takes_the_fast_path_in_sequence_order() -> None:
    children = [waiter(n) for n in (5, 1, 10_000_000_000 - 1, 3)]
    assert waiters_in_order(children) == [waiter(1), waiter(3), waiter(5), waiter(9_999_999_999)]
