"""``queue.run()`` acks a job and claims the worker's next one in one transaction, on
every backend (``coord._jobs.claim.claim_with``): one request a job where there were
two. What it must keep: each job handled once, in put order for one worker; a job
claimed with the ack of the last one, when the worker stops before taking it, is given
back as it was; a refused transaction (another client claimed that job first) sends the
ack alone; a lost answer is resolved (the ack read back, the claim given back)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest

import coord
from coord.abc import Update

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from coord.abc import Op

pytestmark = pytest.mark.anyio


def _merged(ops: Sequence[Op]) -> bool:
    """Whether *ops* is an ack sent with a claim: two removals, then an update and a
    create."""
    return len(ops) == 4 and isinstance(ops[2], Update)


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
    sent: list[int] = []

    async def counting(transact: Any, ops: Sequence[Op]) -> Any:
        sent.append(len(ops))
        return await transact(ops)

    _wrap(monkeypatch, b, counting)
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
    sent: list[int] = []

    async def counting(transact: Any, ops: Sequence[Op]) -> Any:
        sent.append(len(ops))
        return await transact(ops)

    _wrap(monkeypatch, b, counting)
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
