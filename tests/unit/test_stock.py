"""A looker's stock at a conflict (coord/_jobs/stock.py): a stock taken without lanes,
while other lookers claim, is cut to this looker's lane at its first conflict, not
dropped (each drop was a read of the head of the queue: on etcd that costs the store the
whole queue); a stock still mostly taken by others while in its lane is dropped, and
read again; and alone, a failed claim drops it, as before."""

from __future__ import annotations

from coord._jobs import records as _records
from coord._jobs.claim import Pick
from coord._jobs.stock import Stock, _lane
from coord.abc import Entry


def _pick(n: int) -> Pick:
    pick = Pick()
    pick.entry = Entry(f"q/_jobs/@j{n:032x}", b"", n, n, 0)
    pick.state = _records.State(id=f"{n:032x}")
    pick.order = n
    return pick


def _stock(lookers: int) -> Stock:
    stock = Stock("q")
    stock._lookers = sorted([stock.token, *(f"other{n}" for n in range(lookers - 1))])
    stock.picks = [_pick(n) for n in range(64)]
    return stock


def test_a_first_conflict_cuts_the_stock_to_its_own_lane() -> None:
    stock = _stock(4)
    assert stock.uncontended()
    stock.conflicted(1, 1)
    lane, lanes = stock._lookers.index(stock.token), 4
    mine = [p for p in [_pick(n) for n in range(64)] if _lane(p, lanes) == lane]
    assert mine, "(64 jobs over 4 lanes)"
    assert [p.order for p in stock.picks] == [p.order for p in mine]
    assert not stock.uncontended()
    assert stock.share(stock.picks) == stock.picks  # in its lane from now on


def test_a_stock_mostly_taken_in_its_lane_is_read_again() -> None:
    stock = _stock(4)
    stock.conflicted(1, 1)  # contended from here on: its lane
    assert stock.picks
    stock.conflicted(2, 3)
    assert stock.picks == []


def test_a_few_conflicts_in_its_lane_keep_the_stock() -> None:
    stock = _stock(4)
    stock.conflicted(1, 1)
    kept = list(stock.picks)
    stock.conflicted(1, 4)
    assert stock.picks == kept


def test_alone_a_failed_claim_drops_the_stock() -> None:
    """No other looker seen: the "conflict" is a claim that failed otherwise (the store
    did not answer it, its job was parked), and the oldest job may still be claimable.
    The stock is dropped, so that the head is read again and the oldest job claimed
    first (see test_stock_fifo_after_failed_claim.py)."""
    stock = _stock(1)
    stock.conflicted(1, 1)
    assert stock.picks == []
