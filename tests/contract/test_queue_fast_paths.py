"""The queue's fast paths keep its promises. Acks of one client that come while another
is in flight go to the store as one transaction (coord._jobs.commit), and each worker is
still told its own ack's outcome: done, refused ("not done"), or, after a lost answer,
what the store holds. A key's next job, once its ack is done, is claimed from the
looker's stock without a read (coord._jobs.looker)."""

from __future__ import annotations

import gc
import weakref
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import coord
from coord._jobs import commit
from coord._jobs import looker as _looker
from coord._jobs import stock as _stock
from coord.abc import Remove, Update

if TYPE_CHECKING:
    from collections.abc import Sequence

    from coord.abc import Op

pytestmark = pytest.mark.anyio

WORKERS = 6


class Recorder:
    """Wraps a backend's transact: records each transaction's operations, and can lose
    the answer of the first transaction of more than one ack (applied, then raises)."""

    def __init__(self, backend: Any, *, lose_group_answer: bool = False) -> None:
        self.calls: list[Sequence[object]] = []
        self._transact = backend.transact
        self._lose = lose_group_answer
        backend.transact = self

    async def __call__(self, ops: Sequence[object]) -> Any:
        self.calls.append(ops)
        result = await self._transact(ops)
        if self._lose and _acks(ops) > 1:
            self._lose = False
            raise coord.BackendUnavailable("the answer was lost (test)")
        return result

    def groups(self) -> list[int]:
        return [_acks(ops) for ops in self.calls if _acks(ops) > 1]


def _acks(ops: Sequence[object]) -> int:
    return len(ops) // 2 if all(isinstance(op, Remove) for op in ops) else 0


async def _ack_at_once(
    client: coord.Client, name: str, before_acks: Any = None
) -> dict[str, BaseException | None]:
    """WORKERS workers of *client* claim a job each, then all leave their blocks at once:
    the job id -> None (acked) or the error of the block."""
    queue = client.queue(name)
    claimed = 0
    all_claimed, leave = anyio.Event(), anyio.Event()
    outcomes: dict[str, BaseException | None] = {}

    async def worker() -> None:
        nonlocal claimed
        job_id = ""
        try:
            async with queue.claim() as job:
                job_id = job.id
                claimed += 1
                if claimed == WORKERS:
                    all_claimed.set()
                await leave.wait()
        except coord.ClaimLost as exc:
            outcomes[job_id] = exc
        else:
            outcomes[job_id] = None

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for _ in range(WORKERS):
                tg.start_soon(worker)
            await all_claimed.wait()
            if before_acks is not None:
                await before_acks()
            leave.set()
    return outcomes


async def _put(client: coord.Client, name: str) -> list[str]:
    queue = client.queue(name)
    return [(await queue.put(f"job {n}".encode())).id for n in range(WORKERS)]


async def _jobs_left(client: coord.Client, name: str) -> list[coord.abc.Entry]:
    return list((await client.backend.entries(f"{name}/_jobs/")).entries)


async def test_acks_at_once_go_together_and_are_done(clients: list[coord.Client]) -> None:
    a = clients[0]
    ids = await _put(a, "grouped")
    recorder = Recorder(a.backend)
    outcomes = await _ack_at_once(a, "grouped")
    assert outcomes == dict.fromkeys(ids)
    assert recorder.groups(), "no two acks went in one transaction"
    assert sum(_acks(ops) for ops in recorder.calls) == WORKERS  # each ack sent once
    assert await _jobs_left(a, "grouped") == []
    assert (await a.queue("grouped").stats()).in_flight == 0


async def test_a_refused_ack_in_a_group_is_told_only_to_its_worker(
    clients: list[coord.Client],
) -> None:
    """One job is changed behind its worker's back (its version moves on), so its ack is
    refused, and with it the group it went in: the others are sent again alone and are
    done; only that worker hears "not done"."""
    a, b = clients[0], clients[1]
    await _put(a, "refused")
    recorder = Recorder(a.backend)
    changed: list[str] = []

    async def change_one() -> None:
        entry = (await _jobs_left(b, "refused"))[-1]
        assert await b.backend.transact([Update(entry, entry.value)]) is not None
        changed.append(entry.key)

    outcomes = await _ack_at_once(a, "refused", change_one)
    refused = {i: e for i, e in outcomes.items() if e is not None}
    assert len(refused) == 1, outcomes
    [error] = refused.values()
    assert isinstance(error, coord.ClaimLost)
    assert error.outcome == "not done"
    assert recorder.groups(), "no two acks went in one transaction"
    assert [e.key for e in await _jobs_left(a, "refused")] == changed


async def test_a_group_whose_answer_was_lost_is_found_done(clients: list[coord.Client]) -> None:
    """The store applied a group of acks and its answer was lost: each worker reads what
    the store holds and is told "done" (not "not done", which a resend would say)."""
    a = clients[0]
    ids = await _put(a, "lost")
    recorder = Recorder(a.backend, lose_group_answer=True)
    outcomes = await _ack_at_once(a, "lost")
    assert outcomes == dict.fromkeys(ids)
    assert recorder.groups()
    assert await _jobs_left(a, "lost") == []


def _count_reads(client: coord.Client) -> list[str]:
    """The prefixes *client*'s backend lists from now on (reads of a queue's head)."""
    reads: list[str] = []
    entries = client.backend.entries

    async def counted(prefix: str, **options: Any) -> Any:
        reads.append(prefix)
        return await entries(prefix, **options)

    client.backend.entries = counted  # type: ignore[method-assign]
    return reads


async def test_a_keys_next_job_is_claimed_after_its_ack_without_a_read(
    clients: list[coord.Client],
) -> None:
    """The looker that claimed a key's job learns of its ack: the key's next job (seen
    in its last read) goes into its stock, and the next claim reads nothing (on etcd a
    read of the head of the queue costs the store the whole queue)."""
    a = clients[0]
    queue = a.queue("successor")
    first = await queue.put(b"a1", key="a")
    second = await queue.put(b"a2", key="a")
    reads = _count_reads(a)
    with anyio.fail_after(10):
        async with queue.claim() as job:
            assert job.id == first.id
        read_before = len(reads)
        async with queue.claim() as job:
            assert job.id == second.id
    assert reads[read_before:] == [], "the key's next job was read for"


async def test_a_keys_jobs_go_on_one_after_another_without_a_read(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only the next job of a key: each job of it the last read saw follows its
    predecessor's ack without a read (each was a read of the head every other job: 0.35
    reads a job with 16 keys and 8 workers on etcd, 0.20 after). In key order, and each
    only after the ack of the one before."""
    a = clients[0]
    queue = a.queue("successors")
    ids = [(await queue.put(f"a{n}".encode(), key="a")).id for n in range(6)]
    other = await queue.put(b"b", key="b")  # claimable all along: not read for either
    monkeypatch.setattr(_stock, "STOCK_FOR", 60.0)  # no read for age on a slow machine
    reads = _count_reads(a)
    claimed: list[str] = []
    with anyio.fail_after(10):
        async with queue.claim() as job:
            claimed.append(job.id)
        read_before = len(reads)
        for _ in ids[1:]:
            async with queue.claim() as job:
                claimed.append(job.id)
        tail = reads[read_before:]
        async with queue.claim() as job:
            claimed.append(job.id)
    assert claimed == [*ids, other.id]
    assert tail == [], "a key's jobs were read for"


async def test_a_lost_session_that_acked_is_not_kept(clients: list[coord.Client]) -> None:
    """The client outlives its sessions: one that acked a job and was lost is freed once
    closed (the committer of its acks does not keep it, nor its backend's state, alive)."""
    a = clients[0]
    queue = a.queue("freed")
    await queue.put(b"job")
    with anyio.fail_after(10):
        async with queue.claim():
            pass
    old = weakref.ref(a.session)
    assert old() in commit._COMMITTERS
    session = a.session
    session.declare_lost("lost by the test")
    while session.running:
        await anyio.lowlevel.checkpoint()
    del session
    with anyio.fail_after(10):
        await queue.put(b"job")  # the looker's stock is of the new session now
        async with queue.claim():
            pass
    for _ in range(3):
        gc.collect()
    assert old() is None, gc.get_referrers(old())


async def test_an_idle_looker_holds_no_more_than_its_stock_of_payloads(
    clients: list[coord.Client],
) -> None:
    """The looker keeps the next job of a key for the jobs it may ack (Stock._after),
    not every job of its last read: a long queue of one key, each job 16 KiB, and the
    looker holds no more payloads than its stock may (1 MiB) once nobody waits."""
    a = clients[0]
    queue = a.queue("held")
    for n in range(100):
        await queue.put(bytes([n]) * (16 << 10), key="k")
    with anyio.fail_after(10):
        async with queue.claim():
            pass
    [held] = [
        looker for looker in _looker._LOOKERS[a._source].values() if looker._name.endswith("held")
    ]
    payloads = sum(len(entry.value) for entry, _ in held._stock._after.values())
    assert payloads <= _stock.STOCK_BYTES, f"{payloads} bytes of payloads held"


def _jobs_updated(client: coord.Client, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The store keys of the jobs *client*'s transactions update from now on (claims)."""
    touched: list[str] = []
    transact = client.backend.transact

    async def recorded(ops: Sequence[Op]) -> Any:
        touched.extend(op.entry.key for op in ops if isinstance(op, Update))
        return await transact(ops)

    monkeypatch.setattr(client.backend, "transact", recorded)
    return touched


async def test_a_claim_acked_between_the_two_reads_is_not_taken_for_dead(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A looker reads the jobs, then the claims. A claim acked between the two reads is
    missing from the claims while its job, as read, still names it: the looker reads
    that job again and finds it gone, so it does not claim it (a claim in vain, the
    stock dropped, the head read again: on etcd, 0.3 a job at 32 workers over 16 keys)
    nor the next job of its key on the word of the first read; it claims that one once
    the queue says it is free."""
    a, b = clients[0], clients[1]
    queue_a, queue_b = a.queue("between"), b.queue("between")
    first = await queue_a.put(b"1", key="k")
    second = await queue_a.put(b"2", key="k")
    claimed, leave = anyio.Event(), anyio.Event()
    acked = anyio.Event()

    async def hold_first() -> None:
        async with queue_a.claim() as job:
            assert job.id == first.id
            claimed.set()
            await leave.wait()
        acked.set()

    entries = b.backend.entries

    async def between(prefix: str, **options: Any) -> Any:
        if prefix.endswith("/_claims/") and not leave.is_set():
            leave.set()  # a acks its job after b read the jobs, before b reads the claims
            await acked.wait()
        return await entries(prefix, **options)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_first)
            await claimed.wait()
            monkeypatch.setattr(b.backend, "entries", between)
            touched = _jobs_updated(b, monkeypatch)
            async with queue_b.claim() as job:
                assert (job.id, job.attempt) == (second.id, 0)
    assert leave.is_set()
    assert [key for key in touched if first.id in key] == [], "b claimed the acked job"
    stats = await queue_a.stats()
    assert (stats.depth, stats.in_flight) == (0, 0)


async def test_a_job_claimed_again_between_the_reads_is_not_claimed_twice(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other way a job changes between the looker's two reads: its claim is given
    back before the claims are read, and another client claims it after (a claim the
    claims read lacks, on a job read again). That claim is live: the looker passes the
    job over and claims the next one; the other client's claim holds and its ack is
    done."""
    a, b, c = clients[0], clients[1], clients[2]
    first = await a.queue("again").put(b"1")
    second = await a.queue("again").put(b"2")
    claimed, give_back, given_back = anyio.Event(), anyio.Event(), anyio.Event()
    reclaimed, leave = anyio.Event(), anyio.Event()
    outcome: list[tuple[str, bool]] = []

    async def hold_and_give_back() -> None:
        async with a.queue("again").claim() as job:
            assert job.id == first.id
            claimed.set()
            await give_back.wait()
            job.defer()
        given_back.set()

    async def claim_again() -> None:
        async with c.queue("again").claim() as job:
            assert job.id == first.id
            reclaimed.set()
            await leave.wait()
            outcome.append((job.id, job.lost))

    entries, get = b.backend.entries, b.backend.get

    async def reads(prefix: str, **options: Any) -> Any:
        if prefix.endswith("/_claims/") and not give_back.is_set():
            give_back.set()  # given back after b read the jobs, before it reads the claims
            await given_back.wait()
        return await entries(prefix, **options)

    async def gets(key: str) -> Any:
        if first.id in key and not reclaimed.is_set():
            tg.start_soon(claim_again)  # claimed again after b read the claims
            await reclaimed.wait()
        return await get(key)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_and_give_back)
            await claimed.wait()
            monkeypatch.setattr(b.backend, "entries", reads)
            monkeypatch.setattr(b.backend, "get", gets)
            touched = _jobs_updated(b, monkeypatch)
            async with b.queue("again").claim() as job:
                assert (job.id, job.attempt) == (second.id, 0)
            leave.set()
    assert reclaimed.is_set()
    assert outcome == [(first.id, False)]  # c's claim held to its ack
    assert [key for key in touched if first.id in key] == [], "b claimed the job c holds"
    stats = await a.queue("again").stats()
    assert (stats.depth, stats.in_flight) == (0, 0)


async def test_a_failed_read_again_of_one_of_several_jobs_is_retried(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several jobs name claims the claims read lacks, and one of their reads again fails
    (the store did not answer it): the looker reads again, as after any failed read, and
    its worker gets the claimable job; nobody is told the failure (nor a group of it)."""
    a, b = clients[0], clients[1]
    queue_a, queue_b = a.queue("again-fails"), b.queue("again-fails")
    await queue_a.put(b"1")
    await queue_a.put(b"2")
    third = await queue_a.put(b"3")
    claimed, leave, acked = anyio.Event(), anyio.Event(), anyio.Event()

    async def hold_two() -> None:
        async with queue_a.claim(), queue_a.claim():
            claimed.set()
            await leave.wait()
        acked.set()

    entries, get = b.backend.entries, b.backend.get
    failed: list[str] = []

    async def between(prefix: str, **options: Any) -> Any:
        if prefix.endswith("/_claims/") and not leave.is_set():
            leave.set()  # a acks both after b read the jobs, before b reads the claims
            await acked.wait()
        return await entries(prefix, **options)

    async def gets(key: str) -> Any:
        if not failed:
            failed.append(key)
            raise coord.BackendUnavailable("no answer (test)")
        return await get(key)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_two)
            await claimed.wait()
            monkeypatch.setattr(b.backend, "entries", between)
            monkeypatch.setattr(b.backend, "get", gets)
            async with queue_b.claim() as job:
                assert (job.id, job.attempt) == (third.id, 0)
    assert failed, "no job was read again"
