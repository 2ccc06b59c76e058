"""A looker's stock at a conflict (coord/_jobs/stock.py): a stock taken without lanes,
while other lookers claim, is cut to this looker's lane at its first conflict, not
dropped (each drop was a read of the head of the queue: on etcd that costs the store the
whole queue); a stock still mostly taken by others while in its lane is dropped, and
read again; and alone, a failed claim drops it, as before."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from coord._jobs import records as _records
from coord._jobs.claim import Pick
from coord._jobs.stock import FIRST_LOOK, Stock, lane_of
from coord.abc import Entry, Listing

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


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
    mine = [
        p
        for p in [_pick(n) for n in range(64)]
        if lane_of(p.entry.key if p.entry else "", stock._lookers) == stock.token
    ]
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


def test_lookers_that_know_different_lookers_disagree_only_about_the_missing_ones_jobs() -> None:
    """Lanes by rendezvous hashing: a looker that does not know one of the others yet
    (or no longer) reaches for that one's jobs only, never for the jobs the two of them
    agree are a third one's; and every looker computes the same lane for a key (no
    process's own hash seed in it)."""
    everyone = ["a" * 12, "b" * 12, "c" * 12, "d" * 12]
    keys = [f"q/_jobs/@j{n:032x}" for n in range(2000)]
    full = {k: lane_of(k, everyone) for k in keys}
    assert set(full.values()) == set(everyone)  # every looker has a lane
    shares = [list(full.values()).count(t) for t in everyone]
    assert 2000 // 4 * 0.8 < min(shares) <= max(shares) < 2000 // 4 * 1.2, shares
    partial = {k: lane_of(k, everyone[:3]) for k in keys}
    moved = [k for k in keys if full[k] != partial[k]]
    assert moved
    assert all(full[k] == everyone[3] for k in moved)  # only the missing one's jobs
    assert lane_of("orders/42", everyone) == lane_of("orders/42", list(reversed(everyone)))


def _claims(*tokens: str) -> Listing:
    """A read of the claims: one claim of each looker named (its token in the value)."""
    return Listing(
        tuple(
            Entry(f"q/_claims/@c{n:032x}", json.dumps({"looker": t}).encode(), n, n, 0)
            for n, t in enumerate(tokens, 1)
        ),
        100,
    )


def test_the_lanes_are_learned_again_when_the_lookers_change() -> None:
    """A looker that learns (from the claims it reads) that fewer lookers claim takes a
    lane strictly larger, its old one with it: its remembered lanes are forgotten."""
    stock = Stock("q")
    stock._seen_lookers(_claims("a" * 12, "b" * 12, "c" * 12))
    stock.conflicted(1, 1)  # contended: lanes
    picks = [_pick(n) for n in range(256)]
    before = [p.order for p in stock.share(picks)]
    stock._seen = {stock.token: stock._seen[stock.token], "a" * 12: stock._seen["a" * 12]}
    stock._seen_lookers(_claims("a" * 12))  # b and c no longer claim
    assert stock._lookers == sorted([stock.token, "a" * 12])
    after = [p.order for p in stock.share(picks)]
    assert set(before) < set(after)


def test_a_foreign_looker_token_is_not_taken() -> None:
    """A claim written by something else may name any looker: one that cannot be hashed
    as lanes are (too long for a key, not ASCII) is left out, not raised at each look."""
    stock = Stock("q")
    stock._seen_lookers(_claims("x" * 100, "\ud800", "", "a" * 12))
    assert stock._lookers == sorted([stock.token, "a" * 12])
    stock.conflicted(1, 1)
    assert stock.share([_pick(n) for n in range(64)])


def test_a_share_stops_at_what_the_stock_keeps() -> None:
    stock = _stock(4)
    stock.conflicted(1, 1)
    picks = [_pick(n) for n in range(4096)]
    everything = stock.share(picks)
    assert len(everything) > 200
    assert stock.share(picks, 128) == everything[:128]


def test_a_stock_in_its_lane_is_cut_again_when_another_looker_is_learned() -> None:
    """After a conflict a looker reads the claims again (Looker._contended): a looker it
    did not know (made known by its presence) takes its lane's jobs out of the stock,
    and only those; the jobs of its own lane stay, in their order."""
    stock = _stock(2)  # itself and other0
    stock.conflicted(1, 1)  # contended: the stock cut to its lane among the two
    before = list(stock.picks)
    everyone = sorted([*stock._lookers, "b" * 12])
    stock.learned(_claims("other0", "b" * 12))
    assert stock._lookers == everyone
    mine = [p for p in before if p.entry and lane_of(p.entry.key, everyone) == stock.token]
    assert stock.picks == mine
    assert len(stock.picks) < len(before)
    kept = list(stock.picks)
    stock.learned(_claims("other0", "b" * 12))  # nobody new: nothing changes
    assert stock.picks == kept


def test_learning_the_lookers_uncontended_keeps_the_stock() -> None:
    """Without a conflict lately a looker takes the oldest jobs, whoever's lane: what it
    learns of the lookers changes nothing in its stock."""
    stock = _stock(1)
    before = list(stock.picks)
    stock.learned(_claims("b" * 12))
    assert stock.others()
    assert stock.picks == before


class _Listings:
    """A backend that lists the jobs *jobs* (as far as the limit asked) and the claim of
    the first, and records the limits asked for."""

    def __init__(self, jobs: list[Entry]) -> None:
        self.jobs = jobs
        self.limits: list[int | None] = []

    async def entries(
        self, prefix: str, *, limit: int | None = None, stale_ok: bool = False
    ) -> Listing:
        if prefix.endswith("/_claims/"):
            return Listing((Entry("q/_claims/@cc", b"{}", 1, 1, 7),), 1)
        self.limits.append(limit)
        return Listing(tuple(self.jobs[:limit]), 1)


class _Session:
    def __init__(self, backend: _Listings) -> None:
        self.backend = backend


def _job(n: int, key: str) -> Entry:
    state = _records.State(id=f"{n:032x}", key=key, claim="c" if n == 0 else None)
    return Entry(f"q/_jobs/@j{n:032x}", _records.encode(state, b""), n + 1, n + 1, 0)


def _looking(
    jobs: list[Entry],
) -> tuple[_Listings, Stock, Callable[[], Awaitable[list[int]]]]:
    """A stock of the queue *jobs*, its backend, and a look: a read and a choice,
    returning the picks' places in the read."""
    backend = _Listings(jobs)
    session: Any = _Session(backend)
    stock = Stock("q")

    async def look() -> list[int]:
        read, claims = await stock.read(session)
        picks, _ = stock.choose(read, claims, 0.0)
        return [p.order for p in picks]

    return backend, stock, look


@pytest.mark.anyio
async def test_a_look_that_had_to_go_further_starts_there_next_time() -> None:
    """The oldest FIRST_LOOK jobs all held back by their key (its first job claimed):
    the read goes further (8x), and the next read asks for
    that many at once, not for the oldest FIRST_LOOK first and then again (with keys busy
    and workers idle, every look did both). Once a job is claimable among the oldest
    FIRST_LOOK, reads start there again."""
    jobs = [_job(n, "busy") for n in range(FIRST_LOOK + 1)] + [_job(FIRST_LOOK + 1, "free")]
    backend, _, look = _looking(jobs)
    assert await look() == [FIRST_LOOK + 1]
    assert backend.limits == [FIRST_LOOK, FIRST_LOOK * 8]
    backend.limits.clear()
    assert await look() == [FIRST_LOOK + 1]
    assert backend.limits == [FIRST_LOOK * 8]  # at once
    backend.limits.clear()
    backend.jobs = jobs[1:]  # job 0 acked: the next of its key is claimable, the oldest
    assert (await look())[0] == 0
    assert backend.limits == [FIRST_LOOK * 8]
    backend.limits.clear()
    await look()
    assert backend.limits == [FIRST_LOOK]  # back to the oldest FIRST_LOOK first


@pytest.mark.anyio
async def test_a_job_with_a_priority_is_noticed_in_a_read_of_every_job() -> None:
    """A read of every job still notices a job with a priority, and from then on the
    looker claims the highest priorities first (a read of every job skipped the check: a
    look reads every job once nothing is claimable among the oldest 32,768)."""
    jobs = [_job(n, "busy") for n in range(FIRST_LOOK + 1)] + [_job(FIRST_LOOK + 1, "free")]
    backend = _Listings(jobs)
    session: Any = _Session(backend)
    stock = Stock("q")
    stock._look = None  # (a read of every job)
    urgent = _records.State(id="f" * 32, key="other", priority=5)
    backend.jobs = [*jobs, Entry(f"q/_jobs/@j{'f' * 32}", _records.encode(urgent, b""), 999, 999)]
    read, claims = await stock.read(session)
    assert stock.priorities
    assert backend.limits == [None]  # (not read twice)
    picks, _ = stock.choose(read, claims, 0.0)
    assert [p.state.id for p in picks if p.state] == ["f" * 32, f"{FIRST_LOOK + 1:032x}"]


@pytest.mark.anyio
async def test_a_look_starts_no_further_than_8x_the_first() -> None:
    """However far the last look had to go, the next one asks for at most 8x FIRST_LOOK
    first: the first look after the head frees up reads that many, not the whole queue
    (a review: 100,000 jobs read at each such look)."""
    far = FIRST_LOOK * 8 + 1
    jobs = [_job(n, "busy") for n in range(far)] + [_job(far, "free")]
    backend, _, look = _looking(jobs)
    assert await look() == [far]
    assert backend.limits == [FIRST_LOOK, FIRST_LOOK * 8, FIRST_LOOK * 64]
    backend.limits.clear()
    assert await look() == [far]
    assert backend.limits == [FIRST_LOOK * 8, FIRST_LOOK * 64]
