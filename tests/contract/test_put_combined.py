"""Puts of fresh jobs that one client makes at once go to the store in one transaction
(coord._jobs.combine), and each put is still told its own outcome: its JobRef (done),
OutcomeUnknown naming its job (unknown), or its cancellation, after which its job is
not left queued. The other puts of its transaction are not affected."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import coord
from coord._jobs import combine
from coord.abc import Create, Remove

from .test_put_many import stored_ids

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Sequence

    from coord.abc import Op

pytestmark = pytest.mark.anyio


class Held:
    """Wraps a backend's transact: records the jobs each transaction creates, and holds
    back the answer of each such transaction (its request applied) until its gate is
    opened (``gate(k)`` for the k-th), then raising if *lose* is set."""

    def __init__(self, backend: Any, *, lose: bool = False) -> None:
        self.sizes: list[int] = []
        self._gates: dict[int, anyio.Event] = {}
        self._arrived: dict[int, anyio.Event] = {}
        self._lose = lose
        self._transact = backend.transact
        backend.transact = self

    def gate(self, k: int) -> anyio.Event:
        return self._gates.setdefault(k, anyio.Event())

    def arrived(self, k: int) -> anyio.Event:
        return self._arrived.setdefault(k, anyio.Event())

    async def __call__(self, ops: Sequence[object]) -> Any:
        jobs = sum(isinstance(op, Create) and op.prefix.endswith("/_jobs/") for op in ops)
        result = await self._transact(ops)
        if jobs:
            k = len(self.sizes)
            self.sizes.append(jobs)
            self.arrived(k).set()
            await self.gate(k).wait()
            if self._lose:
                raise coord.BackendUnavailable("the answer was lost (test)")
        return result


def _held_puts(
    client: coord.Client, name: str
) -> tuple[Held, dict[int, coord.JobRef], Callable[[int], Coroutine[Any, Any, None]]]:
    """*client*'s transactions held (:class:`Held`), the JobRef of each put by number,
    and ``put(n)``, which puts job *n* to the queue *name*."""
    queue = client.queue(name)
    held = Held(client.backend)
    refs: dict[int, coord.JobRef] = {}

    async def put(n: int) -> None:
        refs[n] = await queue.put(b"%d" % n)

    return held, refs, put


async def test_puts_made_at_once_share_transactions_in_put_order(
    clients: list[coord.Client],
) -> None:
    """A transaction of puts is out (held); ten more puts come meanwhile: they wait for
    its answer and go in one transaction, not ten (nor one alone and nine after it),
    each put told its own JobRef, and the queue's order is the order of the puts."""
    a = clients[0]
    held, refs, put = _held_puts(a, "combined")
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(put, 0)
            await held.arrived(0).wait()
            for n in range(1, 11):
                tg.start_soon(put, n)
                await anyio.lowlevel.checkpoint()  # in order
            await anyio.sleep(0.1)
            assert held.sizes == [1]  # no second transaction with a batch not full
            for k in range(2):
                held.gate(k).set()
    assert held.sizes == [1, 10]
    assert len({r.id for r in refs.values()}) == 11
    assert await stored_ids(a, "combined") == [refs[n].id for n in range(11)]
    assert [refs[n].seq for n in range(11)] == sorted(refs[n].seq for n in range(11))


async def test_a_full_batch_goes_while_another_transaction_is_out(
    clients: list[coord.Client],
) -> None:
    """With one transaction of puts out (held), a full batch of puts that come meanwhile
    goes at once, as a second transaction (IN_FLIGHT); the puts after it wait for an
    answer. All are queued in put order."""
    a = clients[0]
    held, refs, put = _held_puts(a, "combined-full")
    full = combine.BATCH_JOBS
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(put, 0)
            await held.arrived(0).wait()
            for n in range(1, full + 3):
                tg.start_soon(put, n)
                await anyio.lowlevel.checkpoint()  # in order
            await held.arrived(1).wait()  # the full batch, while the first is out
            await anyio.sleep(0.1)
            assert held.sizes == [1, full]
            for k in range(3):
                held.gate(k).set()
    assert held.sizes == [1, full, 2]
    assert await stored_ids(a, "combined-full") == [refs[n].id for n in range(full + 3)]


class _Slow:
    """Wraps a backend's transact: each transaction of puts takes a round trip (10 ms),
    and its number of jobs is recorded."""

    def __init__(self, backend: Any) -> None:
        self.sizes: list[int] = []
        self._transact = backend.transact
        backend.transact = self

    async def __call__(self, ops: Sequence[Op]) -> Any:
        jobs = sum(isinstance(op, Create) and op.prefix.endswith("/_jobs/") for op in ops)
        if jobs:
            self.sizes.append(jobs)
            await anyio.sleep(0.01)
        return await self._transact(ops)


async def test_eight_putters_put_eight_jobs_a_transaction(clients: list[coord.Client]) -> None:
    """Eight tasks putting in a loop: after the first answers, each transaction carries
    the eight puts made after the last answer. The putters woken by an answer put again
    before the next transaction goes (on trio too, which runs tasks woken at once in a
    random order); sent at once, the first of them went alone and the other seven with
    the next answer."""
    a = clients[0]
    queue = a.queue("combined-eight")
    slow = _Slow(a.backend)

    async def putter(n: int) -> None:
        for k in range(10):
            await queue.put(b"%d-%d" % (n, k))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for n in range(8):
                tg.start_soon(putter, n)
    assert sum(slow.sizes) == 80
    assert slow.sizes[2:-2] == [8] * (len(slow.sizes) - 4), slow.sizes


async def test_a_put_cancelled_in_a_shared_transaction_is_withdrawn_alone(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three puts in one transaction (held, one out at a time); the middle one is
    cancelled before the answer: the other two are told done and stay queued; its job
    is withdrawn."""
    monkeypatch.setattr(combine, "IN_FLIGHT", 1)
    a = clients[0]
    queue = a.queue("combined-cancel")
    held = Held(a.backend)
    refs: dict[int, coord.JobRef] = {}
    scopes = [anyio.CancelScope() for _ in range(4)]

    async def put(n: int) -> None:
        with scopes[n]:
            refs[n] = await queue.put(b"%d" % n)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(put, 0)
            await held.arrived(0).wait()
            for n in (1, 2, 3):
                tg.start_soon(put, n)
                await anyio.lowlevel.checkpoint()
            held.gate(0).set()
            await held.arrived(1).wait()
            assert held.sizes == [1, 3]
            scopes[2].cancel()
            await anyio.sleep(0.1)
            held.gate(1).set()
        assert sorted(refs) == [0, 1, 3]
        while len(await stored_ids(a, "combined-cancel")) != 3:  # noqa: ASYNC110  (withdrawn in the background)
            await anyio.sleep(0.05)
    assert await stored_ids(a, "combined-cancel") == [refs[n].id for n in (0, 1, 3)]


async def test_a_lost_answer_tells_each_put_of_the_transaction_unknown(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answers of a transaction of one put and then of three are lost: each put is
    told OutcomeUnknown naming its own job, and the jobs (applied) stay queued: nothing
    is deleted behind the callers' backs."""
    monkeypatch.setattr(combine, "IN_FLIGHT", 1)
    a = clients[0]
    queue = a.queue("combined-lost")
    held = Held(a.backend, lose=True)
    told: dict[int, BaseException] = {}

    async def put(n: int) -> None:
        try:
            await queue.put(b"%d" % n)
        except coord.OutcomeUnknown as exc:
            told[n] = exc

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(put, 0)
            await held.arrived(0).wait()
            for n in (1, 2, 3):
                tg.start_soon(put, n)
                await anyio.lowlevel.checkpoint()  # in order
            await anyio.sleep(0.1)
            held.gate(0).set()
            await held.arrived(1).wait()
            held.gate(1).set()
    assert held.sizes == [1, 3]
    ids = [getattr(told[n], "job_id", None) for n in range(4)]
    assert len(set(ids)) == 4
    assert all(getattr(told[n], "operation", None) == "put" for n in range(4))
    assert await stored_ids(a, "combined-lost") == ids


async def test_a_client_closed_while_puts_are_out_tells_them_done(
    clients: list[coord.Client], coord_url: str
) -> None:
    """A client closed while a transaction of its puts is out (applied, its answer held
    back) waits for that answer (up to the TTL) before it stops its tasks: each put is
    told done, not OutcomeUnknown, and its job is queued."""
    refs: list[coord.JobRef] = []
    told: list[BaseException] = []
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            async with coord.connect(coord_url, ttl=5.0) as b:
                held = Held(b.backend)

                async def put(n: int) -> None:
                    try:
                        refs.append(await b.queue("combined-close").put(b"%d" % n))
                    except coord.CoordError as exc:
                        told.append(exc)

                tg.start_soon(put, 0)
                await held.arrived(0).wait()

                async def answer_later() -> None:
                    await anyio.sleep(0.3)  # while the client closes
                    held.gate(0).set()

                tg.start_soon(answer_later)
            # b is closed here
    assert told == []
    assert await stored_ids(clients[0], "combined-close") == [ref.id for ref in refs]
    assert len(refs) == 1


async def test_an_ack_made_while_the_close_waits_for_puts_out_lands(
    clients: list[coord.Client], coord_url: str
) -> None:
    """A client closed while a transaction of its puts is out (held): a job that its
    worker acks while the close waits for that put (the session's drain had nothing to
    wait for then) is acked before the lease is revoked, not refused by the revoke and
    run again as a lost attempt."""
    a = clients[0]
    await a.queue("combined-ack").put(b"job")
    claimed = anyio.Event()
    told: list[str] = []

    async def work(client: coord.Client) -> None:
        try:
            async with client.queue("combined-ack").claim():
                claimed.set()
                await anyio.sleep(0.1)  # ends while the client closes: its ack is sent
        except coord.ClaimLost as exc:
            told.append(exc.outcome)
        else:
            told.append("done")

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            async with coord.connect(coord_url, ttl=5.0) as b:
                held = Held(b.backend)
                transact = b.backend.transact

                async def slow_ack(ops: Sequence[Op]) -> Any:
                    if ops and all(isinstance(op, Remove) for op in ops):
                        await anyio.sleep(0.4)  # the put is answered meanwhile
                    return await transact(ops)

                b.backend.transact = slow_ack  # type: ignore[method-assign]

                async def put() -> None:
                    with contextlib.suppress(coord.CoordError):
                        await b.queue("combined-close-ack").put(b"x")

                tg.start_soon(work, b)
                await claimed.wait()
                tg.start_soon(put)
                await held.arrived(0).wait()

                async def answer_later() -> None:
                    await anyio.sleep(0.3)  # after the ack was sent, before its answer
                    held.gate(0).set()

                tg.start_soon(answer_later)
            # b is closed here
    assert told == ["done"]
    stats = await a.queue("combined-ack").stats()
    assert (stats.depth, stats.dead) == (0, 0)


async def test_a_put_cancelled_as_its_client_closes_has_its_job_withdrawn(
    clients: list[coord.Client], coord_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A put cancelled while its transaction is out (held), as its client closes (the
    task group around both cancelled): the close waits for that answer, and the job it
    made is withdrawn before the client's tasks stop, not left queued."""
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            async with coord.connect(coord_url, ttl=5.0) as b:
                held = Held(b.backend)

                async def put() -> None:
                    await b.queue("combined-cancel-close").put(b"x")

                tg.start_soon(put)
                await held.arrived(0).wait()

                async def answer_later() -> None:
                    await anyio.sleep(0.3)  # while the client closes
                    held.gate(0).set()

                b._keeper.spawn(answer_later)  # (the client's task: not cancelled below)
                tg.cancel_scope.cancel()
            # b is closed here
    assert await stored_ids(clients[0], "combined-cancel-close") == []


async def test_a_withdrawal_cut_short_by_the_close_warns_and_is_bounded(
    clients: list[coord.Client], coord_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A cancelled put's withdrawal that cannot reach the store (its reads fail) while
    its client closes: the close waits for it up to the TTL only, then stops it, and a
    WARNING says that the job may stay queued (it was silent)."""
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            async with coord.connect(coord_url, ttl=2.0) as b:
                held = Held(b.backend)

                async def down(*args: object) -> Any:
                    raise coord.BackendUnavailable("down (test)")

                async def put() -> None:
                    await b.queue("combined-withdraw-down").put(b"x")

                tg.start_soon(put)
                await held.arrived(0).wait()
                b.backend.find = down  # type: ignore[method-assign,assignment]
                held.gate(0).set()
                tg.cancel_scope.cancel()
                start = anyio.current_time()
            # b is closed here
        took = anyio.current_time() - start
    assert took < 2 * 2.0 + 1 + 1
    assert any("may stay queued" in r.getMessage() for r in caplog.records), caplog.text
