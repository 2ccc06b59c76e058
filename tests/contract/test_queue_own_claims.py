"""A worker that comes back for a job while the looker's stock holds one claims it in its
own task (``Looker._claim_own``), beside the looker's claims and reads. Those claims keep
the queue's promises: a key's next job is not claimed while its previous one is being
claimed by a worker of the same client (a read made meanwhile shows that one unclaimed),
and a worker cancelled while it claims leaves no job claimed."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import coord
from coord.abc import Create, Update

from .test_queue import claims_of

pytestmark = pytest.mark.anyio


class Gate:
    """Holds back the claim transaction of one job (an Update of its stored key) until
    opened; every other transaction goes through."""

    def __init__(self, backend: Any) -> None:
        self.key: str | None = None
        self.held = anyio.Event()
        self.open = anyio.Event()
        self._transact = backend.transact
        backend.transact = self

    async def __call__(self, ops: Any) -> Any:
        if self.key is not None and any(
            isinstance(op, Update) and op.entry.key == self.key for op in ops
        ):
            self.held.set()
            await self.open.wait()
        return await self._transact(ops)


async def test_a_keys_next_job_waits_while_a_worker_claims_its_previous_one(
    clients: list[coord.Client],
) -> None:
    """Jobs x, k1, k2 (k1 and k2 of key "k"). Worker A is handed x by the looker, which
    keeps k1 in stock; A acks. Worker B claims k1 in its own task, held back before the
    store sees it. Worker C finds the stock empty, so the looker reads: k1 unclaimed (its
    claim is held back) and k2. C must not get k2 while k1 is not acked."""
    client = clients[0]
    queue = client.queue("own-order")
    await queue.put(b"x")
    await queue.put(b"k1", key="k")
    await queue.put(b"k2", key="k")
    gate = Gate(client.backend)
    async with queue.claim() as job:
        assert job.payload == b"x"
    entries = (await client.backend.entries("own-order/_jobs/")).entries
    gate.key = entries[0].key  # k1's stored key: the oldest left
    order: list[str] = []
    b_has_k1, b_may_ack = anyio.Event(), anyio.Event()

    async def worker_b() -> None:
        async with queue.claim() as job:
            order.append(f"B got {job.payload.decode()}")
            b_has_k1.set()
            await b_may_ack.wait()
            order.append(f"B acks {job.payload.decode()}")

    async def worker_c() -> None:
        async with queue.claim() as job:
            order.append(f"C got {job.payload.decode()}")

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker_b)
            await gate.held.wait()  # B's claim of k1 is on its way, not yet made
            tg.start_soon(worker_c)
            await anyio.sleep(0.3)  # C's looker reads meanwhile, and must not take k2
            gate.open.set()
            await b_has_k1.wait()
            await anyio.sleep(0.3)
            b_may_ack.set()
    assert order == ["B got k1", "B acks k1", "C got k2"]


async def test_a_worker_cancelled_while_claiming_from_the_stock_leaves_no_claim(
    clients: list[coord.Client],
) -> None:
    """Worker B's own claim of a stocked job is cancelled while the store has not yet
    answered: the cancellation returns at once, the job is claimed by nobody once the
    dust settles, and the next worker gets it."""
    client = clients[0]
    queue = client.queue("own-cancel")
    await queue.put(b"a")
    await queue.put(b"b")
    gate = Gate(client.backend)
    async with queue.claim() as job:  # the looker reads a and b, hands a, keeps b
        assert job.payload == b"a"
    gate.key = (await client.backend.entries("own-cancel/_jobs/")).entries[0].key
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:

            async def worker_b() -> None:
                async with queue.claim():
                    pytest.fail("the cancelled worker got a job")

            tg.start_soon(worker_b)
            await gate.held.wait()
            tg.cancel_scope.cancel()
            cancelled_at = anyio.current_time()
        # At once, although the store has not answered: what the claim made is given
        # back when the answer comes (it waited up to the TTL, 5 s, for the answer).
        assert anyio.current_time() - cancelled_at < 1.0
        gate.open.set()
        gate.key = None
        async with queue.claim() as job:
            assert job.payload == b"b"
            assert len(await claims_of(client, "own-cancel")) == 1


class LostReply:
    """Applies the first claim transaction (the job's Update beside the claim's Create)
    and loses its reply, as a connection that drops before the answer comes does."""

    def __init__(self, backend: Any) -> None:
        self.lost = 0
        self._transact = backend.transact
        backend.transact = self

    async def __call__(self, ops: Any) -> Any:
        result = await self._transact(ops)
        claim = any(isinstance(op, Update) for op in ops) and any(
            isinstance(op, Create) for op in ops
        )
        if claim and result is not None and not self.lost:
            self.lost += 1
            raise coord.BackendUnavailable("the reply was lost")
        return result


async def test_a_claim_whose_reply_was_lost_counts_no_attempt(
    clients: list[coord.Client],
) -> None:
    """A claim applied by the store whose answer was lost (outcome unknown) is given back
    as it was: nobody worked on the job, so no attempt counts. Counted, it would be a
    "lost worker" attempt: with ``max_attempts=1`` the job is parked without ever being
    handed to a worker."""
    client = clients[0]
    queue = client.queue("lost-reply", max_attempts=1)
    await queue.put(b"x")
    gate = LostReply(client.backend)
    with anyio.fail_after(10):
        async with queue.claim() as job:
            assert job.payload == b"x"
            assert job.attempt == 0
    assert gate.lost == 1
    assert await claims_of(client, "lost-reply") == []
    assert (await client.backend.entries("lost-reply/_jobs/")).entries == ()
