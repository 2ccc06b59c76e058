"""``queue.run(handler, concurrency=n)``, the worker loop, on every backend: n handlers at
once, a failing handler retried then parked while the loop goes on, a lost claim logged,
and the drain on cancellation and on a signal (the handlers in flight finish within the
grace; after it they are cancelled and their jobs given back, no attempt counted)."""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import coord
from coord.testing import expire_session

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

pytestmark = pytest.mark.anyio


async def claims_of(client: coord.Client, name: str) -> list[str]:
    return [e.key for e in (await client.backend.entries(f"{name}/_claims/")).entries]


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "coord" and r.levelno >= logging.WARNING
    ]


async def run_until(
    queue: coord.Queue,
    handler: Callable[[coord.Job], Awaitable[object]],
    ready: Callable[[], Awaitable[object]],
    **options: Any,
) -> None:
    """Run the loop until ``ready()`` returns, then cancel it (which drains it)."""
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: queue.run(handler, signals=(), **options))
            await ready()
            tg.cancel_scope.cancel()


async def test_jobs_run_n_at_once(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    for n in range(6):
        await a.queue("run-n").put(b"%d" % n)
    running, peak, done = 0, 0, []
    three = anyio.Event()
    all_done = anyio.Event()

    async def handler(job: coord.Job) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 3:
            three.set()
        await three.wait()  # three bodies at once, or the test times out
        await anyio.sleep(0.05)
        running -= 1
        done.append(job.payload)
        if len(done) == 6:
            all_done.set()

    await run_until(b.queue("run-n"), handler, all_done.wait, concurrency=3)
    assert peak == 3
    assert sorted(done) == [b"%d" % n for n in range(6)]
    assert (await a.queue("run-n").stats()).depth == 0
    assert await claims_of(a, "run-n") == []


@pytest.mark.real_clock  # the retry backoff is read from time.time()
async def test_a_failing_handler_is_retried_then_parked_and_the_loop_goes_on(
    clients: list[coord.Client], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="coord")
    a, b, _, _ = clients
    await a.queue("run-fail").put(b"bad", key="k")
    good = await a.queue("run-fail").put(b"good", key="z")
    attempts: list[int] = []
    acked = anyio.Event()

    async def handler(job: coord.Job) -> None:
        if job.payload == b"good":
            acked.set()
            return
        attempts.append(job.attempt)
        raise ValueError("boom")

    async def parked_and_acked() -> None:
        await acked.wait()
        while (await a.queue("run-fail").stats()).parked == 0:  # noqa: ASYNC110  (the nack)
            await anyio.sleep(0.05)

    queue = b.queue("run-fail", max_attempts=2, retry_delay=0.05)
    await run_until(queue, handler, parked_and_acked, concurrency=2)
    assert attempts == [0, 1]
    stats = await a.queue("run-fail").stats()
    assert (stats.depth, stats.parked, stats.in_flight) == (1, 1, 0)
    failed = [w for w in warnings(caplog) if "failed (ValueError: boom)" in w]
    assert len(failed) == 2, warnings(caplog)
    assert "(attempt 1 of 2)" in failed[0]
    assert failed[0].endswith("; retried after 0.05s")
    assert "(attempt 2 of 2)" in failed[1]
    assert failed[1].endswith("; parked")
    records = [r for r in caplog.records if "failed (ValueError" in r.getMessage()]
    assert all(r.exc_info is not None for r in records), "logged with the traceback"
    assert not any(good.id in w for w in warnings(caplog))
    (started,) = [r.getMessage() for r in caplog.records if "running 2 workers" in r.getMessage()]
    assert started == "queue 'run-fail': running 2 workers (grace 30s)"
    ended = [r.getMessage() for r in caplog.records if "drained in" in r.getMessage()]
    assert len(ended) == 1
    assert ended[0].endswith("1 acked, 2 failed, 0 lost, 0 released")


async def test_cancelled_mid_body_the_bodies_finish_within_the_grace_and_are_acked(
    clients: list[coord.Client],
) -> None:
    a, b, _, _ = clients
    for n in range(2):
        await a.queue("run-grace").put(b"%d" % n)
    started, finished = [], []
    both = anyio.Event()

    async def handler(job: coord.Job) -> None:
        started.append(job.payload)
        if len(started) == 2:
            both.set()
        await anyio.sleep(0.5)  # still running when run() is cancelled
        finished.append(job.payload)

    await run_until(b.queue("run-grace"), handler, both.wait, concurrency=3, grace=10)
    assert sorted(finished) == [b"0", b"1"]
    assert (await a.queue("run-grace").stats()).depth == 0
    assert await claims_of(a, "run-grace") == []


async def test_after_a_short_grace_the_bodies_are_cancelled_and_their_jobs_released(
    clients: list[coord.Client], caplog: pytest.LogCaptureFixture
) -> None:
    a, b, c, _ = clients
    for n in range(2):
        await a.queue("run-short").put(b"%d" % n)
    started, cancelled = [], []
    both = anyio.Event()

    async def handler(job: coord.Job) -> None:
        started.append(job.id)
        if len(started) == 2:
            both.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append(job.id)
            raise

    # max_attempts=1: an attempt counted would park the jobs.
    queue = b.queue("run-short", max_attempts=1)
    await run_until(queue, handler, both.wait, concurrency=2, grace=0.2)
    assert sorted(cancelled) == sorted(started)
    released = [w for w in warnings(caplog) if "released for another worker" in w]
    assert sorted(w.split()[3] for w in released) == sorted(started)
    assert await claims_of(a, "run-short") == []
    with anyio.fail_after(10):
        for _ in range(2):  # another client claims them, no attempt counted
            async with c.queue("run-short").claim() as job:
                assert job.attempt == 0
                assert job.id in started
    assert (await a.queue("run-short").stats()).depth == 0


async def test_a_lost_claim_is_logged_and_the_loop_goes_on(
    clients: list[coord.Client], caplog: pytest.LogCaptureFixture
) -> None:
    a, b, _, _ = clients
    ref = await a.queue("run-lost").put(b"x")
    attempts: list[int] = []
    acked = anyio.Event()

    async def handler(job: coord.Job) -> None:
        attempts.append(job.attempt)
        if job.attempt == 0:
            await expire_session(b)
            await anyio.sleep_forever()  # cancelled by the loss
        acked.set()

    await run_until(b.queue("run-lost"), handler, acked.wait)
    assert attempts == [0, 1]  # claimed again by the same loop, on its next session
    (lost,) = [w for w in warnings(caplog) if f"job {ref.id}: " in w]
    assert "the claim" in lost
    assert "was lost" in lost
    assert (await a.queue("run-lost").stats()).depth == 0


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="signals are handled in the main thread only",
)
async def test_a_signal_drains_and_returns_the_statistics(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    for payload in (b"ok", b"bad", b"defer", b"slow"):
        await a.queue("run-signal").put(payload, key=payload.decode())
    seen: list[bytes] = []

    async def handler(job: coord.Job) -> None:
        seen.append(job.payload)
        if job.payload == b"bad":
            raise ValueError("bad")
        if job.payload == b"defer" and seen.count(b"defer") == 1:
            job.defer()  # given back, and claimed again at once
        elif job.payload == b"slow":
            await anyio.sleep_forever()  # cancelled after the grace

    async def signal_when_ready() -> None:
        # (what is in flight then finishes: the drain waits for it)
        while sorted(seen) != [b"bad", b"defer", b"defer", b"ok", b"slow"]:  # noqa: ASYNC110
            await anyio.sleep(0.02)
        os.kill(os.getpid(), signal.SIGUSR1)

    queue = b.queue("run-signal", max_attempts=1)
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(signal_when_ready)
            stats = await queue.run(handler, concurrency=4, grace=0.3, signals=(signal.SIGUSR1,))
    assert (stats.acked, stats.failed, stats.lost, stats.released) == (2, 1, 0, 2)
    assert stats.drained_in >= 0.29
    left = await a.queue("run-signal").stats()
    assert (left.depth, left.parked, left.in_flight) == (2, 1, 0)  # bad parked, slow back
    assert await claims_of(a, "run-signal") == []


async def test_bad_arguments_raise_at_once_and_claim_nothing(clients: list[coord.Client]) -> None:
    a, _, _, _ = clients
    queue = a.queue("run-bad")
    await queue.put(b"x")
    ran: list[coord.Job] = []

    async def handler(job: coord.Job) -> None:
        ran.append(job)

    bad: list[tuple[type[Exception], Any, dict[str, Any]]] = [
        (TypeError, "not callable", {}),
        (TypeError, handler, {"concurrency": "2"}),
        (TypeError, handler, {"concurrency": 1.0}),
        (TypeError, handler, {"concurrency": True}),
        (coord.ConfigurationError, handler, {"concurrency": 0}),
        (TypeError, handler, {"grace": "30"}),
        (coord.ConfigurationError, handler, {"grace": -1}),
        (coord.ConfigurationError, handler, {"grace": math.nan}),
        (TypeError, handler, {"signals": "SIGTERM"}),
        (TypeError, handler, {"signals": ("SIGTERM",)}),
    ]
    for error, fn, options in bad:
        with anyio.fail_after(1), pytest.raises(error):
            await queue.run(fn, **options)
    assert ran == []
    stats = await queue.stats()
    assert (stats.depth, stats.in_flight) == (1, 0)
    assert await claims_of(a, "run-bad") == []


async def test_a_failing_claim_neither_cuts_a_handler_short_nor_ends_the_loop(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A claim that fails for a while (the store refusing) is logged and tried again: the
    handlers in flight go on, and so does the loop (before, the first such error cancelled
    every handler at once, grace or not, and ended run())."""
    from coord._jobs import looker as _looker

    queue = clients[0].queue("flaky")
    await queue.put(b"long")
    real = _looker.Looker._claim
    calls = 0

    async def claim(self: Any, session: Any, pick: Any, retry: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise coord.BackendError("too many requests, for now")
        return await real(self, session, pick, retry)

    monkeypatch.setattr(_looker.Looker, "_claim", claim)
    done: list[bytes] = []
    second = anyio.Event()

    async def handler(job: coord.Job) -> None:
        if job.payload == b"long":
            await queue.put(b"next")  # claimed by the other worker: its claim fails once
            await anyio.sleep(0.3)
        done.append(job.payload)
        if len(done) == 2:
            second.set()

    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: queue.run(handler, concurrency=2, grace=30, signals=()))
            await second.wait()
            tg.cancel_scope.cancel()
    assert sorted(done) == [b"long", b"next"]
    assert calls >= 3
    assert any("claiming failed" in line for line in warnings(caplog))


async def test_a_timed_out_job_is_logged_as_what_became_of_it(
    clients: list[coord.Client], caplog: pytest.LogCaptureFixture
) -> None:
    """A body cut short by the job's timeout ended as a failed attempt, written: the log
    says what became of the job, not that its outcome is unknown."""
    queue = clients[0].queue("slow", max_attempts=2, retry_delay=0)
    await queue.put(b"hangs", timeout=0.2)
    again = anyio.Event()

    async def handler(job: coord.Job) -> None:
        if job.attempt == 0:
            await anyio.sleep_forever()  # cut short by the timeout
        again.set()  # the first attempt's ending was logged before this claim

    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: queue.run(handler, concurrency=1, grace=1, signals=()))
            await again.wait()
            tg.cancel_scope.cancel()
    line = next(line for line in warnings(caplog) if "JobTimeout" in line)
    assert "retried after 0s" in line
    assert "unknown" not in line
