"""Native asyncio cancellation (``task.cancel()``, ``asyncio.timeout``, ``wait_for``),
which an anyio shield does not stop: whatever it interrupts, no key may stay behind.

The cleanup that must happen (deleting a waiter key, a released key) runs in a task the
session owns, or is handed to one at once when a cancellation cuts it short in the
caller's task (a release), so cancelling the caller stops only its wait. Run on the
stores that run on asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import anyio
import pytest

import coord
from coord import BackendUnavailable
from coord.abc import Create
from coord.testing import wait_for_no_waiters, wait_for_waiters

from ._local import queue_locally
from .conftest import ASYNCIO_STORES

pytestmark = pytest.mark.anyio


@pytest.fixture(params=ASYNCIO_STORES)
def store(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


async def _no_keys_then_acquire(client: coord.Client, name: str) -> None:
    with anyio.fail_after(10):
        await wait_for_no_waiters(client, name)
        async with client.mutex(name):
            pass


@pytest.mark.usefixtures("mutex_mode")
async def test_timeout_around_release_still_releases(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    mutex = a.mutex("native-release")
    await mutex.acquire()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0):  # fires at the release's first await
            await mutex.release()
    assert not mutex.locked()
    await _no_keys_then_acquire(b, "native-release")


@pytest.mark.usefixtures("mutex_mode")
async def test_task_cancel_while_waiting_leaves_no_key(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    holder = a.mutex("native-wait")
    await holder.acquire()
    waiter = asyncio.create_task(b.mutex("native-wait").acquire())
    with anyio.fail_after(10):
        await wait_for_waiters(a, "native-wait", 2)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await holder.release()
    await _no_keys_then_acquire(a, "native-wait")


@pytest.mark.usefixtures("mutex_mode")
async def test_task_cancel_while_registering_leaves_no_key(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients

    async def take_and_release() -> None:
        async with a.mutex("native-register"):
            pass

    for _ in range(5):
        task = asyncio.create_task(take_and_release())
        await asyncio.sleep(0)  # the registration request is on its way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await _no_keys_then_acquire(b, "native-register")


@pytest.mark.usefixtures("mutex_mode")
async def test_wait_for_around_the_body_releases(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients

    async def hold_forever() -> None:
        async with a.mutex("native-body"):
            await asyncio.sleep(3600)

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(hold_forever(), 0.2)
    await _no_keys_then_acquire(b, "native-body")


async def test_task_cancel_while_claiming_leaves_no_claim(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    claimer = asyncio.create_task(a.queue("native-claim").claim().__aenter__())
    with anyio.fail_after(10):
        await wait_for_waiters(a, "native-claim/_idle", 1)
    claimer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await claimer
    await b.queue("native-claim").put(b"x")
    with anyio.fail_after(10):
        async with b.queue("native-claim").claim() as job:
            assert (job.payload, job.attempt) == (b"x", 0)
        await wait_for_no_waiters(a, "native-claim/_claims")


async def test_timeout_around_the_ack_still_acks(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    queue = a.queue("native-ack")
    await queue.put(b"x")
    claiming = queue.claim()
    job = await claiming.__aenter__()  # (the body's cancel scope opens here: no scope around)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0):  # fires at the ack's first await
            await claiming.__aexit__(None, None, None)
    with anyio.fail_after(10):
        while (await b.queue("native-ack").stats()).depth:  # noqa: ASYNC110
            await anyio.sleep(0.05)
    assert job.payload == b"x"


async def test_cancel_during_a_claim_whose_reply_is_lost_leaves_no_claim(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim transaction is applied, its reply lost, and the claimer cancelled
    meanwhile: the session task that owned the request deletes the claim it may have
    made, so the job does not stay claimed by a live session that nobody works for."""
    a, b, _, _ = clients
    await b.queue("lost-claim").put(b"x")
    real = a.backend.transact
    started, gate = asyncio.Event(), asyncio.Event()

    async def lossy(ops: Any) -> Any:
        result = await real(ops)  # applied on the store...
        if any(isinstance(op, Create) and "/_claims/" in op.prefix for op in ops):
            started.set()
            await gate.wait()
            raise BackendUnavailable("reply lost")  # ...but the reply is lost
        return result

    monkeypatch.setattr(a.backend, "transact", lossy)
    claimer = asyncio.create_task(a.queue("lost-claim").claim().__aenter__())
    await asyncio.wait_for(started.wait(), 10)
    claimer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await claimer
    gate.set()
    with anyio.fail_after(10):
        async with b.queue("lost-claim").claim() as job:
            assert job.payload == b"x"


async def test_a_put_whose_reply_is_lost_is_not_repeated(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repeating a put after a lost reply could queue again a job that a worker took and
    acked meanwhile (it would run twice): the put says the outcome is unknown instead.
    Repeated by the producer with its job_id, it queues nothing more: the job's marker
    says it was put (and acked) within the window."""
    a, b, _, _ = clients
    gate = asyncio.Event()

    def lossy(real: Any) -> Any:
        async def call(*args: Any, **options: Any) -> Any:
            made = await real(*args, **options)  # created on the store
            if not gate.is_set():
                await gate.wait()
                raise BackendUnavailable("reply lost")
            return made

        return call

    ran: list[str] = []

    async def worker() -> None:
        while True:
            async with b.queue("lost-put").claim() as job:
                ran.append(job.id)
            gate.set()  # the put's reply is "lost" after this ack

    queue = a.queue("lost-put")
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker)
            for job_id in (None, "once"):
                gate.clear()
                with monkeypatch.context() as patch:
                    patch.setattr(a.backend, "transact", lossy(a.backend.transact))
                    with pytest.raises(coord.OutcomeUnknown):
                        await queue.put(b"once", job_id=job_id)
            assert (await queue.put(b"once", job_id="once")).id == "once"
            await anyio.sleep(1)
            tg.cancel_scope.cancel()
    assert len(ran) == 2, f"two jobs, each put once (one repeated), ran {len(ran)} times"


async def test_a_cancelled_unpark_leaves_nothing_among_the_claims(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, _, _ = clients
    queue = a.queue("unpark-cancel", max_attempts=1)
    await queue.put(b"x", key="k")
    with pytest.raises(ValueError, match="no"):
        async with queue.claim():
            raise ValueError("no")
    real = a.backend.transact
    unparking: list[asyncio.Task[int]] = []

    async def then_cancelled(ops: Any) -> Any:
        result = await real(ops)
        unparking[0].cancel()  # right after the transaction: at its next await
        return result

    monkeypatch.setattr(a.backend, "transact", then_cancelled)
    unparking.append(asyncio.create_task(queue.unpark("k")))
    with contextlib.suppress(asyncio.CancelledError):
        await unparking[0]
    monkeypatch.setattr(a.backend, "transact", real)
    with anyio.fail_after(10):
        await wait_for_no_waiters(b, "unpark-cancel/_claims")
        async with b.queue("unpark-cancel").claim() as job:
            assert job.payload == b"x"


async def test_an_ack_whose_reply_is_lost_is_found_done(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ack is applied and its reply lost: it is not repeated (a repeat would fail
    its own guards and report the claim lost); the claim and the job being gone tell
    that it was done. The block exits normally and the job never comes back."""
    a, b, _, _ = clients
    await a.queue("lost-ack").put(b"x")
    real = a.backend.transact
    lost = [False]

    async def lossy(ops: Any) -> Any:
        result = await real(ops)
        if not lost[0] and not any(isinstance(op, Create) for op in ops):
            lost[0] = True  # the first transaction without a Create: the ack
            raise BackendUnavailable("reply lost")
        return result

    monkeypatch.setattr(a.backend, "transact", lossy)
    with anyio.fail_after(10):
        async with a.queue("lost-ack").claim() as job:
            assert job.payload == b"x"
    assert lost[0]
    assert (await b.queue("lost-ack").stats()).depth == 0


@pytest.mark.parametrize("others", [0, 1], ids=["alone", "then-another"])
async def test_handed_the_lock_as_it_is_cancelled(clients: list[coord.Client], others: int) -> None:
    """Native asyncio: a local waiter is cancelled (task.cancel()) right after the
    holder handed it the lock, before it ran. The lock passes on to the next local
    waiter, or, with none, its key is deleted: nothing is held by nobody."""
    a = clients[0]
    mutex = a.mutex("cancel-handed", local_handoff=5)
    hold = await mutex.acquire()
    handed = asyncio.ensure_future(mutex.acquire())
    got: list[int] = []
    async with anyio.create_task_group() as tg:
        while mutex.statistics().tasks_waiting == 0:
            await anyio.lowlevel.checkpoint()
        await queue_locally(tg, mutex, others, got)
        # The cancel runs right after the release hands the lock over, before `handed`
        # resumes: asyncio runs the callbacks in the order they were scheduled.
        asyncio.get_running_loop().call_soon(handed.cancel)
        await mutex.release()
        with pytest.raises(asyncio.CancelledError):
            await handed
    if others:
        assert got == [hold.fence + 2]  # the cancelled one's fence is never used
    with anyio.fail_after(10):
        await wait_for_no_waiters(a, "cancel-handed")  # deleted by a session task
    async with a.mutex("cancel-handed") as again:  # and the lock is free
        assert again.fence > hold.fence


async def cancel_in_flight(
    client: coord.Client, queue: coord.Queue, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> anyio.Event:
    """Put *job_id* in a task, hold back the answer of its transaction once the store
    applied it, and cancel the task (``task.cancel()``): returns the event that lets the
    held answer go."""
    applied, answer = anyio.Event(), anyio.Event()
    transact = client.backend.transact

    async def slow(ops: Any) -> Any:
        made = await transact(ops)
        applied.set()
        await answer.wait()
        return made

    monkeypatch.setattr(client.backend, "transact", slow)
    first = asyncio.create_task(queue.put(b"x", job_id=job_id))
    await applied.wait()
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first
    monkeypatch.setattr(client.backend, "transact", transact)
    return answer


async def _answer_later(answer: anyio.Event) -> None:
    """Let a held answer go 0.3 s from now, as a reply delayed in the network comes (a
    repeat from the same client waits for it: its puts of one id are made in order)."""
    await anyio.sleep(0.3)
    answer.set()


@pytest.mark.parametrize(
    "repeater", ["same queue object", "another queue object", "another client"]
)
async def test_a_repeat_takes_the_job_over_from_a_cancelled_put(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch, repeater: str
) -> None:
    """A put with a job_id is cancelled (task.cancel()) while its request is in flight,
    and the same id is put again before the first answer comes: by the same Queue
    object, another of the same client, or another client (issue 36, item 1: those two
    lost the job). The repeat returns the job; the first put's clean-up, when its answer
    comes, must leave it queued (withdrawing it would delete the job the repeat said was
    queued)."""
    a, b, _, _ = clients
    queue = a.queue("takeover")
    other = {
        "same queue object": queue,
        "another queue object": a.queue("takeover"),
        "another client": b.queue("takeover"),
    }[repeater]
    with anyio.fail_after(15):
        answer = await cancel_in_flight(a, queue, "once", monkeypatch)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_answer_later, answer)
            repeat = await other.put(b"x", job_id="once")
        assert repeat.id == "once"
        await anyio.sleep(0.5)  # the first put's clean-up has had its chance
        assert (await queue.stats()).depth == 1


async def test_a_cancelled_put_with_a_job_id_is_withdrawn(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no repeat, the job of a put cancelled in flight (task.cancel()) is withdrawn
    once its answer comes: job and marker."""
    a, _, _, _ = clients
    queue = a.queue("withdrawn")
    with anyio.fail_after(15):
        answer = await cancel_in_flight(a, queue, "gone", monkeypatch)
        assert (await queue.stats()).depth == 1
        answer.set()
        while (await queue.stats()).depth:  # noqa: ASYNC110  (withdrawn in the background)
            await anyio.sleep(0.05)
        assert (await a.backend.entries("withdrawn/_ids/")).entries == ()


@pytest.mark.parametrize("steps", [0, 1, 2, 5])
async def test_a_join_cancelled_natively_at_any_point_leaves_no_member(
    clients: list[coord.Client], steps: int
) -> None:
    """``task.cancel()`` after *steps* turns of the loop: while registering, in the body,
    or while leaving. The membership's entry goes in every case."""
    a, b, _, _ = clients

    async def member() -> None:
        async with a.group("native-join").join(b"a"):
            await asyncio.sleep(3600)

    for _ in range(3):
        task = asyncio.create_task(member())
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    with anyio.fail_after(10):
        while await b.group("native-join").members():  # noqa: ASYNC110  (deleted by a task)
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("steps", [0, 1, 3, 20, 200])
async def test_a_partitioner_member_cancelled_natively_leaves_nothing(
    clients: list[coord.Client], steps: int
) -> None:
    """``task.cancel()`` after *steps* turns of the loop: while joining, while its
    partitions are acquired, while owning, or while leaving. Its member entry, its
    record and its partitions' keys all go, and another member then owns everything."""
    a, b, _, _ = clients

    async def member() -> None:
        async with a.partitioner("native-parts", partitions=4).join():
            await asyncio.sleep(3600)

    for _ in range(3):
        task = asyncio.create_task(member())
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    with anyio.fail_after(10):
        names = ["native-parts", "native-parts/_assignment"] + [
            f"native-parts/_partitions/{p}" for p in range(4)
        ]
        while any([(await b.backend.entries(n + "/")).entries for n in names]):  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        async with b.partitioner("native-parts", partitions=4).join() as owner:
            async for assignment in owner.assignments():
                if assignment.owned == {0, 1, 2, 3}:
                    break


async def _two_bodies_running(
    a: coord.Client, name: str, seconds: float
) -> tuple[Any, list[str], list[str], asyncio.Event]:
    """Two jobs on queue *name*, and a handler whose bodies take *seconds* (noting the
    jobs started and finished); the event is set once both bodies run."""
    for n in range(2):
        await a.queue(name).put(b"%d" % n)
    started: list[str] = []
    finished: list[str] = []
    both = asyncio.Event()

    async def handler(job: coord.Job) -> None:
        started.append(job.id)
        if len(started) == 2:
            both.set()
        await asyncio.sleep(seconds)
        finished.append(job.id)

    return handler, started, finished, both


async def test_asyncio_timeout_around_run_drains_and_the_bodies_finish(
    clients: list[coord.Client],
) -> None:
    """A native cancellation is delivered to run()'s own task only: the handlers run on
    through the grace, and their jobs are acked."""
    a, b, _, _ = clients
    handler, started, finished, both = await _two_bodies_running(a, "native-run", 0.5)

    with anyio.fail_after(15):
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(None) as timeout:
                watcher = asyncio.create_task(both.wait())
                loop = asyncio.get_running_loop()
                watcher.add_done_callback(lambda _: timeout.reschedule(loop.time()))
                await b.queue("native-run").run(handler, concurrency=2, grace=10, signals=())
    assert sorted(finished) == sorted(started)
    assert len(finished) == 2
    assert (await a.queue("native-run").stats()).depth == 0
    await wait_for_no_waiters(a, "native-run/_claims")


async def test_task_cancel_of_run_after_a_short_grace_releases_the_jobs(
    clients: list[coord.Client],
) -> None:
    a, b, c, _ = clients
    handler, started, finished, both = await _two_bodies_running(a, "native-run2", 3600)
    queue = b.queue("native-run2", max_attempts=1)  # an attempt counted would park them
    task = asyncio.create_task(queue.run(handler, concurrency=2, grace=0.2, signals=()))
    with anyio.fail_after(15):
        await both.wait()
        cancelled_at = anyio.current_time()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert anyio.current_time() - cancelled_at >= 0.19, "cancelled before the grace ended"
    assert finished == []
    with anyio.fail_after(10):
        await wait_for_no_waiters(a, "native-run2/_claims")
        for _ in range(2):  # another client claims them, no attempt counted
            async with c.queue("native-run2").claim() as job:
                assert (job.id in started, job.attempt) == (True, 0)


async def _cancel_own_task(when: str) -> None:
    """Cancel the running task natively: the cancellation lands at the next await ("at
    its next await"), or is left to come after the caller returns ("as it returns")."""
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    if when == "at its next await":
        await asyncio.sleep(0)


async def _run_until_acked(queue: coord.Queue, handler: Any, acked: anyio.Event) -> None:
    """Run *queue* with one worker until *acked* is set; fail if run() ends first."""
    run = asyncio.create_task(queue.run(handler, concurrency=1, grace=5, signals=()))
    acking = asyncio.create_task(acked.wait())
    with anyio.fail_after(15):
        await asyncio.wait({run, acking}, return_when=asyncio.FIRST_COMPLETED)
        acking.cancel()
        assert not run.done(), "run() ended"
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run


@pytest.mark.parametrize("when", ["at its next await", "as it returns"])
async def test_a_handler_that_cancels_its_own_task_fails_its_attempt_and_the_loop_goes_on(
    clients: list[coord.Client], caplog: pytest.LogCaptureFixture, when: str
) -> None:
    """A worker's task is the one a native cancellation reaches only from its handler.
    Such a cancellation ended the worker, and with it run(), which returned its counts
    as if drained, no error and no signal: every later job waited. It is the handler's
    failure now: each attempt counts, so such a job parks after its last one (were it
    given back with no attempt counted, it would be claimed again for ever), and the one
    worker goes on to the next jobs."""
    caplog.set_level(logging.INFO, logger="coord")
    a, b, _, _ = clients
    producer = a.queue("native-self")
    await producer.put(b"self", key="k")
    attempts: list[int] = []
    acked: list[bytes] = []
    all_acked = anyio.Event()

    async def handler(job: coord.Job) -> None:
        if job.payload == b"self":
            attempts.append(job.attempt)
            await _cancel_own_task(when)
            return
        acked.append(job.payload)
        if len(acked) == 3:
            all_acked.set()

    for n in range(3):  # after it: the one worker claims them once it parked
        await producer.put(b"%d" % n)
    queue = b.queue("native-self", max_attempts=2, retry_delay=0)
    await _run_until_acked(queue, handler, all_acked)
    assert attempts == [0, 1]
    assert acked == [b"0", b"1", b"2"]
    stats = await producer.stats()
    assert (stats.depth, stats.parked, stats.in_flight) == (1, 1, 0)
    failed = [
        r.getMessage()
        for r in caplog.records
        if r.name == "coord" and "and not by coord" in r.getMessage()
    ]
    assert len(failed) == 2, failed
    assert failed[0].endswith("; retried after 0s")
    assert failed[1].endswith("; parked")
    ended = [r.getMessage() for r in caplog.records if "drained in" in r.getMessage()]
    assert ended[-1].endswith("3 acked, 2 failed, 0 lost, 0 released"), ended


async def test_a_handler_that_takes_its_own_cancellation_and_returns_is_acked(
    clients: list[coord.Client],
) -> None:
    """A cancellation the handler cancelled and caught itself is its own business: its
    job is acked, and the worker's next handler starts with no cancellation pending."""
    a, b, _, _ = clients
    for payload in (b"self", b"next"):
        await a.queue("native-caught").put(payload)
    seen: list[tuple[bytes, int]] = []
    done = anyio.Event()

    async def handler(job: coord.Job) -> None:
        task = asyncio.current_task()
        assert task is not None
        seen.append((job.payload, task.cancelling()))
        if job.payload == b"self":
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(1)
        else:
            await asyncio.sleep(0.01)  # (a cancellation still pending would land here)
            done.set()

    await _run_until_acked(b.queue("native-caught"), handler, done)
    assert seen == [(b"self", 0), (b"next", 0)]
    assert (await a.queue("native-caught").stats()).depth == 0


async def _take_own_cancellation() -> None:
    """Cancel the running task natively, and take that cancellation (a handler's own
    business), leaving its request counted on the task (asyncio's ``cancelling()``)."""
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(1)


async def test_a_handler_that_took_its_own_cancellation_still_times_out(
    clients: list[coord.Client], caplog: pytest.LogCaptureFixture
) -> None:
    """A handler that took a cancellation of its own and then runs past the job's
    timeout: the timeout's scope does not take a cancellation it did not make (its
    request is still counted on the task), and let through, it gave the job back with no
    attempt counted, to be claimed again for ever. The timeout is told: the attempt
    fails with JobTimeout, and the worker goes on."""
    caplog.set_level(logging.WARNING, logger="coord")
    a, b, _, _ = clients
    await a.queue("native-late").put(b"self")
    await a.queue("native-late").put(b"next")
    done = anyio.Event()
    calls: list[tuple[bytes, int]] = []

    async def handler(job: coord.Job) -> None:
        calls.append((job.payload, job.attempt))
        if job.payload == b"self" and job.attempt == 0:
            await _take_own_cancellation()
            await asyncio.sleep(1)  # the job's timeout (0.2 s) cancels this
        elif job.payload == b"next":
            done.set()

    await _run_until_acked(b.queue("native-late", timeout=0.2, retry_delay=0), handler, done)
    assert calls[0] == (b"self", 0)
    timed_out = [r.getMessage() for r in caplog.records if "JobTimeout" in r.getMessage()]
    assert len(timed_out) == 1, [r.getMessage() for r in caplog.records]
    assert "(attempt 1 of 5)" in timed_out[0]


async def test_a_handler_that_took_its_own_cancellation_is_released_at_the_drain(
    clients: list[coord.Client], caplog: pytest.LogCaptureFixture
) -> None:
    """The same handler still running when the drain's grace ends: the drain's scope
    does not take it either, and let through, it ended the worker uncounted. Its job is
    given back as it was and counted as released, with a warning."""
    caplog.set_level(logging.INFO, logger="coord")
    a, b, _, _ = clients
    await a.queue("native-drain").put(b"self")
    running = anyio.Event()

    async def handler(job: coord.Job) -> None:
        await _take_own_cancellation()
        running.set()
        await asyncio.sleep(60)

    run = asyncio.create_task(
        b.queue("native-drain").run(handler, concurrency=1, grace=0.1, signals=())
    )
    with anyio.fail_after(15):
        await running.wait()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    messages = [r.getMessage() for r in caplog.records]
    assert any("which ended its claim block" in m for m in messages), messages
    ended = [m for m in messages if "drained in" in m]
    assert ended[-1].endswith("0 acked, 0 failed, 0 lost, 1 released"), ended
    async with a.queue("native-drain").claim() as job:  # given back as it was
        assert (job.payload, job.attempt) == (b"self", 0)


@pytest.mark.parametrize("when", ["at its next await", "as it returns"])
async def test_partition_work_that_cancels_its_own_task_ends_the_run_with_an_error(
    clients: list[coord.Client], when: str
) -> None:
    """A partitioner's work runs in a task per partition that only it can cancel
    natively. Let through, that cancellation cancelled the work on every other partition
    and ended the membership, with nothing raised or logged; then run() joined again,
    for ever if the work always did so. It is the work's exception now, which ends the
    membership and propagates, as run() says of an exception."""
    a, b, _, _ = clients
    started: list[int] = []

    async def work(hold: coord.PartitionHold) -> None:
        started.append(hold.partition)
        if hold.partition == 0:
            await _cancel_own_task(when)
            return
        await anyio.sleep_forever()

    partitioner = a.partitioner("native-parts", partitions=2)
    with anyio.fail_after(10), pytest.raises(RuntimeError, match="partition 0 was cancelled"):
        await partitioner.run(work, cooldown=0)
    assert 0 in started
    assert await b.partitioner("native-parts", partitions=2).members() == []


async def test_a_native_cancel_of_a_partitioners_run_is_a_cancellation(
    clients: list[coord.Client],
) -> None:
    """The caller's own ``task.cancel()`` of run() reaches the work through run()'s scopes:
    a cancellation, not the work's failure."""
    a = clients[0]
    both = anyio.Event()
    started: list[int] = []

    async def work(hold: coord.PartitionHold) -> None:
        started.append(hold.partition)
        if len(started) == 2:
            both.set()
        await anyio.sleep_forever()

    run = asyncio.create_task(a.partitioner("native-parts-run", partitions=2).run(work))
    with anyio.fail_after(10):
        await both.wait()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run


async def test_a_natively_cancelled_put_many_leaves_nothing_queued(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same with ``task.cancel()``, which an anyio shield does not stop."""
    a, _, _, _ = clients
    queue = a.queue("native-many")
    applied, answer = anyio.Event(), anyio.Event()
    transact = a.backend.transact

    async def slow(ops: Any) -> Any:
        made = await transact(ops)
        applied.set()
        await answer.wait()
        return made

    monkeypatch.setattr(a.backend, "transact", slow)
    with anyio.fail_after(15):
        task = asyncio.create_task(queue.put_many([b"a", b"b", b"c"]))
        await applied.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert (await queue.stats()).depth == 3
        answer.set()
        while (await queue.stats()).depth:  # noqa: ASYNC110  (withdrawn in the background)
            await anyio.sleep(0.05)
