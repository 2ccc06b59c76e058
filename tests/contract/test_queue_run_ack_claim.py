"""``queue.run()`` acks a job and claims the worker's next one in one transaction, on
every backend (``coord._jobs.claim.claim_with``): one request a job where there were
two. What it must keep: each job handled once, in put order for one worker; a job
claimed with the ack of the last one, when the worker stops before taking it, is given
back as it was; a refused transaction (another client claimed that job first) sends the
ack alone; a lost answer is resolved (the ack read back, the claim given back)."""

from __future__ import annotations

import asyncio
import random
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import coord
from coord._jobs import claim as _claim
from coord.abc import Create, Remove, Update
from coord.testing import expire_session

from .conftest import ASYNCIO_STORES

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from coord.abc import Op

pytestmark = pytest.mark.anyio


def _merged(ops: Sequence[Op]) -> bool:
    """Whether *ops* is an ack sent with a claim (two removals, then an update and a
    create), or a group of them and of acks."""
    return any(isinstance(op, Create) for op in ops) and any(isinstance(op, Remove) for op in ops)


def _wrap(
    monkeypatch: pytest.MonkeyPatch,
    client: coord.Client,
    around: Callable[[Callable[[Sequence[Op]], Awaitable[Any]], Sequence[Op]], Awaitable[Any]],
) -> None:
    backend = client.backend
    transact = backend.transact

    async def wrapped(ops: Sequence[Op]) -> Any:
        return await around(transact, ops)

    monkeypatch.setattr(backend, "transact", wrapped)


def _sizes_sent(monkeypatch: pytest.MonkeyPatch, client: coord.Client) -> list[int]:
    """The number of operations of each transaction *client* sends from now on."""
    sent: list[int] = []

    async def counting(transact: Any, ops: Sequence[Op]) -> Any:
        sent.append(len(ops))
        return await transact(ops)

    _wrap(monkeypatch, client, counting)
    return sent


async def _put(client: coord.Client, name: str, count: int) -> None:
    queue = client.queue(name)
    for n in range(count):
        await queue.put(b"%02d" % n)


async def _run_until(
    queue: coord.Queue, handler: Callable[[coord.Job], Awaitable[object]], done: anyio.Event
) -> None:
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: queue.run(handler, signals=()))
            await done.wait()
            tg.cancel_scope.cancel()


async def test_run_acks_and_claims_the_next_job_in_one_transaction(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, _, _ = clients
    await _put(a, "joint", 30)
    sent = _sizes_sent(monkeypatch, b)
    handled: list[bytes] = []
    done = anyio.Event()

    async def handler(job: coord.Job) -> None:
        assert job.attempt == 0
        handled.append(job.payload)
        if len(handled) == 30:
            done.set()

    await _run_until(b.queue("joint"), handler, done)
    assert handled == [b"%02d" % n for n in range(30)]  # once each, in put order
    # Alone, a claim and an ack are a transaction each: 60. Joined, one a job, and a
    # claim alone after each read of the head of the queue (its stock is kept 0.5 s).
    assert sent.count(4) >= 15, sent
    assert len(sent) <= 45, sent
    stats = await a.queue("joint").stats()
    assert (stats.depth, stats.in_flight) == (0, 0)


async def test_a_worker_that_stops_gives_back_the_job_claimed_with_its_ack(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop is told to stop while an ack joined with the next claim is in flight:
    the job claimed so is given back as it was, for another worker, at once."""
    a, b, _, _ = clients
    await _put(a, "stops", 6)
    stop = anyio.Event()

    async def stopping(transact: Any, ops: Sequence[Op]) -> Any:
        if _merged(ops) and not stop.is_set():
            stop.set()  # the run is cancelled (drained) meanwhile
            await anyio.sleep(0.05)
        return await transact(ops)

    _wrap(monkeypatch, b, stopping)
    handled: list[bytes] = []

    async def handler(job: coord.Job) -> None:
        handled.append(job.payload)

    await _run_until(b.queue("stops"), handler, stop)
    assert handled == [b"00"]
    stats = await a.queue("stops").stats()
    assert (stats.depth, stats.in_flight) == (5, 0)  # none left claimed
    with anyio.fail_after(5):
        async with a.queue("stops").claim() as job:
            assert (job.payload, job.attempt) == (b"01", 0)  # given back as it was


async def test_a_client_closed_as_run_returns_finds_the_carried_job_given_back(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch, coord_url: str
) -> None:
    """The usual shutdown: run() drained, then its client closed at once. The job claimed
    with the last ack is back before run() returns: the close cannot revoke its claim
    first, which would leave it naming a dead claim and cost it a lost attempt (with
    ``max_attempts=1``, a dead letter that never ran). Its give-back is made slow here."""
    a = clients[0]
    await _put(a, "closing", 6)
    stop = anyio.Event()
    handled: list[bytes] = []

    async def handler(job: coord.Job) -> None:
        handled.append(job.payload)

    async def slow(transact: Any, ops: Sequence[Op]) -> Any:
        if _merged(ops) and not stop.is_set():
            stop.set()  # the run is cancelled (drained) meanwhile
            await anyio.sleep(0.05)
        elif stop.is_set() and [type(op) for op in ops] == [Update, Remove]:
            await anyio.sleep(0.2)  # the give-back is slow to reach the store
        return await transact(ops)

    async with coord.connect(coord_url, ttl=5.0) as b:
        _wrap(monkeypatch, b, slow)
        await _run_until(b.queue("closing"), handler, stop)
    assert handled == [b"00"]
    with anyio.fail_after(5):
        async with a.queue("closing").claim() as job:
            assert (job.payload, job.attempt) == (b"01", 0)  # given back as it was


async def test_a_refused_joint_transaction_sends_the_ack_alone(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another client claims the job that the worker's next claim reaches for while the
    ack is on its way: the store refuses both, the ack goes alone and is done, and the
    worker claims another job."""
    a, b, c, _ = clients
    await _put(a, "refused", 4)
    taken = anyio.Event()
    release = anyio.Event()
    other: list[bytes] = []

    async def hold_one() -> None:
        async with c.queue("refused").claim() as job:
            other.append(job.payload)
            taken.set()
            await release.wait()

    async with anyio.create_task_group() as tg:

        async def racing(transact: Any, ops: Sequence[Op]) -> Any:
            if _merged(ops) and not taken.is_set():
                tg.start_soon(hold_one)  # c claims the oldest claimable job: that one
                with anyio.fail_after(5):
                    await taken.wait()
                assert await transact(ops) is None  # refused: neither applied
                return None
            return await transact(ops)

        _wrap(monkeypatch, b, racing)
        handled: list[bytes] = []
        done = anyio.Event()

        async def handler(job: coord.Job) -> None:
            handled.append(job.payload)
            if len(handled) == 3:
                done.set()

        await _run_until(b.queue("refused"), handler, done)
        assert other == [b"01"]
        # (After a conflict lookers take their own lanes first: roughly in put order.)
        assert handled[0] == b"00"
        assert sorted(handled) == [b"00", b"02", b"03"]
        release.set()
    stats = await a.queue("refused").stats()
    assert (stats.depth, stats.in_flight) == (0, 0)  # all four acked, each once


async def test_a_lost_answer_reads_the_ack_back_and_gives_the_claim_back(
    clients: list[coord.Client],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The joint transaction is applied and its answer lost: the ack is found done (no
    ClaimLost, no warning), and the job claimed with it, which no worker took, is given
    back as it was and claimed again (handled once, attempt 0)."""
    a, b, _, _ = clients
    await _put(a, "lost", 4)
    lost: list[int] = []

    async def losing(transact: Any, ops: Sequence[Op]) -> Any:
        result = await transact(ops)
        if _merged(ops) and not lost:
            lost.append(1)
            raise coord.BackendUnavailable("the answer was lost")
        return result

    _wrap(monkeypatch, b, losing)
    handled: list[tuple[bytes, int]] = []
    done = anyio.Event()

    async def handler(job: coord.Job) -> None:
        handled.append((job.payload, job.attempt))
        if len(handled) == 4:
            done.set()

    with caplog.at_level("WARNING", logger="coord"):
        await _run_until(b.queue("lost"), handler, done)
    assert lost == [1]
    assert sorted(handled) == [(b"%02d" % n, 0) for n in range(4)]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == []
    stats = await a.queue("lost").stats()
    assert (stats.depth, stats.in_flight) == (0, 0)


async def test_a_lost_answer_gives_the_claim_back_before_the_worker_stops(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch, coord_url: str
) -> None:
    """The joint transaction is applied, its answer lost, and the run stopped meanwhile,
    its client closed at once: the job claimed with the ack is back before the ack's
    answer is, so the close cannot revoke its claim first (a lost attempt for a job that
    never ran). Its give-back is made slow here."""
    a = clients[0]
    await _put(a, "lost-closing", 6)
    stop = anyio.Event()
    handled: list[bytes] = []

    async def handler(job: coord.Job) -> None:
        handled.append(job.payload)

    async def losing(transact: Any, ops: Sequence[Op]) -> Any:
        if _merged(ops) and not stop.is_set():
            await transact(ops)
            stop.set()  # the run is cancelled (drained) meanwhile
            raise coord.BackendUnavailable("the answer was lost")
        if stop.is_set() and [type(op) for op in ops] == [Update, Remove]:
            await anyio.sleep(0.2)  # the give-back is slow to reach the store
        return await transact(ops)

    async with coord.connect(coord_url, ttl=5.0) as b:
        _wrap(monkeypatch, b, losing)
        await _run_until(b.queue("lost-closing"), handler, stop)
    assert handled == [b"00"]
    with anyio.fail_after(5):
        async with a.queue("lost-closing").claim() as job:
            assert (job.payload, job.attempt) == (b"01", 0)  # given back as it was
    stats = await a.queue("lost-closing").stats()
    assert (stats.depth, stats.in_flight) == (4, 0)  # the ack was applied


async def test_keyed_jobs_keep_their_order_across_joint_claims(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two clients, a worker each, four keys: the joint claim never takes a key's
    next job before the ack of the one before it (no two of a key at once, each key in
    put order), and every job is handled once."""
    a, b, c, _ = clients
    queue = a.queue("keyed")
    for n in range(8):
        for k in range(4):
            await queue.put(b"%d-%d" % (k, n), key=f"k{k}")
    seen: dict[int, list[int]] = {k: [] for k in range(4)}
    busy: set[int] = set()
    overlaps: list[int] = []
    done = anyio.Event()
    joint: list[int] = []
    claim_with = _claim.claim_with

    async def counted(*args: Any, **kwargs: Any) -> Any:
        joint.append(1)
        return await claim_with(*args, **kwargs)

    monkeypatch.setattr(_claim, "claim_with", counted)

    async def handler(job: coord.Job) -> None:
        k, n = map(int, job.payload.split(b"-"))
        overlaps.extend([k] if k in busy else [])
        busy.add(k)
        await anyio.sleep(0.005)
        busy.discard(k)
        seen[k].append(n)
        if sum(map(len, seen.values())) == 32:
            done.set()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for client in (b, c):
                tg.start_soon(partial(client.queue("keyed").run, handler, signals=()))
            await done.wait()
            tg.cancel_scope.cancel()
    assert overlaps == []
    assert seen == {k: list(range(8)) for k in range(4)}
    assert joint  # (about half of the claims, one worker a client)


async def test_a_lease_expired_under_the_joint_transaction_is_not_told_done(
    clients: list[coord.Client],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store ends the worker's session just before its joint transaction, and
    another client claims the acked job meanwhile: the ack is told refused or unknown
    (never done), the job is the other client's, and the loop goes on on a new session."""
    a, b, c, _ = clients
    await _put(a, "expired", 4)
    taken = anyio.Event()
    release = anyio.Event()
    other: list[tuple[bytes, int]] = []

    async def take() -> None:
        async with c.queue("expired").claim() as job:
            other.append((job.payload, job.attempt))
            taken.set()
            await release.wait()

    async with anyio.create_task_group() as outer:

        async def expiring(transact: Any, ops: Sequence[Op]) -> Any:
            if _merged(ops) and not taken.is_set():
                await expire_session(b)
                outer.start_soon(take)  # the acked job, its claim dead: c's
                with anyio.fail_after(5):
                    await taken.wait()
            return await transact(ops)

        _wrap(monkeypatch, b, expiring)
        handled: list[bytes] = []
        done = anyio.Event()

        async def handler(job: coord.Job) -> None:
            handled.append(job.payload)
            if taken.is_set() and len(handled) >= 2:
                done.set()

        with caplog.at_level("WARNING", logger="coord"):
            await _run_until(b.queue("expired"), handler, done)
        release.set()
    assert handled[0] == b"00"
    assert other == [(b"00", 1)]  # its claim died with b's session: a lost attempt
    told = [r.getMessage() for r in caplog.records if "ack" in r.getMessage()]
    assert len(told) == 1, told
    assert "refused" in told[0] or "unknown" in told[0], told


@pytest.mark.parametrize("store", ASYNCIO_STORES, indirect=True)
async def test_run_cancelled_natively_during_the_joint_transaction_leaves_nothing_claimed(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """asyncio's task.cancel() of run()'s caller while an ack joined with the next claim
    is in flight: the ack is done, the job claimed with it is given back as it was."""
    a, b, _, _ = clients
    await _put(a, "native", 6)
    sent = anyio.Event()

    async def slow(transact: Any, ops: Sequence[Op]) -> Any:
        if _merged(ops) and not sent.is_set():
            sent.set()
            await anyio.sleep(0.05)
        return await transact(ops)

    _wrap(monkeypatch, b, slow)
    handled: list[bytes] = []

    async def handler(job: coord.Job) -> None:
        handled.append(job.payload)

    task = asyncio.ensure_future(b.queue("native").run(handler, signals=()))
    with anyio.fail_after(10):
        await sent.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert handled == [b"00"]
    with anyio.fail_after(5):
        async with a.queue("native").claim() as job:
            assert (job.payload, job.attempt) == (b"01", 0)  # given back as it was
    stats = await a.queue("native").stats()
    assert (stats.depth, stats.in_flight) == (4, 0)


async def test_lost_answers_under_contention_handle_each_job_once(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two clients, three workers each, keyed and unkeyed jobs; a joint transaction's
    answer is lost now and then, before or after the store applied it: each job is
    handled once, at attempt 0 (a claim given back counts none), keys in order."""
    rng = random.Random(7)
    a, b, c, _ = clients
    queue = a.queue("lossy")
    total = 60
    for n in range(total):
        await queue.put(b"%d" % n, key=f"k{n % 5}" if n % 2 else None)

    async def lossy(transact: Any, ops: Sequence[Op]) -> Any:
        roll = rng.random() if _merged(ops) else 1.0
        if roll < 0.15:
            raise coord.BackendUnavailable("lost before it was sent")
        result = await transact(ops)
        if roll < 0.3:
            raise coord.BackendUnavailable("lost after it was applied")
        return result

    _wrap(monkeypatch, b, lossy)
    _wrap(monkeypatch, c, lossy)
    handled: list[tuple[bytes, int]] = []
    last: dict[int, int] = {}
    disorder: list[int] = []
    done = anyio.Event()

    async def handler(job: coord.Job) -> None:
        handled.append((job.payload, job.attempt))
        n = int(job.payload)
        if n % 2:
            disorder.extend([n] if last.get(n % 5, -1) > n else [])
            last[n % 5] = n
        await anyio.sleep(rng.random() * 0.005)
        if len({p for p, _ in handled}) == total:
            done.set()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for client in (b, c):
                tg.start_soon(
                    partial(client.queue("lossy").run, handler, concurrency=3, signals=())
                )
            await done.wait()
            await anyio.sleep(0.3)  # (a job handled twice would show by now)
            tg.cancel_scope.cancel()
    assert disorder == []
    assert sorted(handled) == sorted((b"%d" % n, 0) for n in range(total))
    stats = await a.queue("lossy").stats()
    assert (stats.depth, stats.in_flight) == (0, 0)


async def test_a_keys_next_job_is_claimed_with_the_ack_of_the_one_before(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With per-key order a key's next job becomes claimable only when the one before is
    acked; the ack's transaction claims it (the looker's last read saw it), so a key's
    jobs go on with one transaction each and in order."""
    a, b, _, _ = clients
    queue = a.queue("keyed")
    for n in range(8):
        for key in ("k0", "k1"):
            await queue.put(b"%s-%d" % (key.encode(), n), key=key)
    sent = _sizes_sent(monkeypatch, b)
    handled: list[bytes] = []
    done = anyio.Event()

    async def handler(job: coord.Job) -> None:
        handled.append(job.payload)
        if len(handled) == 16:
            done.set()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: b.queue("keyed").run(handler, concurrency=2, signals=()))
            await done.wait()
            tg.cancel_scope.cancel()
    for name in (b"k0", b"k1"):  # each key's jobs in put order
        mine = [p for p in handled if p.startswith(name)]
        assert mine == [b"%s-%d" % (name, n) for n in range(8)]
    # Two claims alone (one a key, after the first read), then an ack and the key's
    # next claim joined: 14 of them, and the last two acks alone.
    assert sent.count(4) >= 12, sent
    assert len(sent) <= 20, sent
    stats = await a.queue("keyed").stats()
    assert (stats.depth, stats.in_flight) == (0, 0)


async def test_a_client_closed_after_a_cancelled_claim_finds_the_job_given_back(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch, coord_url: str
) -> None:
    """A claim cancelled while its transaction is out: the job its answer brings is given
    back in a task of the session. The client closed at once waits for that give-back
    before it revokes the lease; else the job names a dead claim, and the next claim
    counts an attempt it never had (with ``max_attempts=1``, a dead letter that never
    ran). The claim's answer and the give-back are made slow here."""
    a = clients[0]
    await _put(a, "cancelled", 2)
    sent = anyio.Event()
    answered = anyio.Event()

    async def slow(transact: Any, ops: Sequence[Op]) -> Any:
        kinds = [type(op) for op in ops]
        if kinds == [Update, Create] and not sent.is_set():
            sent.set()
            await anyio.sleep(0.1)  # its caller is gone by the answer
            try:
                return await transact(ops)
            finally:
                answered.set()
        if kinds == [Update, Remove]:
            await anyio.sleep(0.3)  # the give-back is slow to reach the store
        return await transact(ops)

    async with coord.connect(coord_url, ttl=5.0) as b:
        _wrap(monkeypatch, b, slow)
        with anyio.fail_after(5):
            await _claim_cancelled_once(b, "cancelled", sent)
            await answered.wait()
            await anyio.sleep(0.01)  # the give-back starts
    await _first_claimed_as_it_was(a, "cancelled")


async def test_a_client_closed_while_a_cancelled_claim_is_out_finds_the_job_given_back(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch, coord_url: str
) -> None:
    """As above, but the client is closed while the cancelled claim's transaction is
    still out (before its answer): the close waits for that answer, and the give-back
    it brings, before it revokes the lease."""
    a = clients[0]
    await _put(a, "cancelled-out", 2)
    sent = anyio.Event()

    async def slow(transact: Any, ops: Sequence[Op]) -> Any:
        kinds = [type(op) for op in ops]
        if kinds == [Update, Create] and not sent.is_set():
            sent.set()
            result = await transact(ops)  # applied, and its answer slow to come back:
            await anyio.sleep(0.3)  # still out when the client closes
            return result
        return await transact(ops)

    async with coord.connect(coord_url, ttl=5.0) as b:
        _wrap(monkeypatch, b, slow)
        with anyio.fail_after(5):
            await _claim_cancelled_once(b, "cancelled-out", sent)
    await _first_claimed_as_it_was(a, "cancelled-out")


async def _claim_cancelled_once(client: coord.Client, name: str, sent: anyio.Event) -> None:
    """Claim a job of *name* on *client*, and cancel the claim once *sent* is set."""

    async def claiming() -> None:
        async with client.queue(name).claim():
            raise AssertionError("the claim was cancelled")

    async with anyio.create_task_group() as tg:
        tg.start_soon(claiming)
        await sent.wait()
        tg.cancel_scope.cancel()


async def _first_claimed_as_it_was(client: coord.Client, name: str) -> None:
    """The first job of *name* is claimable, as it was put: no attempt counted."""
    with anyio.fail_after(10):
        async with client.queue(name).claim() as job:
            assert (job.payload, job.attempt) == (b"00", 0)


async def test_a_client_closed_while_an_ack_is_out_lets_it_land(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch, coord_url: str
) -> None:
    """A client closed while the ack of a job is out waits for its answer (up to the
    TTL) before it revokes the lease that the ack is guarded by: the ack is told done
    and the job is gone. Before, the revoke went first: the ack was refused, and the job
    ran again as a lost attempt. The ack is made slow here."""
    a = clients[0]
    await _put(a, "acking", 1)
    sent = anyio.Event()

    async def slow(transact: Any, ops: Sequence[Op]) -> Any:
        if [type(op) for op in ops] == [Remove, Remove] and not sent.is_set():
            sent.set()
            await anyio.sleep(0.3)  # the client is closed meanwhile
        return await transact(ops)

    told: list[str] = []

    async def work(client: coord.Client) -> None:
        try:
            async with client.queue("acking").claim():
                pass
        except coord.ClaimLost as exc:
            told.append(exc.outcome)
        else:
            told.append("done")

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            async with coord.connect(coord_url, ttl=5.0) as b:
                _wrap(monkeypatch, b, slow)
                tg.start_soon(work, b)
                await sent.wait()
            # b is closed here, with the ack out
    assert told == ["done"]
    stats = await a.queue("acking").stats()
    assert (stats.depth, stats.dead) == (0, 0)
