"""The queue's operator calls, on every store: cancel of a queued job (told: cancelled,
claimed, not found; never a job a worker holds) and purge of dead letters."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import coord
from coord.abc import Remove
from coord.testing import wait_for_waiters

from ._closing import told_across_a_close
from .test_queue import take

if TYPE_CHECKING:
    from collections.abc import Sequence

    from coord.abc import Op

pytestmark = pytest.mark.anyio


async def nothing_to_claim(queue: coord.Queue, seconds: float = 0.5) -> None:
    with anyio.move_on_after(seconds) as waited:
        async with queue.claim() as job:
            pytest.fail(f"{job!r} was handed out")
    assert waited.cancelled_caught


async def dead_letters(queue: coord.Queue, count: int) -> list[str]:
    """Put *count* jobs and fail each once (the queue dead-letters at the first
    failure): their ids."""
    ids = [(await queue.put(b"%d" % n)).id for n in range(count)]
    with anyio.fail_after(20):
        for _ in range(count):
            with pytest.raises(RuntimeError):
                async with queue.claim():
                    raise RuntimeError("no")
    assert sorted(d.id for d in await queue.dead_letters()) == sorted(ids)
    return ids


async def test_a_cancelled_job_is_gone_and_never_claimed(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    queue = a.queue("cancel")
    first = await queue.put(b"first", key="k")
    await queue.put(b"second", key="k")
    keyless = await queue.put(b"keyless")
    assert await queue.cancel(first.id) == "cancelled"
    assert await b.queue("cancel").cancel(keyless.id) == "cancelled"
    assert (await queue.stats()).depth == 1
    assert (await take(b.queue("cancel")))[:2] == (b"second", "k")
    await nothing_to_claim(b.queue("cancel"))
    assert await queue.cancel(first.id) == "not found"


async def test_a_claimed_job_is_not_cancelled_and_its_worker_acks_it(
    clients: list[coord.Client],
) -> None:
    a, b, _, _ = clients
    ref = await a.queue("held").put(b"x", job_id="order-1")
    with anyio.fail_after(10):
        async with b.queue("held").claim() as job:
            assert await a.queue("held").cancel(ref.id) == "claimed"
            assert (await a.queue("held").stats()).depth == 1
    assert not job.lost  # acked: the block raised no ClaimLost
    assert (await a.queue("held").stats()).depth == 0
    assert await a.queue("held").cancel(ref.id) == "not found"  # acked: gone


async def test_an_unknown_id_is_not_found(clients: list[coord.Client]) -> None:
    queue = clients[0].queue("unknown")
    await queue.put(b"x", job_id="mine")
    for job_id in ("nope", "0123456789abcdef0123456789abcdef", "a/b @j"):
        assert await queue.cancel(job_id) == "not found"
    assert (await queue.stats()).depth == 1


@pytest.mark.real_clock  # the backoff is read from time.time()
async def test_parked_and_backing_off_jobs_are_queued_and_cancelled(
    clients: list[coord.Client],
) -> None:
    a, _, _, _ = clients
    parking = a.queue("parked", max_attempts=1)
    backing_off = a.queue("parked", max_attempts=5, retry_delay=60)
    parked = await parking.put(b"p", key="p")
    later = await parking.put(b"l", key="l")
    with anyio.fail_after(10):
        with pytest.raises(ValueError, match="park"):
            async with parking.claim():
                raise ValueError("park")
        with pytest.raises(ValueError, match="retry"):
            async with backing_off.claim() as job:
                assert job.id == later.id
                raise ValueError("retry")
    stats = await parking.stats()
    assert (stats.depth, stats.parked, stats.in_flight) == (2, 1, 0)
    assert await parking.cancel(parked.id) == "cancelled"
    assert await parking.cancel(later.id) == "cancelled"
    assert await parking.stats() == coord.QueueStats(0, 0, 0, 0)


async def test_a_requeued_dead_letter_is_found_by_its_id(clients: list[coord.Client]) -> None:
    """A requeued dead letter has a fresh entry name: only its header has its id."""
    a, _, _, _ = clients
    queue = a.queue("requeued", max_attempts=1, on_exhausted="dead_letter")
    (plain,) = await dead_letters(queue, 1)
    await queue.put(b"x", job_id="order-9")
    with anyio.fail_after(10), pytest.raises(RuntimeError):
        async with queue.claim():
            raise RuntimeError("no")
    for job_id in (plain, "order-9"):
        await queue.requeue(job_id)
    assert (await queue.stats()).depth == 2
    assert await queue.cancel(plain) == "cancelled"
    assert await queue.cancel("order-9") == "cancelled"
    assert (await queue.stats()).depth == 0
    await nothing_to_claim(queue)


async def test_cancelling_the_head_of_a_key_wakes_an_idle_worker(
    clients: list[coord.Client],
) -> None:
    """The head of key k is parked, so the worker waits (watching the queue); the
    cancel's delete is seen by the watch, and the key's next job is claimed at once."""
    a, b, _, _ = clients
    queue = a.queue("head", max_attempts=1)
    head = await queue.put(b"head", key="k")
    await queue.put(b"next", key="k")
    with anyio.fail_after(10), pytest.raises(ValueError, match="park"):
        async with queue.claim():
            raise ValueError("park")
    got: list[bytes] = []
    claimed = anyio.Event()

    async def worker() -> None:
        got.append((await take(b.queue("head")))[0])
        claimed.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker)
        with anyio.fail_after(10):
            await wait_for_waiters(b, "head/_idle", 1)
        await anyio.sleep(0.3)  # it looked, found the key blocked, and watches
        assert got == []
        assert await queue.cancel(head.id) == "cancelled"
        with anyio.fail_after(2):  # woken by the watch, not by a poll
            await claimed.wait()
    assert got == [b"next"]


async def test_a_cancel_racing_a_claim_never_both_wins(clients: list[coord.Client]) -> None:
    """Each round a job is put while a worker waits, and cancelled at once: either the
    cancel deletes it and no worker ever runs it, or a worker runs it (and acks it) and
    the cancel says so ("claimed", or "not found" once acked); never both, never
    neither."""
    a, b, _, _ = clients
    rounds = 20
    outcomes: dict[str, str] = {}
    ran: list[str] = []

    async def worker() -> None:
        while not ran or ran[-1] != "stop":
            async with b.queue("race").claim() as job:
                await anyio.sleep(random.random() * 0.01)
            ran.append(job.id)  # ran and acked

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker)
            await wait_for_waiters(b, "race/_idle", 1)
            for n in range(rounds):
                ref = await a.queue("race").put(b"%d" % n)
                await anyio.sleep(random.random() * 0.01)
                outcomes[ref.id] = await a.queue("race").cancel(ref.id)
            await a.queue("race").put(b"stop", job_id="stop")  # claimed after the others
    assert ran[-1] == "stop"
    assert len(ran) == len(set(ran))
    for job_id, outcome in outcomes.items():
        assert (outcome == "cancelled") != (job_id in ran), (job_id, outcome)
    assert (await a.queue("race").stats()).depth == 0


async def test_a_claim_between_the_read_and_the_delete_refuses_the_delete(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker claims the job after the cancel read it and before its delete: the
    delete, guarded by the job's version, is refused; the cancel reads again and says
    "claimed"; the worker acks."""
    a, b, _, _ = clients
    ref = await a.queue("between").put(b"x")
    claimed, release = anyio.Event(), anyio.Event()
    sent: list[Sequence[Op]] = []
    transact = a.backend.transact

    async def worker() -> None:
        async with b.queue("between").claim():
            claimed.set()
            await release.wait()

    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:

            async def claim_first(ops: Sequence[Op]) -> Any:
                sent.append(ops)
                tg.start_soon(worker)
                await claimed.wait()
                return await transact(ops)

            monkeypatch.setattr(a.backend, "transact", claim_first)
            assert await a.queue("between").cancel(ref.id) == "claimed"
            release.set()
    assert len(sent) == 1
    assert (await a.queue("between").stats()).depth == 0  # acked by the worker


async def test_a_cancelled_repeatable_job_can_be_put_again(clients: list[coord.Client]) -> None:
    """Its dedupe marker goes with it: the same job_id queues again, within the window."""
    a, b, _, _ = clients
    queue = a.queue("again")
    first = await queue.put(b"one", job_id="order-42")
    assert await queue.cancel("order-42") == "cancelled"
    assert (await a.backend.entries("again/_ids/")).entries == ()
    again = await b.queue("again").put(b"two", job_id="order-42")
    assert again.seq > first.seq
    assert (await queue.stats()).depth == 1
    with anyio.fail_after(10):
        async with queue.claim() as job:
            assert (job.id, job.payload) == ("order-42", b"two")


async def test_purge_all_and_by_ids(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    queue = a.queue("purge", max_attempts=1, on_exhausted="dead_letter")
    ids = await dead_letters(queue, 4)
    assert await queue.purge([ids[1], "nope"]) == 1
    assert await b.queue("purge").purge((ids[1],)) == 0  # already gone: no error
    assert sorted(d.id for d in await queue.dead_letters()) == sorted([ids[0], *ids[2:]])
    await queue.requeue(ids[0])
    assert await queue.purge([ids[0]]) == 0  # requeued: a job, not a dead letter
    assert await queue.purge([]) == 0
    assert await queue.purge() == 2
    assert await queue.dead_letters() == []
    assert await queue.purge() == 0
    assert (await queue.stats()).depth == 1  # the requeued job stays


async def test_purge_writes_transactions_of_at_most_max_ops(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _, _, _ = clients
    queue = a.queue("batches", max_attempts=1, on_exhausted="dead_letter")
    await dead_letters(queue, 5)
    backend = a.backend
    sizes: list[int] = []
    transact = backend.transact

    async def counted(ops: Sequence[Op]) -> Any:
        sizes.append(len(ops))
        return await transact(ops)

    monkeypatch.setattr(backend, "max_ops", 2)
    monkeypatch.setattr(backend, "transact", counted)
    assert await queue.purge() == 5
    assert sizes == [2, 2, 1]


async def test_a_batch_refused_by_a_letter_gone_meanwhile_is_purged_again(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One dead letter of a batch is requeued by someone else between the purge's read
    and its write: the store refuses that batch; the purge reads again and removes the
    rest, and counts only what it removed."""
    a, b, _, _ = clients
    queue = a.queue("gone", max_attempts=1, on_exhausted="dead_letter")
    ids = await dead_letters(queue, 3)
    transact = a.backend.transact

    async def requeue_first(ops: Sequence[Op]) -> Any:
        if len(await b.queue("gone").dead_letters()) == 3:
            await b.queue("gone").requeue(ids[0])
        return await transact(ops)

    monkeypatch.setattr(a.backend, "max_ops", 2)
    monkeypatch.setattr(a.backend, "transact", requeue_first)
    assert await queue.purge() == 2
    monkeypatch.undo()
    assert await queue.dead_letters() == []
    assert (await queue.stats()).depth == 1


async def test_a_cancelled_purge_stops_after_the_batch_in_flight(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while a batch is in flight: that batch is waited for (it may be done),
    and no further batch is sent."""
    a, _, _, _ = clients
    queue = a.queue("stop", max_attempts=1, on_exhausted="dead_letter")
    await dead_letters(queue, 3)
    transact = a.backend.transact
    with anyio.CancelScope() as scope:

        async def cancel_then(ops: Sequence[Op]) -> Any:
            scope.cancel()
            return await transact(ops)

        monkeypatch.setattr(a.backend, "max_ops", 1)
        monkeypatch.setattr(a.backend, "transact", cancel_then)
        await queue.purge()
    assert scope.cancelled_caught
    monkeypatch.undo()
    assert len(await queue.dead_letters()) == 2


async def test_bad_input_raises_before_anything_is_written(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _, _, _ = clients
    queue = a.queue("bad", max_attempts=1, on_exhausted="dead_letter")
    (dead,) = await dead_letters(queue, 1)
    await queue.put(b"x", job_id="x")

    async def no_write(ops: Sequence[Op]) -> Any:
        pytest.fail(f"written: {ops}")

    monkeypatch.setattr(a.backend, "transact", no_write)
    bad: list[tuple[type[Exception], Any]] = [
        (TypeError, lambda: queue.cancel(5)),  # type: ignore[arg-type]
        (TypeError, lambda: queue.cancel(None)),  # type: ignore[arg-type]
        (coord.ConfigurationError, lambda: queue.cancel("")),
        (coord.ConfigurationError, lambda: queue.cancel("a\nb")),
        (coord.ConfigurationError, lambda: queue.cancel("x" * 300)),
        (TypeError, lambda: queue.purge(dead)),  # a str: one id is [dead]
        (TypeError, lambda: queue.purge(5)),  # type: ignore[arg-type]
        (TypeError, lambda: queue.purge([dead, 5])),  # type: ignore[list-item]
        (coord.ConfigurationError, lambda: queue.purge([dead, ""])),
    ]
    for error, call in bad:
        with pytest.raises(error):
            await call()
    monkeypatch.undo()
    assert (await queue.stats()).depth == 1
    assert [d.id for d in await queue.dead_letters()] == [dead]


async def test_a_cancel_whose_answer_is_lost_is_unknown(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delete is applied and its answer lost: the cancel says the outcome is unknown
    (never "cancelled" nor "not found"), with the job's id; asked again, "not found"."""
    a, _, _, _ = clients
    queue = a.queue("lost", max_attempts=1, on_exhausted="dead_letter")
    await dead_letters(queue, 1)
    ref = await queue.put(b"x", job_id="order-5")
    transact = a.backend.transact

    async def answer_lost(ops: Sequence[Op]) -> Any:
        await transact(ops)
        raise coord.BackendUnavailable("the reply was lost (test)")

    monkeypatch.setattr(a.backend, "transact", answer_lost)
    with pytest.raises(coord.OutcomeUnknown) as unknown:
        await queue.cancel(ref.id)
    assert (unknown.value.operation, unknown.value.job_id) == ("cancel", "order-5")
    with pytest.raises(coord.OutcomeUnknown) as unknown:
        await queue.purge()
    assert unknown.value.operation == "purge"
    monkeypatch.undo()
    assert await queue.cancel(ref.id) == "not found"
    assert await queue.dead_letters() == []


async def test_a_client_closed_while_a_cancel_is_out_tells_it_done(
    clients: list[coord.Client], coord_url: str
) -> None:
    """A client closed while its cancel of a job is out (applied, its answer slow): the
    close waits for that answer (up to the TTL), as for a put, and the cancel is told
    "cancelled", not OutcomeUnknown."""
    ref = await clients[0].queue("cancel-close").put(b"x")
    told = await told_across_a_close(
        coord_url,
        lambda b: b.queue("cancel-close").cancel(ref.id),
        lambda ops: bool(ops) and isinstance(ops[0], Remove),
    )
    assert told == "cancelled"
    assert (await clients[0].queue("cancel-close").stats()).depth == 0
