"""The Queue conformance suite, run on every backend: order (FIFO, per key), claims bound
to the worker's session, fenced acks, retry in place, parking and dead letters, bad
input, and that a put wakes one idle worker, not all of them."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import coord
from coord.testing import expire_session, wait_for_waiters

pytestmark = pytest.mark.anyio


async def claims_of(client: coord.Client, name: str) -> list[str]:
    return [e.key for e in (await client.backend.entries(f"{name}/_claims/")).entries]


async def take(queue: coord.Queue) -> tuple[bytes, str | None, int, int]:
    """Claim one job and ack it: (payload, key, attempt, fence)."""
    with anyio.fail_after(10):
        async with queue.claim() as job:
            pass
    return job.payload, job.key, job.attempt, job.fence


async def test_fifo_ack_and_fences(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    queue = a.queue("fifo")
    refs = [await queue.put(f"job {i}".encode()) for i in range(5)]
    assert [r.seq for r in refs] == sorted(r.seq for r in refs)
    assert len({r.id for r in refs}) == 5
    worker = b.queue("fifo")
    taken = [await take(worker) for _ in range(5)]
    assert [t[0] for t in taken] == [f"job {i}".encode() for i in range(5)]
    fences = [t[3] for t in taken]
    assert fences == sorted(fences)
    assert len(set(fences)) == 5
    stats = await queue.stats()
    assert (stats.depth, stats.in_flight, stats.parked, stats.dead) == (0, 0, 0, 0)
    assert await claims_of(a, "fifo") == []


async def test_per_key_order_one_at_a_time_keys_in_parallel(clients: list[coord.Client]) -> None:
    a, b, c, _ = clients
    queue = a.queue("keys")
    await queue.put(b"a1", key="a")
    await queue.put(b"a2", key="a")
    await queue.put(b"b1", key="b")
    await queue.put(b"free")
    with anyio.fail_after(10):
        async with b.queue("keys").claim() as first:
            assert first.payload == b"a1"
            # a2 waits for a1; b1 and the keyless job are free.
            async with c.queue("keys").claim() as second:
                assert second.payload == b"b1"
                async with c.queue("keys").claim() as third:
                    assert third.payload == b"free"
                    stats = await queue.stats()
                    assert (stats.depth, stats.in_flight) == (4, 3)
                    assert stats.keys["a"] == coord.KeyStats(depth=2, in_flight=1, parked=0)
                    with anyio.move_on_after(0.5) as blocked:
                        async with c.queue("keys").claim() as early:
                            pytest.fail(f"{early.payload!r} ran while a1 was in flight")
                    assert blocked.cancelled_caught
        assert (await take(c.queue("keys")))[:3] == (b"a2", "a", 0)


async def test_a_claimable_job_far_behind_a_blocked_key_is_found(
    clients: list[coord.Client],
) -> None:
    """A look reads the oldest jobs first, then further: a job behind more jobs of a
    blocked key than the first read takes is still handed out."""
    a, b, _, _ = clients
    queue = a.queue("far")
    for n in range(40):
        await queue.put(b"a%d" % n, key="a")
    await queue.put(b"b0", key="b")
    with anyio.fail_after(15):
        async with b.queue("far").claim() as first:
            assert first.payload == b"a0"
            async with a.queue("far").claim() as second:
                assert second.payload == b"b0"


async def test_a_waiting_worker_is_woken_by_a_put(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    got: list[bytes] = []

    async def worker() -> None:
        got.append((await take(b.queue("wake")))[0])

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker)
            await wait_for_waiters(b, "wake/_idle", 1)
            await anyio.sleep(0.2)
            await a.queue("wake").put(b"hello")
    assert got == [b"hello"]


async def test_a_put_wakes_one_idle_worker_not_all(
    coord_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each client's idle workers wait behind one looker, and of the idle lookers only
    the first two watch the jobs: a put makes those two read the queue, and the next in
    line, which takes the claimer's place, read once to start its watch. Without that,
    every put would make every idle worker (here 16, on 8 clients) read the queue."""
    readers: set[int] = set()
    done: list[bytes] = []

    async def worker(client: coord.Client) -> None:
        done.append((await take(client.queue("herd")))[0])

    async with AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(coord.connect(coord_url, ttl=5.0)) for _ in range(8)
        ]
        for number, client in enumerate(clients):
            original = client.backend.entries

            async def counting(  # type: ignore[no-untyped-def]
                prefix: str,
                *,
                limit: int | None = None,
                stale_ok: bool = False,
                _o=original,
                _n=number,
            ) -> object:
                if prefix.endswith("/_jobs/"):
                    readers.add(_n)
                return await _o(prefix, limit=limit, stale_ok=stale_ok)

            monkeypatch.setattr(client.backend, "entries", counting)
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for client in clients:
                    for _ in range(2):
                        tg.start_soon(worker, client)
                await wait_for_waiters(clients[0], "herd/_idle", 8)
                await anyio.sleep(0.3)
                readers.clear()
                await clients[0].queue("herd").put(b"one")
                while not done:  # noqa: ASYNC110  (a test waiting for a side effect)
                    await anyio.sleep(0.05)
                await anyio.sleep(0.3)
                assert len(readers) <= 3, f"{len(readers)} of 8 clients read the queue for one put"
                for i in range(15):
                    await clients[0].queue("herd").put(b"more %d" % i)
    assert sorted(done) == sorted([b"one"] + [b"more %d" % i for i in range(15)])


@pytest.mark.real_clock  # the retry backoff is read from time.time()
async def test_exception_retries_in_place_then_parks(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    queue = b.queue("retry", max_attempts=3, retry_delay=0.05)
    await a.queue("retry").put(b"bad", key="k")
    await a.queue("retry").put(b"next", key="k")
    attempts = []
    with anyio.fail_after(15):
        for _ in range(3):
            with pytest.raises(ValueError, match="boom"):
                async with queue.claim() as job:
                    attempts.append((job.payload, job.attempt))
                    raise ValueError("boom")
    assert attempts == [(b"bad", 0), (b"bad", 1), (b"bad", 2)]
    stats = await queue.stats()
    assert stats.parked == 1
    assert stats.keys["k"] == coord.KeyStats(depth=2, in_flight=0, parked=1)
    # The key waits (order kept); other keys go on.
    await a.queue("retry").put(b"other", key="z")
    with anyio.fail_after(10):
        assert (await take(queue))[0] == b"other"
    with anyio.move_on_after(0.5) as blocked:
        async with queue.claim() as job:
            pytest.fail(f"{job.payload!r} handed out while its key is parked")
    assert blocked.cancelled_caught
    assert await queue.unpark("z") == 0
    assert await queue.unpark("k") == 1
    with anyio.fail_after(10):
        assert (await take(queue))[:3] == (b"bad", "k", 0)
        assert (await take(queue))[:3] == (b"next", "k", 0)


async def test_unpark_wakes_a_waiting_worker_whatever_the_number_parked(
    clients: list[coord.Client],
) -> None:
    a, b, _, _ = clients
    queue = a.queue("unpark", max_attempts=1)
    for n in range(20):
        await queue.put(b"%d" % n, key=f"k{n}")
    with anyio.fail_after(30):
        for _ in range(20):
            with pytest.raises(ValueError, match="no"):
                async with queue.claim():
                    raise ValueError("no")
    assert (await queue.stats()).parked == 20
    got: list[bytes] = []

    async def worker() -> None:
        async with b.queue("unpark").claim() as job:
            got.append(job.payload)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker)
            await wait_for_waiters(b, "unpark/_idle", 1)
            await anyio.sleep(0.3)  # it looked, found all parked, and waits
            assert await queue.unpark("k19") == 1
    assert got == [b"19"]


async def test_an_unpark_between_an_idle_lookers_two_reads_wakes_it(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle looker, woken, reads the jobs (one of them parked), then the claims. An
    unpark comes between the two reads, its passing entry among the claims made and
    deleted before the claims are read: the job, read parked, is claimable now, and the
    looker's watch must see that deletion (it came after the jobs read)."""
    a, b = clients[0], clients[1]
    queue = a.queue("unpark-between", max_attempts=1, on_exhausted="park")
    parked = await queue.put(b"parked")
    with pytest.raises(ValueError, match="no"):
        async with queue.claim():
            raise ValueError("no")
    assert (await queue.stats()).parked == 1
    other = await queue.put(b"other")
    held, ack = anyio.Event(), anyio.Event()
    armed, last = [False], [""]

    async def hold_other() -> None:
        async with queue.claim() as job:
            assert job.id == other.id
            held.set()
            await ack.wait()

    entries = b.backend.entries

    async def reads(prefix: str, **options: Any) -> Any:
        previous, last[0] = last[0], prefix
        if prefix.endswith("/_claims/") and previous.endswith("/_jobs/") and armed[0]:
            armed[0] = False  # b read the jobs: unparked, and its passing entry gone
            assert await queue.unpark(None) == 1
            for _ in range(500):  # until a's session has deleted the passing entry
                if not (await a.backend.entries(prefix)).entries:
                    break
                await anyio.sleep(0.01)
        return await entries(prefix, **options)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_other)
            await held.wait()
            monkeypatch.setattr(b.backend, "entries", reads)

            async def wake_b() -> None:
                await wait_for_waiters(b, "unpark-between/_idle", 1)
                await anyio.sleep(0.3)  # it looked, found nothing claimable, and waits
                armed[0] = True
                ack.set()  # the ack wakes b, which reads again

            tg.start_soon(wake_b)
            async with b.queue("unpark-between").claim() as job:
                assert job.id == parked.id
    assert armed == [False], "no unpark between the reads"


async def test_a_deferred_job_comes_back_as_it_was(clients: list[coord.Client]) -> None:
    """defer(): the failure is not the job's (a dependency is down): the exception
    propagates, no attempt is counted (max_attempts=1 would park it), no backoff."""
    a, _, _, _ = clients
    queue = a.queue("defer", max_attempts=1, retry_delay=60)
    await queue.put(b"x", key="k")
    with anyio.fail_after(10):
        for _ in range(3):
            with pytest.raises(ConnectionError):
                async with queue.claim() as job:
                    assert job.attempt == 0
                    job.defer()
                    raise ConnectionError("the database is down")
        async with queue.claim() as job:
            job.defer()  # a normal exit gives it back too
        assert (await queue.stats()).depth == 1
        async with queue.claim() as job:
            assert (job.payload, job.attempt) == (b"x", 0)
    assert (await queue.stats()).depth == 0


@pytest.mark.real_clock
async def test_backoff_is_waited_for_not_polled(clients: list[coord.Client]) -> None:
    a, _, _, _ = clients
    queue = a.queue("backoff", retry_delay=0.5)
    await queue.put(b"x")
    with anyio.fail_after(10):
        with pytest.raises(KeyError):
            async with queue.claim():
                raise KeyError("once")
        started = anyio.current_time()
        async with queue.claim() as job:
            waited = anyio.current_time() - started
    assert job.attempt == 1
    assert waited >= 0.4


async def test_dead_letter_then_requeue(clients: list[coord.Client]) -> None:
    a, _, _, _ = clients
    queue = a.queue("dlq", max_attempts=1, on_exhausted="dead_letter")
    ref = await queue.put(b"poison", key="k")
    await queue.put(b"after", key="k")
    with anyio.fail_after(10):
        with pytest.raises(RuntimeError):
            async with queue.claim():
                raise RuntimeError("cannot")
        assert (await take(queue))[:2] == (b"after", "k")  # the key goes on
    (letter,) = await queue.dead_letters()
    assert (letter.id, letter.key, letter.payload, letter.attempts) == (ref.id, "k", b"poison", 1)
    assert letter.error == "RuntimeError: cannot"
    again = await queue.requeue(ref.id)
    assert again.id == ref.id
    assert again.seq > ref.seq
    assert await queue.dead_letters() == []
    with pytest.raises(coord.JobNotFound):
        await queue.requeue(ref.id)
    with anyio.fail_after(10):
        assert (await take(queue))[:3] == (b"poison", "k", 0)


async def test_claim_lost_with_the_session_comes_back_and_the_zombie_ack_is_refused(
    clients: list[coord.Client],
) -> None:
    a, b, _, _ = clients
    await a.queue("lost").put(b"job", key="k")
    cancelled = False
    with anyio.fail_after(15):
        with pytest.raises(coord.ClaimLost):
            async with a.queue("lost").claim() as job:
                try:
                    await expire_session(a)
                    await anyio.sleep_forever()
                except anyio.get_cancelled_exc_class():
                    cancelled = True
                    raise
        assert cancelled
        assert job.lost
        payload, key, attempt, fence = await take(b.queue("lost"))
    assert (payload, key, attempt) == (b"job", "k", 1)  # the lost claim was an attempt
    assert fence > job.fence


async def test_a_worker_waiting_for_a_job_waits_on_across_a_lost_session(
    clients: list[coord.Client],
) -> None:
    """A worker waits for a job on an empty queue (its client's looker watches the
    queue as one of the idle lookers) when the session is lost: the looker goes on with
    the next session, and the worker gets the job put afterwards. (Its watch of the
    queue, on the lost session, ends with SessionExpiredError: that is the news to start
    over on, not the worker's failure.)"""
    a, b, _, _ = clients
    got: list[bytes] = []

    async def worker() -> None:
        async with a.queue("idle-lost").claim() as job:
            got.append(job.payload)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker)
            await wait_for_waiters(a, "idle-lost/_idle", 1)  # the looker watches
            await anyio.sleep(0.2)
            await expire_session(a)
            await b.queue("idle-lost").put(b"after")
    assert got == [b"after"]


async def test_a_job_whose_worker_is_lost_every_time_is_parked(
    clients: list[coord.Client],
) -> None:
    """A poison pill: the worker dies on it every time (here: its session is lost), so
    no nack ever comes. Each lost claim still counts as an attempt, and after
    max_attempts the job is parked instead of going round forever."""
    a, b, _, _ = clients
    await a.queue("pill").put(b"pill", key="k")
    with anyio.fail_after(20):
        for expected in range(2):
            with pytest.raises(coord.ClaimLost):
                async with a.queue("pill", max_attempts=3).claim() as job:
                    assert job.attempt == expected
                    await expire_session(a)
        with pytest.raises(coord.ClaimLost):
            async with b.queue("pill", max_attempts=3).claim() as job:
                assert job.attempt == 2
                await expire_session(b)
                await anyio.sleep_forever()
    stats = await a.queue("pill").stats()
    with anyio.fail_after(10):
        while stats.parked == 0:
            with anyio.move_on_after(0.3):
                async with a.queue("pill", max_attempts=3).claim() as job:
                    pytest.fail(f"a job that lost its worker 3 times was handed out: {job}")
            stats = await a.queue("pill").stats()
    assert stats.keys["k"] == coord.KeyStats(depth=1, in_flight=0, parked=1)


async def test_a_cancelled_body_counts_no_attempt_ever(clients: list[coord.Client]) -> None:
    a, _, _, _ = clients
    queue = a.queue("calm", max_attempts=1)
    await queue.put(b"x")
    for _ in range(3):
        with anyio.move_on_after(0.2):
            async with queue.claim() as job:
                await anyio.sleep_forever()
    with anyio.fail_after(10):
        async with queue.claim() as job:
            assert job.attempt == 0


async def test_loss_without_a_checkpoint_still_refuses_the_ack(clients: list[coord.Client]) -> None:
    """A worker that learns nothing (no checkpoint after its claim was lost and taken
    over) must not ack the job someone else now holds."""
    a, b, _, _ = clients
    await a.queue("zombie").put(b"job")
    with anyio.fail_after(15):
        with pytest.raises(coord.ClaimLost) as lost:
            async with a.queue("zombie").claim() as job:
                await expire_session(a)
        # Refused by the store, or never sent (the loss was seen first): not done.
        assert (lost.value.outcome, lost.value.job_id) == ("not done", job.id)
        async with b.queue("zombie").claim() as again:
            assert again.payload == b"job"
    assert (await a.queue("zombie").stats()).depth == 0


async def test_a_lost_claim_says_what_was_not_done_and_what_may_have_been(
    clients: list[coord.Client],
) -> None:
    """A body that ran to its end before the loss was seen: its ack was not written, but
    its work may be done (it said "the claim was lost", as for a body cut short)."""
    a, _, _, _ = clients
    await a.queue("said").put(b"one")
    with anyio.fail_after(15):
        with pytest.raises(coord.ClaimLost) as finished:
            async with a.queue("said").claim() as job:
                with anyio.CancelScope(shield=True):  # the body runs to its end
                    await expire_session(a)
                    await job.wait_lost()
        assert finished.value.outcome == "not done"
        assert "the ack was not written, though the body ran to its end" in str(finished.value)
        assert "its work may be done" in str(finished.value)
        with pytest.raises(coord.ClaimLost) as cut:
            async with a.queue("said").claim() as job:
                await expire_session(a)
                await anyio.sleep_forever()  # cancelled by the loss
        assert cut.value.outcome == "not done"
        assert "its body was cancelled, nothing was acked" in str(cut.value)


async def test_cancelled_claim_claims_nothing(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    with anyio.move_on_after(0.3):
        async with a.queue("cancel").claim():
            pytest.fail("claimed from an empty queue")
    await b.queue("cancel").put(b"x")
    with anyio.fail_after(10):
        assert (await take(b.queue("cancel")))[0] == b"x"
    assert await claims_of(a, "cancel") == []


async def test_cancelled_body_releases_the_job_without_counting_an_attempt(
    clients: list[coord.Client],
) -> None:
    a, b, _, _ = clients
    await a.queue("outer").put(b"x")
    with anyio.move_on_after(0.5):
        async with b.queue("outer").claim() as job:
            await anyio.sleep_forever()
    assert job.payload == b"x"
    with anyio.fail_after(10):
        assert (await take(a.queue("outer")))[:3] == (b"x", None, 0)


async def test_bad_input_is_refused_with_nothing_written(clients: list[coord.Client]) -> None:
    queue = clients[0].queue("bad")
    with pytest.raises(TypeError):
        await queue.put("text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await queue.put(b"x", key=7)  # type: ignore[arg-type]
    for key in ("", "a\nb", "k" * 300):
        with pytest.raises(coord.ConfigurationError):
            await queue.put(b"x", key=key)
    limit = clients[0].backend.max_value_size
    with pytest.raises(coord.ConfigurationError, match="at most"):
        await queue.put(b"x" * limit)
    assert (await queue.stats()).depth == 0
    for options in ({"max_attempts": 0}, {"on_exhausted": "drop"}, {"retry_delay": -1}):
        with pytest.raises(coord.ConfigurationError):
            clients[0].queue("bad", **options)
    with pytest.raises(coord.ConfigurationError):
        clients[0].queue("bad/")


async def test_the_largest_payload_goes_through_claim_and_retry(
    clients: list[coord.Client],
) -> None:
    """A payload at the limit must survive every rewrite of its header (claim, nack):
    it must never become a job no store request can carry."""
    a, _, _, _ = clients
    queue = a.queue("big", retry_delay=0)
    size = a.backend.max_value_size - 10_000
    await queue.put(b"\xab" * size, key="k" * 256)
    with anyio.fail_after(20):
        with pytest.raises(ValueError, match="xxx"):
            async with queue.claim() as job:
                raise ValueError("x" * 5000)
        async with queue.claim() as job:
            assert len(job.payload) == size
            assert job.attempt == 1


async def test_a_looker_with_nobody_waiting_holds_no_job(clients: list[coord.Client]) -> None:
    """A looker keeps the jobs it read (their payloads) only while workers wait: once
    they are served, nothing (before, the payloads of up to 4,096 jobs stayed)."""
    from coord._jobs.looker import looker_for

    a, _, _, _ = clients
    queue = a.queue("held")
    for n in range(20):
        await queue.put(b"x" * 1000 + b"%d" % n)
    for _ in range(20):
        await take(queue)
    looker = looker_for(a._source, "held")
    with anyio.fail_after(5):
        while looker._running:  # noqa: ASYNC110 (its task ends once nobody waits)
            await anyio.sleep(0.01)
    assert looker._stock._decoded == {}
    assert looker._stock.picks == []


def _lost_places(caplog: pytest.LogCaptureFixture) -> list[Any]:
    return [r for r in caplog.records if "_idle" in (m := r.getMessage()) and " lost " in m]


async def test_a_lookers_idle_place_lost_at_its_release_warns_nobody(
    clients: list[coord.Client], caplog: pytest.LogCaptureFixture
) -> None:
    """A looker's place among a queue's idle lookers is coord's own (a closing client's
    revoke takes it before the looker leaves): its loss at the release is no WARNING
    of a user's lock being lost (it was logged as one, at every such close)."""
    from coord._core.keys import internal_name, prefix_of

    a, b = clients[0], clients[1]
    idle = internal_name("quiet", "_idle")
    with caplog.at_level("DEBUG", logger="coord"), anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: a.queue("quiet").claim().__aenter__())
            await wait_for_waiters(b, idle, 1)  # the looker holds its place
            [place] = (await b.backend.entries(prefix_of(idle))).entries
            assert await b.backend.delete(place)  # gone behind the looker's back
            tg.cancel_scope.cancel()  # the worker stops waiting: the looker leaves
        for _ in range(100):  # (the looker leaves in its own task)
            if _lost_places(caplog):
                break
            await anyio.sleep(0.02)
    told = _lost_places(caplog)
    assert told, "the looker's release was not seen"
    assert [r.levelname for r in told] == ["DEBUG"] * len(told), told
