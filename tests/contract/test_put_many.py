"""``queue.put_many``, on every backend: one transaction per batch, in order, each job's
outcome told (done, not done, unknown), dedupe by ``job_id`` kept, and a cancelled
put_many leaves no job queued that its caller was not told of."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import coord
from coord._jobs import records as _records
from coord._jobs.batch import BATCH_JOBS
from coord.abc import Create

from ._closing import told_across_a_close
from .test_queue import take

pytestmark = pytest.mark.anyio


async def stored_ids(client: coord.Client, name: str) -> list[str]:
    """The ids of the queue's jobs, in the queue's order."""
    entries = (await client.backend.entries(f"{name}/_jobs/")).entries
    return [_records.decode(e)[0].id for e in entries]


def count_transactions(client: coord.Client, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of job creations of each transaction *client* sends."""
    sent: list[int] = []
    transact = client.backend.transact

    async def counted(ops: Any) -> Any:
        sent.append(sum(isinstance(op, Create) and op.prefix.endswith("/_jobs/") for op in ops))
        return await transact(ops)

    monkeypatch.setattr(client.backend, "transact", counted)
    return sent


async def test_put_many_puts_in_order_in_batches(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """150 jobs: three transactions (64, 64, 22), JobRefs in order, the queue's order
    the list's, and the jobs claimed in that order."""
    a, b, _, _ = clients
    queue = a.queue("many")
    sent = count_transactions(a, monkeypatch)
    jobs: list[coord.NewJob | bytes] = [
        coord.NewJob(b"%d" % n, key=f"k{n % 3}") if n % 2 else b"%d" % n for n in range(150)
    ]
    refs = await queue.put_many(jobs)
    assert sent == [BATCH_JOBS, BATCH_JOBS, 150 - 2 * BATCH_JOBS]
    assert [r.key for r in refs] == [f"k{n % 3}" if n % 2 else None for n in range(150)]
    assert len({r.id for r in refs}) == 150
    assert [r.seq for r in refs] == sorted(r.seq for r in refs)
    assert await stored_ids(a, "many") == [r.id for r in refs]
    worker = b.queue("many")
    assert [(await take(worker))[0] for _ in range(5)] == [b"0", b"1", b"2", b"3", b"4"]
    assert await queue.put_many([]) == []


async def test_put_many_keeps_dedupe_by_job_id(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job whose id is queued (or put within the window) queues nothing and its
    JobRef is returned; a job id repeated within the list too; order kept."""
    a, _, _, _ = clients
    queue = a.queue("dedupe")
    first = await queue.put(b"old", job_id="order-1")
    refs = await queue.put_many(
        [
            b"a",
            coord.NewJob(b"old again", job_id="order-1"),
            coord.NewJob(b"new", job_id="order-2"),
            b"b",
            coord.NewJob(b"new again", job_id="order-2"),
        ]
    )
    assert refs[1] == first
    assert refs[4] == refs[2]
    assert refs[2].id == "order-2"
    assert await stored_ids(a, "dedupe") == ["order-1", refs[0].id, "order-2", refs[3].id]


async def test_bad_input_anywhere_writes_nothing(clients: list[coord.Client]) -> None:
    a, _, _, _ = clients
    queue = a.queue("bad-many")
    too_big = b"x" * (queue.max_payload_size + 1)
    for jobs, error in [
        ([b"ok", "text"], TypeError),
        ([b"ok", coord.NewJob("text")], TypeError),  # type: ignore[arg-type]
        ([b"ok", coord.NewJob(b"x", key=7)], TypeError),  # type: ignore[arg-type]
        ([b"ok", coord.NewJob(b"x", key="")], coord.ConfigurationError),
        ([b"ok", coord.NewJob(b"x", job_id="")], coord.ConfigurationError),
        ([b"ok", coord.NewJob(too_big)], coord.ConfigurationError),
        ([*[b"ok"] * 100, coord.NewJob(b"x", delay=-1)], coord.ConfigurationError),
    ]:
        with pytest.raises(error):
            await queue.put_many(jobs)  # type: ignore[arg-type]
    assert (await queue.stats()).depth == 0


async def test_large_jobs_go_in_batches_the_store_takes(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _, _, _ = clients
    queue = a.queue("large")
    sent = count_transactions(a, monkeypatch)
    size = queue.max_payload_size
    refs = await queue.put_many([b"\xab" * size, b"\xcd" * (size // 3), b"small", b"\xab" * size])
    assert len(sent) >= 3  # no two of the largest in one request
    assert await stored_ids(a, "large") == [r.id for r in refs]


async def test_a_batch_without_an_answer_is_unknown_and_says_what_was_done(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second batch is applied and its answer lost: OutcomeUnknown names its jobs,
    ``done`` has the first batch's JobRefs, and the third batch was not sent."""
    a, _, _, _ = clients
    queue = a.queue("unknown-many")
    transact = a.backend.transact
    calls: list[int] = []

    async def second_lost(ops: Any) -> Any:
        calls.append(1)
        made = await transact(ops)
        if len(calls) == 2:
            raise coord.BackendUnavailable("the reply was lost (test)")
        return made

    monkeypatch.setattr(a.backend, "transact", second_lost)
    with pytest.raises(coord.OutcomeUnknown) as raised:
        await queue.put_many([b"%d" % n for n in range(2 * BATCH_JOBS + 5)])
    exc = raised.value
    assert exc.operation == "put_many"
    assert len(exc.done) == BATCH_JOBS
    assert len(exc.job_ids) == BATCH_JOBS
    assert len(calls) == 2
    ids = await stored_ids(a, "unknown-many")
    assert ids == [r.id for r in exc.done] + list(exc.job_ids)  # nothing deleted behind it


async def test_a_cancelled_put_many_leaves_nothing_queued(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while its second batch is in flight (applied, no answer yet): the first
    batch, the earlier repeatable job, and the batch in flight are all withdrawn."""
    a, _, _, _ = clients
    queue = a.queue("cancelled-many")
    applied, answer = anyio.Event(), anyio.Event()
    transact = a.backend.transact
    batches: list[int] = []

    async def slow(ops: Any) -> Any:
        made = await transact(ops)
        if len(ops) > 2:  # a batch (a repeatable put is two ops)
            batches.append(1)
            if len(batches) == 2:
                applied.set()
                await answer.wait()
        return made

    monkeypatch.setattr(a.backend, "transact", slow)
    jobs: list[coord.NewJob | bytes] = [coord.NewJob(b"r", job_id="rep")]
    jobs += [b"%d" % n for n in range(2 * BATCH_JOBS)]
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(queue.put_many, jobs)
            await applied.wait()
            assert (await queue.stats()).depth == 1 + 2 * BATCH_JOBS
            tg.cancel_scope.cancel()
        answer.set()
        while (await queue.stats()).depth:  # noqa: ASYNC110  (withdrawn in the background)
            await anyio.sleep(0.05)
    assert (await a.backend.entries("cancelled-many/_ids/")).entries == ()


async def test_a_batch_behind_older_jobs_keeps_its_keys_order(clients: list[coord.Client]) -> None:
    """A batch's jobs share one creation revision on etcd, and etcd cuts a sorted range
    anywhere among equals: a limited listing must still be a prefix of the queue, so that
    a key's first job is the first of that key claimed (it was a later one, at random)."""
    a, b, _, _ = clients
    queue = a.queue("ties")
    for n in range(10):
        await queue.put(b"old%d" % n)
    await queue.put_many([coord.NewJob(b"%d" % n, key="k") for n in range(64)])
    full = [e.key for e in (await a.backend.entries("ties/_jobs/")).entries]
    for limit in (16, 32, 40):
        listed = await a.backend.entries("ties/_jobs/", limit=limit, stale_ok=True)
        assert [e.key for e in listed.entries] == full[:limit]
    with anyio.fail_after(10):
        for n in range(10):  # the older jobs, acked
            assert (await take(b.queue("ties")))[0] == b"old%d" % n
        assert (await take(b.queue("ties")))[:2] == (b"0", "k")


async def test_a_limited_listing_is_a_prefix_of_the_queue_whatever_the_batches(
    clients: list[coord.Client],
) -> None:
    """Jobs put by one transaction share a store revision on etcd, and a sorted range cut
    by a limit stops anywhere among equals: ``entries(limit=k)`` is still the first *k*
    entries of the whole listing, for every *k*, whether it ends inside a batch, at its
    end, or past a lone job (on etcd, with and without the read of the last revision's
    keys whole)."""
    a = clients[0]
    queue = a.queue("prefixes")
    for size in (5, 1, 7, 1, 3):
        await queue.put_many([b"%d" % n for n in range(size)])
    backend = a.backend
    whole = [e.key for e in (await backend.entries("prefixes/_jobs/")).entries]
    assert len(whole) == 17
    for k in range(1, 19):
        for stale_ok in (False, True):
            listed = await backend.entries("prefixes/_jobs/", limit=k, stale_ok=stale_ok)
            assert [e.key for e in listed.entries] == whole[:k], (k, stale_ok)


async def test_a_long_limited_listing_is_a_prefix_of_the_queue_whatever_the_batches(
    clients: list[coord.Client],
) -> None:
    """The same past 128 entries, where etcd's listing reads a fixed room of keys more
    than wanted (not twice as many): full batches of 64 end on either side of the keys
    read, and the listing is still the first *k* entries for each *k*."""
    a = clients[0]
    queue = a.queue("long-prefixes")
    for size in (1, 64, 64, 1, 64, 64, 64, 64, 3):
        await queue.put_many([b"%d" % n for n in range(size)])
    backend = a.backend
    whole = [e.key for e in (await backend.entries("long-prefixes/_jobs/")).entries]
    assert len(whole) == 389
    for k in (129, 130, 193, 194, 195, 200, 256, 257, 258, 259, 300, 388, 389, 390):
        listed = await backend.entries("long-prefixes/_jobs/", limit=k, stale_ok=True)
        assert [e.key for e in listed.entries] == whole[:k], k


async def test_a_client_closed_while_a_batch_is_out_tells_it_done(
    clients: list[coord.Client], coord_url: str
) -> None:
    """A client closed while a put_many's transaction is out (applied, its answer slow):
    the close waits for that answer (up to the TTL), as it does for single puts, and the
    put_many returns its jobs, not OutcomeUnknown."""
    told = await told_across_a_close(
        coord_url,
        lambda b: b.queue("many-close").put_many([b"1", b"2"]),
        lambda ops: any(isinstance(op, Create) for op in ops),
    )
    assert len(told) == 2, told
    assert await stored_ids(clients[0], "many-close") == [
        ref.id for ref in told if isinstance(ref, coord.JobRef)
    ]
