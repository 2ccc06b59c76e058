"""Job options at put, on every backend: ``delay=``/``not_before=``, a per-job
``timeout`` (and the queue's), and ``priority`` (a queue opened with
``priorities=True``); each checked at the call, nothing written on bad input."""

from __future__ import annotations

import math
import time
from typing import Any

import anyio
import pytest

import coord
from coord._jobs.looker import looker_for

from .test_queue import take

pytestmark = pytest.mark.anyio


def count_reads(client: coord.Client, monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Count the reads of *name*'s jobs that *client* makes (one item per read)."""
    reads: list[int] = []
    entries = client.backend.entries

    async def counted(prefix: str, **kwargs: Any) -> Any:
        if prefix == f"{name}/_jobs/":
            reads.append(1)
        return await entries(prefix, **kwargs)

    monkeypatch.setattr(client.backend, "entries", counted)
    return reads


# -- delay and not_before --------------------------------------------------------------------


@pytest.mark.real_clock
@pytest.mark.parametrize("how", ["delay", "not_before"])
async def test_a_delayed_job_is_claimed_at_its_time_woken_by_the_timer(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A worker waits; a job put with a delay is not claimed before its time, and is
    claimed within a moment after it, by the looker's timer: its reads meanwhile are a
    handful, not a poll."""
    a, b, _, _ = clients
    reads = count_reads(b, monkeypatch, "later")
    got: list[float] = []

    async def worker() -> None:
        async with b.queue("later").claim() as job:
            got.append(time.time())
            assert job.payload == b"later"

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker)
            await anyio.sleep(0.2)
            start = time.time()
            when = {"delay": 0.8} if how == "delay" else {"not_before": start + 0.8}
            await a.queue("later").put(b"later", **when)  # type: ignore[arg-type]
    assert start + 0.8 <= got[0] < start + 0.8 + 0.5
    assert len(reads) <= 6, f"{len(reads)} reads of the jobs while waiting: polling?"


@pytest.mark.real_clock
async def test_a_delayed_job_at_the_head_of_its_key_holds_the_key(
    clients: list[coord.Client],
) -> None:
    """Per-key order holds: a key's later jobs wait for its delayed head; other keys and
    jobs without a key go on."""
    a, b, _, _ = clients
    queue = a.queue("held")
    start = time.time()
    await queue.put(b"a1", key="a", delay=1.0)
    await queue.put(b"a2", key="a")
    await queue.put(b"b1", key="b")
    await queue.put(b"free")
    worker = b.queue("held")
    assert (await take(worker))[0] == b"b1"
    assert (await take(worker))[0] == b"free"
    assert time.time() < start + 1.0
    assert (await take(worker))[0] == b"a1"
    assert time.time() >= start + 1.0
    assert (await take(worker))[0] == b"a2"


@pytest.mark.real_clock
async def test_a_delay_of_zero_or_a_past_not_before_is_claimable_at_once(
    clients: list[coord.Client],
) -> None:
    a, _, _, _ = clients
    queue = a.queue("now")
    await queue.put(b"zero", delay=0)
    await queue.put(b"past", not_before=time.time() - 60)
    with anyio.fail_after(2):
        assert (await take(queue))[0] == b"zero"
        assert (await take(queue))[0] == b"past"


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"delay": 1, "not_before": 2.0}, coord.ConfigurationError),
        ({"delay": -1}, coord.ConfigurationError),
        ({"delay": math.inf}, coord.ConfigurationError),
        ({"delay": math.nan}, coord.ConfigurationError),
        ({"delay": "1"}, TypeError),
        ({"delay": True}, TypeError),
        ({"not_before": math.nan}, coord.ConfigurationError),
        ({"not_before": "soon"}, TypeError),
        ({"timeout": 0}, coord.ConfigurationError),
        ({"timeout": -1.0}, coord.ConfigurationError),
        ({"timeout": math.inf}, coord.ConfigurationError),
        ({"timeout": False}, TypeError),
        ({"priority": 2**31}, coord.ConfigurationError),
        ({"priority": -(2**31)}, coord.ConfigurationError),
        ({"priority": True}, TypeError),
        ({"priority": 1.0}, TypeError),
    ],
)
async def test_bad_options_are_refused_at_the_call(
    clients: list[coord.Client], options: dict[str, Any], error: type[Exception]
) -> None:
    a, _, _, _ = clients
    queue = a.queue("bad", priorities=True)
    with pytest.raises(error):
        await queue.put(b"x", **options)
    with pytest.raises(error):
        await queue.put_many([b"fine", coord.NewJob(b"x", **options)])
    assert (await queue.stats()).depth == 0


async def test_a_priority_needs_a_queue_opened_for_priorities(
    clients: list[coord.Client],
) -> None:
    a, _, _, _ = clients
    with pytest.raises(coord.ConfigurationError, match="priorities=True"):
        await a.queue("plain").put(b"x", priority=1)
    with pytest.raises(coord.ConfigurationError, match="priorities=True"):
        await a.queue("plain").put_many([coord.NewJob(b"x", priority=-1)])
    await a.queue("plain").put(b"x", priority=0)
    assert (await a.queue("plain").stats()).depth == 1
    with pytest.raises(TypeError):
        a.queue("plain", priorities=1)  # type: ignore[arg-type]
    with pytest.raises(coord.ConfigurationError):
        a.queue("plain", timeout=0)


# -- timeout ------------------------------------------------------------------------------


@pytest.mark.real_clock
async def test_a_hung_body_is_cancelled_at_its_timeout_and_retried_by_another_worker(
    clients: list[coord.Client],
) -> None:
    """The body never ends: past the job's timeout it is cancelled, the block raises
    JobTimeout (a TimeoutError), the attempt counts, and another worker gets the job
    after the backoff, with the error saying it timed out. It used to hold its claim
    forever."""
    a, b, c, _ = clients
    ref = await a.queue("hung").put(b"x", timeout=0.3)
    start = anyio.current_time()
    with anyio.fail_after(10):
        with pytest.raises(coord.JobTimeout) as raised:
            async with b.queue("hung", retry_delay=0.1).claim() as job:
                await anyio.sleep_forever()
        assert 0.3 <= anyio.current_time() - start < 2.0
        assert isinstance(raised.value, TimeoutError)
        assert (raised.value.job_id, raised.value.timeout) == (ref.id, 0.3)
        assert job.id == ref.id
        async with c.queue("hung").claim() as again:
            assert (again.id, again.attempt) == (ref.id, 1)
            assert again._state.error is not None
            assert again._state.error.startswith("JobTimeout: ")
            assert "timeout of 0.3 s" in again._state.error


@pytest.mark.real_clock
async def test_the_queue_timeout_applies_unless_the_job_has_its_own(
    clients: list[coord.Client],
) -> None:
    a, b, _, _ = clients
    await a.queue("both").put(b"own", timeout=5.0)
    await a.queue("both").put(b"default")
    worker = b.queue("both", timeout=0.2, retry_delay=0)
    with anyio.fail_after(10):
        async with worker.claim() as job:
            assert job.payload == b"own"
            await anyio.sleep(0.4)  # past the queue's timeout, within the job's own
        with pytest.raises(coord.JobTimeout, match=r"timeout of 0\.2 s"):
            async with worker.claim() as job:
                assert job.payload == b"default"
                await anyio.sleep(5)


@pytest.mark.real_clock
@pytest.mark.parametrize("on_exhausted", ["park", "dead_letter"])
async def test_a_timeout_on_the_last_attempt_parks_or_dead_letters(
    clients: list[coord.Client], on_exhausted: Any
) -> None:
    a, _, _, _ = clients
    queue = a.queue("last", max_attempts=1, on_exhausted=on_exhausted)
    await queue.put(b"x", key="k", timeout=0.1)
    with anyio.fail_after(10), pytest.raises(coord.JobTimeout):
        async with queue.claim():
            await anyio.sleep_forever()
    stats = await queue.stats()
    if on_exhausted == "park":
        assert (stats.depth, stats.parked, stats.in_flight) == (1, 1, 0)
    else:
        (letter,) = await queue.dead_letters()
        assert letter.error is not None
        assert letter.error.startswith("JobTimeout: ")


@pytest.mark.real_clock
async def test_an_outer_cancellation_before_the_timeout_releases_the_job_as_it_was(
    clients: list[coord.Client],
) -> None:
    a, _, _, _ = clients
    queue = a.queue("outer")
    await queue.put(b"x", timeout=5.0)
    with anyio.fail_after(10):
        with anyio.move_on_after(0.2):
            async with queue.claim():
                await anyio.sleep_forever()
        async with queue.claim() as job:
            assert job.attempt == 0  # no attempt counted


@pytest.mark.real_clock
async def test_a_lost_claim_with_a_timeout_is_still_claim_lost(
    clients: list[coord.Client],
) -> None:
    """The claim is lost (its entry deleted by someone else) before the timeout: the
    block raises ClaimLost, not JobTimeout."""
    a, b, _, _ = clients
    await a.queue("lost").put(b"x", timeout=3.0)
    with anyio.fail_after(10), pytest.raises(coord.ClaimLost):
        async with b.queue("lost").claim() as job:
            await a.backend.transact([coord.abc.Remove(job._hold.entry)])
            await anyio.sleep(5)


# -- priority -----------------------------------------------------------------------------


async def test_the_highest_priority_is_claimed_first_even_far_behind(
    clients: list[coord.Client],
) -> None:
    """40 jobs of priority 0, then one of priority 5 (beyond the 32 a look reads
    first), then one of priority 1: claimed 5, 1, then the oldest."""
    a, b, _, _ = clients
    queue = a.queue("prio", priorities=True)
    await queue.put_many([b"low %d" % n for n in range(40)])
    await queue.put(b"high", priority=5)
    await queue.put(b"mid", priority=1)
    worker = b.queue("prio", priorities=True)
    assert [(await take(worker))[0] for _ in range(3)] == [b"high", b"mid", b"low 0"]


async def test_per_key_order_holds_across_priorities(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    queue = a.queue("prio-keys", priorities=True)
    await queue.put(b"a1", key="a")
    await queue.put(b"a2", key="a", priority=9)  # waits for a1 whatever its priority
    await queue.put(b"b1", key="b", priority=1)
    await queue.put(b"free", priority=-1)
    worker = b.queue("prio-keys", priorities=True)
    with anyio.fail_after(10):
        async with worker.claim() as first:
            assert first.payload == b"b1"
            async with worker.claim() as second:
                assert second.payload == b"a1"
                async with worker.claim() as third:
                    assert third.payload == b"free"  # a2 waits for a1
        assert (await take(worker))[0] == b"a2"


async def test_a_worker_that_forgot_priorities_switches_on_seeing_one(
    clients: list[coord.Client],
) -> None:
    """A worker's queue without ``priorities=True``: its looker reads the oldest 32,
    finds a job with a priority among them, and from then on reads every job."""
    a, b, _, _ = clients
    queue = a.queue("forgot", priorities=True)
    await queue.put_many([b"low %d" % n for n in range(10)])
    await queue.put(b"high", priority=3)
    worker = b.queue("forgot")
    assert (await take(worker))[0] == b"high"
    assert looker_for(b._source, "forgot").priorities
    assert (await take(worker))[0] == b"low 0"
