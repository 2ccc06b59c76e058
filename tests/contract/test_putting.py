"""What a put tells its producer (issue 17, item 1): done, not done, or unknown, and
puts that can be repeated safely (``job_id``), on every store."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import anyio
import pytest

import coord
from coord.abc import Create
from coord.testing import expire_session

from ._closing import told_across_a_close
from .test_queue import take

pytestmark = pytest.mark.anyio


async def test_a_put_repeating_a_job_id_queues_nothing_more(clients: list[coord.Client]) -> None:
    """Queued, in flight, or acked within the window: the repeated put returns the job
    (from any client) and queues nothing."""
    a, b, _, _ = clients
    queue = a.queue("idem")
    first = await queue.put(b"one", key="k", job_id="order 42 / email")
    assert (first.id, first.key) == ("order 42 / email", "k")
    again = await b.queue("idem").put(b"one", key="k", job_id="order 42 / email")
    assert (again.id, again.key, again.seq) == (first.id, first.key, first.seq)
    assert (await queue.stats()).depth == 1
    with anyio.fail_after(10):
        async with b.queue("idem").claim() as job:  # in flight
            assert job.id == first.id
            assert (await queue.put(b"one", job_id=first.id)).id == first.id
    assert (await queue.put(b"one", key="k", job_id=first.id)).id == first.id  # acked
    assert (await queue.stats()).depth == 0
    await queue.put(b"two", job_id="order 43")
    assert (await queue.stats()).depth == 1


@pytest.mark.real_clock
async def test_after_the_dedupe_window_a_job_id_queues_again(clients: list[coord.Client]) -> None:
    a, _, _, _ = clients
    queue = a.queue("window", dedupe_window=0.3)
    await queue.put(b"x", job_id="j")
    await take(queue)
    await anyio.sleep(0.4)
    await queue.put(b"x", job_id="j")
    assert (await queue.stats()).depth == 1
    await take(queue)
    await anyio.sleep(0.4)
    await queue.put(b"y", job_id="other")  # collects the expired marker of "j"
    ids = await a.backend.entries("window/_ids/")
    assert len(ids.entries) == 1


async def test_a_put_whose_answer_is_lost_is_unknown_and_stays_queued(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request is applied and its answer lost: the put says the outcome is unknown,
    with the job's id, and deletes nothing behind the caller's back (it used to delete
    the job and say "not queued", while a worker might have run it). Repeated with its
    job_id, it queues nothing more."""
    a, _, _, _ = clients
    backend = a.backend
    queue = a.queue("unknown")

    def answer_lost(call: Any) -> Any:
        async def lost(*args: Any, **kwargs: Any) -> Any:
            await call(*args, **kwargs)
            raise coord.BackendUnavailable("the reply was lost (test)")

        return lost

    for job_id in (None, "idem-1"):
        with monkeypatch.context() as patch:
            patch.setattr(backend, "transact", answer_lost(backend.transact))
            with pytest.raises(coord.OutcomeUnknown) as unknown:
                await queue.put(b"x", job_id=job_id)
        assert unknown.value.operation == "put"
        assert unknown.value.outcome == "unknown"
        assert job_id is None or unknown.value.job_id == job_id
    assert (await queue.stats()).depth == 2
    assert (await queue.put(b"x", job_id="idem-1")).id == "idem-1"
    assert (await queue.stats()).depth == 2


async def test_a_repeatable_put_that_could_not_read_says_not_done(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put with a job_id first reads whether its id is known: when that read fails,
    nothing was sent, and the put says so with BackendUnavailable (not OutcomeUnknown),
    as the README promises; nothing is queued."""
    a, _, _, _ = clients
    queue = a.queue("unread")

    async def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise coord.BackendUnavailable("no answer (test)")

    monkeypatch.setattr(a.backend, "find", unavailable)
    with pytest.raises(coord.BackendUnavailable) as raised:
        await queue.put(b"x", job_id="order-1")
    assert not isinstance(raised.value, coord.OutcomeUnknown)
    monkeypatch.undo()
    assert (await queue.stats()).depth == 0


@pytest.mark.parametrize("job_id", [None, "order-7"])
async def test_a_cancelled_put_is_withdrawn_across_a_session_loss(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch, job_id: str | None
) -> None:
    """The put's request reaches the store, the caller is cancelled before the answer,
    and the session is lost before the answer: the job is withdrawn all the same, by a
    task of the client (it used to stay queued: its clean-up needed the session; a
    repeatable put's was never undone when the session went with its request)."""
    a, _, _, _ = clients
    queue = a.queue("cancelled")
    applied, answer = anyio.Event(), anyio.Event()
    method = "transact"
    call = a.backend.transact

    async def slow(ops: Any) -> Any:
        result = await call(ops)
        if any(isinstance(op, Create) and op.prefix.endswith("/_jobs/") for op in ops):
            applied.set()
            await answer.wait()  # the answer never comes
        return result

    monkeypatch.setattr(a.backend, method, slow)
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(queue.put, b"x", job_id=job_id))
            await applied.wait()
            assert (await queue.stats()).depth == 1
            tg.cancel_scope.cancel()
        await expire_session(a)
        monkeypatch.setattr(a.backend, method, call)
        while (await queue.stats()).depth:  # noqa: ASYNC110  (the withdrawal is in the background)
            await anyio.sleep(0.05)


async def test_a_cancelled_put_whose_job_a_worker_took_runs(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker claimed the job before the cancelled put's answer came: it is not
    withdrawn under the worker (whose ack would be refused), it runs, and a WARNING says
    so with its id."""
    a, b, _, _ = clients
    queue = a.queue("taken")
    applied, answer = anyio.Event(), anyio.Event()
    transact = a.backend.transact

    async def slow(ops: Any) -> Any:
        made = await transact(ops)
        if any(isinstance(op, Create) and op.prefix.endswith("/_jobs/") for op in ops):
            applied.set()
            await answer.wait()
        return made

    monkeypatch.setattr(a.backend, "transact", slow)
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            producer = anyio.CancelScope()

            async def put() -> None:
                with producer:
                    await queue.put(b"x")

            tg.start_soon(put)
            await applied.wait()
            async with b.queue("taken").claim() as job:
                producer.cancel()
                answer.set()
                while "before it could be withdrawn" not in caplog.text:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
        assert job.payload == b"x"
    assert (await queue.stats()).depth == 0
    assert any(r.levelno == logging.WARNING and job.id in r.getMessage() for r in caplog.records)


async def _answer_later(answer: anyio.Event) -> None:
    """Let a held answer go 0.3 s from now, as a reply delayed in the network comes."""
    await anyio.sleep(0.3)
    answer.set()


@pytest.mark.parametrize("repeater", ["another client", "another queue object"])
async def test_a_repeat_from_elsewhere_keeps_the_job_of_a_cancelled_put(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch, repeater: str
) -> None:
    """Issue 36, item 1: a put with a job_id is cancelled while its request is in flight
    (applied, the answer held back); a put of the same id from another client, or from
    the same client through another Queue object, finds the job and returns it (that
    one once the first answer came: a client's puts of one id are made one after
    another). The cancelled put's withdrawal must then be refused (it used to delete the
    job the repeat said was queued: the job was lost)."""
    a, b, _, _ = clients
    queue = a.queue("takeover")
    applied, answer = anyio.Event(), anyio.Event()
    transact = a.backend.transact

    async def slow(ops: Any) -> Any:
        made = await transact(ops)
        if any(isinstance(op, Create) and op.prefix.endswith("/_jobs/") for op in ops):
            applied.set()
            await answer.wait()
        return made

    monkeypatch.setattr(a.backend, "transact", slow)
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(queue.put, b"x", job_id="once"))
            await applied.wait()
            tg.cancel_scope.cancel()
        other = (b if repeater == "another client" else a).queue("takeover")
        async with anyio.create_task_group() as tg:
            tg.start_soon(_answer_later, answer)
            repeat = await other.put(b"x", job_id="once")
        assert repeat.id == "once"
        await anyio.sleep(0.5)  # the first put's withdrawal has had its chance
        assert (await queue.stats()).depth == 1
        async with b.queue("takeover").claim() as job:
            assert job.id == "once"


async def test_concurrent_repeats_through_two_queue_objects_queue_once(
    clients: list[coord.Client],
) -> None:
    """Issue 36, item 3: one client puts each id at once through two Queue objects of
    one name: each id is queued once (on ZooKeeper it was queued twice: the order of a
    client's puts of one id was kept per Queue object, not per client and name)."""
    a, _, _, _ = clients
    queues = [a.queue("twice"), a.queue("twice")]
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            for n in range(10):
                for queue in queues:
                    tg.start_soon(partial(queue.put, b"x", job_id=f"id-{n}"))
        assert (await queues[0].stats()).depth == 10


async def test_a_client_closed_while_a_repeatable_put_is_out_tells_it_done(
    clients: list[coord.Client], coord_url: str
) -> None:
    """A client closed while the transaction of a put with a ``job_id`` is out (applied,
    its answer slow): the close waits for that answer (up to the TTL), as it does for
    the combined puts of fresh jobs, and the put is told done, not OutcomeUnknown."""
    told = await told_across_a_close(
        coord_url,
        lambda b: b.queue("repeat-close").put(b"x", job_id="r-1"),
        lambda ops: any(isinstance(op, Create) for op in ops),
    )
    assert getattr(told, "id", told) == "r-1"
    assert (await clients[0].queue("repeat-close").stats()).depth == 1
