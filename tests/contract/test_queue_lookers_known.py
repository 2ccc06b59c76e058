"""Lookers in contention make themselves known (``Looker._contended``): a looker that
another client's looker beat to a job makes an entry among the claims that names it, so
that the others' next read of the claims puts it among the lookers they share lanes with
(one that held no claim was never seen, and lost every job of its lane to those that took
that lane for theirs). The entry is no job's claim: ``coord status`` does not show it,
and it goes when its looker goes idle."""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Any

import anyio
import pytest

import coord
import coord._jobs.looker
import coord._jobs.stock
from coord._core.exceptions import ResyncNeeded
from coord._jobs.claim import _first
from coord._jobs.looker import Looker, looker_for
from coord._jobs.records import is_looker
from coord.abc import Create, Entry, Remove, Update
from coord.cli import _snapshot

pytestmark = pytest.mark.anyio

NAME = "known"


async def lookers_named(client: coord.Client) -> list[str]:
    """The lookers whose presence is among the queue's claims (their tokens)."""
    entries = (await client.backend.entries(f"{NAME}/_claims/")).entries
    return [json.loads(e.value)["looker"] for e in entries if is_looker(e.key)]


async def until_lookers_named(client: coord.Client, wanted: list[str]) -> None:
    """Wait until the presences among the claims name *wanted* (the claims watched from
    each listing; never polled)."""
    backend, prefix = client.backend, f"{NAME}/_claims/"
    while True:
        listing = await backend.entries(prefix)
        named = [json.loads(e.value)["looker"] for e in listing.entries if is_looker(e.key)]
        if named == wanted:
            return
        with contextlib.suppress(ResyncNeeded):
            async with backend.watch(prefix, revision=listing.revision) as changes:
                async for _ in changes:
                    break


async def looker_of(client: coord.Client, job: coord.Job) -> str:
    """The looker that claimed *job* for *client*, as its claim entry names it."""
    for entry in (await client.backend.entries(f"{NAME}/_claims/")).entries:
        value = json.loads(entry.value)
        if value.get("job") == job.id:
            return str(value["looker"])
    raise AssertionError(f"no claim of {job.id}")


async def made_known(a: coord.Client, b: coord.Client) -> str:
    """B's looker is beaten to a job by A's: B is made known (and every job claim is
    shown by ``coord status``, the presence none of them). Returns B's looker's token,
    all claims released."""
    qa, qb = a.queue(NAME), b.queue(NAME)
    for payload in (b"j1", b"j2", b"j3"):
        await qa.put(payload)
    async with qb.claim() as first:  # B's looker reads j1-j3, hands j1, stocks j2, j3
        assert first.payload == b"j1"
        async with qa.claim() as taken:  # A reads: j1 is claimed, j2 is not
            assert taken.payload == b"j2"
            assert await lookers_named(a) == []  # nobody contended yet
            async with qb.claim() as second:  # j2 from B's stock: A had it
                assert second.payload == b"j3"
                token_b = await looker_of(b, first)
                assert await looker_of(b, second) == token_b
                assert token_b != await looker_of(a, taken)
                await until_lookers_named(a, [token_b])
                shown = await _snapshot._queue(a, NAME, {})
                assert sorted(c["job"] for c in shown["claims"]) == sorted(
                    j.id for j in (first, taken, second)
                )
                assert shown["in_flight"] == 3
    return token_b


async def test_a_looker_beaten_to_a_job_is_made_known_until_it_goes_idle(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    # B's stock must still be fresh when its second worker claims from it, however slow
    # the machine: else it reads the head again and meets no conflict.
    monkeypatch.setattr(coord._jobs.stock, "STOCK_FOR", 60.0)
    monkeypatch.setattr(coord._jobs.looker, "STOPPED_FOR", 60.0)  # (not this way)
    a, b, _, _ = clients
    with anyio.fail_after(20):
        token_b = await made_known(a, b)
        assert await lookers_named(a) == [token_b]  # all B's claims ended: still known
        # B's worker waits for a job with the queue empty: its looker goes idle, and
        # its presence goes (an idle looker that others still knew would keep a lane).
        async with anyio.create_task_group() as tg:
            tg.start_soon(_claim_one, b.queue(NAME))
            await until_lookers_named(a, [])
            tg.cancel_scope.cancel()


async def test_a_looker_made_known_that_stops_is_known_no_more(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No worker of B waits any more (its ``run()`` drained, say): B's presence goes
    STOPPED_FOR seconds after its looker last ended, and not before (its workers may be
    back for a job)."""
    monkeypatch.setattr(coord._jobs.stock, "STOCK_FOR", 60.0)
    monkeypatch.setattr(coord._jobs.looker, "STOPPED_FOR", 2.0)
    a, b, _, _ = clients
    with anyio.fail_after(20):
        token_b = await made_known(a, b)
        assert await lookers_named(a) == [token_b]
        await until_lookers_named(a, [])
        gone = anyio.current_time()
    stopped = looker_for(b._source, NAME)._stopped_at  # (its last end: in its clock)
    assert gone - stopped > 2.0 - 0.1  # (a timer may fire up to 0.05 s early)


async def test_a_presence_that_goes_wakes_no_idle_looker(clients: list[coord.Client]) -> None:
    """Idle lookers watch the claims for deletions (an ended claim may free a job); a
    presence that goes frees none, and wakes none of them (on etcd each wake is a read
    of the head, which costs the store the whole queue)."""
    a = clients[0]
    backend, prefix = a.backend, f"{NAME}/_claims/"
    for _ in range(3):
        presence, claim = await _made(a, "@l", "@c")
        after = await backend.entries(prefix)
        woke = anyio.Event()
        outcome: list[str] = []

        async def watcher(revision: int, woke: anyio.Event, outcome: list[str]) -> None:
            try:
                await _first(backend, prefix, revision, deletes_only=True)
                outcome.append("woken")
            except ResyncNeeded:  # (ZooKeeper, armed after a change: no history)
                outcome.append("resync")
            woke.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watcher, after.revision, woke, outcome)
            await anyio.sleep(0.3)  # the watch armed (on ZooKeeper: its listing answered)
            assert await backend.transact([Remove(presence)]) is not None
            with anyio.move_on_after(0.5):
                await woke.wait()
            if outcome == ["resync"]:
                assert await backend.transact([Remove(claim)]) is not None
                continue  # armed too late to tell: again
            assert outcome == [], "woken by the presence's deletion"
            assert await backend.transact([Remove(claim)]) is not None
            with anyio.fail_after(10):  # (a claim's deletion does wake it)
                await woke.wait()
            assert outcome == ["woken"]
        return
    pytest.fail("the watch was armed too late three times")


async def _made(client: coord.Client, *marks: str) -> list[Entry]:
    session = await client._source.live()
    ops = [
        Create(f"{NAME}/_claims/", f"{m}{uuid.uuid4().hex}", b"{}", session.lease) for m in marks
    ]
    done = await client.backend.transact(ops)
    assert done is not None
    return [e for e in done if e is not None]


async def _claim_one(queue: coord.Queue) -> None:
    async with queue.claim():
        pytest.fail("the queue is empty")


async def _all_claims(client: coord.Client) -> list[str]:
    return [e.key for e in (await client.backend.entries(f"{NAME}/_claims/")).entries]


async def test_a_lone_looker_whose_claim_fails_makes_no_presence(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alone, a failed claim is no other looker's: nothing is made known. (A job acked
    by nobody else: here its own worker's claim fails, as a dead letter on its last
    attempt would.)"""
    monkeypatch.setattr(coord._jobs.stock, "STOCK_FOR", 60.0)
    learned = anyio.Event()
    learn = Looker._learn

    async def learn_and_tell(self: Looker, session: Any) -> None:
        await learn(self, session)
        learned.set()

    monkeypatch.setattr(Looker, "_learn", learn_and_tell)
    a = clients[0]
    queue = a.queue(NAME)
    for payload in (b"j1", b"j2", b"j3"):
        await queue.put(payload)
    with anyio.fail_after(20):
        async with queue.claim() as first:  # the stock: j2, j3
            assert first.payload == b"j1"
            # j2 changes under the stock (a second client's put of the same job id
            # would not: this is the store's own answer, "not as read").
            jobs = (await a.backend.entries(f"{NAME}/_jobs/")).entries
            assert await a.backend.transact([Update(jobs[1], jobs[1].value)]) is not None
            async with queue.claim() as second:  # j2 refused: read again
                assert second.payload in (b"j2", b"j3")
                await learned.wait()  # it met the refusal, and read the claims: nobody else
                assert await lookers_named(a) == []
