"""The joint transactions of ``queue.run()`` (an ack and the claim of the worker's next
job) of one client's workers go to the store together when they come at once
(``coord._jobs.commit.Committer.transact_joint``). What must hold: each claim of a group
has a fence of its own (claims of one transaction share its revision, so each is
numbered in it), the fence ``coord status`` shows is the worker's ``job.fence``, and a
group the store refused (one member's job was claimed by another client first) is sent
again member by member, each told its own answer: every job handled once, at attempt 0."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest

from coord._core.keys import FENCE_SHIFT
from coord.abc import Create, Remove, Update
from coord.cli import _snapshot

if TYPE_CHECKING:
    from collections.abc import Sequence

    import coord
    from coord.abc import Op

pytestmark = pytest.mark.anyio

WORKERS = 4
JOBS = 24


def _claims_in(ops: Sequence[Op]) -> int:
    """How many claims a transaction makes that also ends others (a joint group)."""
    if not any(isinstance(op, Remove) for op in ops):
        return 0
    return sum(isinstance(op, Create) for op in ops)


class _Sent:
    """Wraps *client*'s backend.transact: the number of joint claims of each transaction
    sent (each sent after 20 ms); *before* runs before the first that makes more than one."""

    def __init__(self, client: coord.Client, before: Any = None) -> None:
        self.claims: list[int] = []
        self.refused: list[int] = []
        self._transact = client.backend.transact
        self._before = before
        client.backend.transact = self  # type: ignore[method-assign]

    async def __call__(self, ops: Sequence[Op]) -> Any:
        claims = _claims_in(ops)
        if claims > 1 and self._before is not None:
            before, self._before = self._before, None
            await before(ops)
        self.claims.append(claims)
        if claims:
            # A store's round trip, on memory:// too: the workers of a round that come
            # while two transactions are out wait, and go together.
            await anyio.sleep(0.02)
        result = await self._transact(ops)
        if result is None:
            self.refused.append(claims)
        return result


async def _run_in_step(
    client: coord.Client, name: str, check: Any = None
) -> list[tuple[bytes, int, int]]:
    """WORKERS workers of *client*'s ``run()`` take the queue's jobs; each waits in its
    handler until all are in theirs, then all end at once (their joint transactions
    come together). Returns (payload, attempt, fence) of each job handled."""
    handled: list[tuple[bytes, int, int]] = []
    in_body = 0
    go = anyio.Event()
    done = anyio.Event()

    async def handler(job: coord.Job) -> None:
        nonlocal in_body, go
        handled.append((job.payload, job.attempt, job.fence))
        if check is not None:
            await check(job)
        in_body += 1
        if in_body == WORKERS or len(handled) >= JOBS - 1:
            in_body = 0
            go.set()
            go = anyio.Event()
        else:
            with anyio.move_on_after(1):  # (the last few jobs may not come as a round)
                await go.wait()
        if len({payload for payload, _, _ in handled}) == JOBS:
            done.set()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: client.queue(name).run(handler, concurrency=WORKERS, signals=()))
            await done.wait()
            await anyio.sleep(0.2)  # (a job handled twice would show by now)
            tg.cancel_scope.cancel()
    return handled


async def _put(client: coord.Client, name: str) -> None:
    await client.queue(name).put_many([b"%02d" % n for n in range(JOBS)])


async def test_joint_claims_at_once_go_together_each_with_its_own_fence(
    clients: list[coord.Client],
) -> None:
    a, b, _, _ = clients
    await _put(a, "together")
    sent = _Sent(b)
    shown: list[tuple[int, int]] = []

    async def same_as_status(job: coord.Job) -> None:
        # What `coord status` shows for this job's claim is the worker's fence.
        claims = await a.backend.entries("together/_claims/")
        for entry in claims.entries:
            seen = _snapshot._claim(entry)
            if seen["job"] == job.id:
                shown.append((seen["fence"], job.fence))

    handled = await _run_in_step(b, "together", same_as_status)
    assert sorted(p for p, _, _ in handled) == [b"%02d" % n for n in range(JOBS)]
    assert {attempt for _, attempt, _ in handled} == {0}
    fences = [fence for _, _, fence in handled]
    assert len(set(fences)) == JOBS, fences  # distinct, though some share a revision
    grouped = [n for n in sent.claims if n > 1]
    assert grouped, sent.claims  # some joint transactions went together
    # Claims of one transaction: one revision, numbered 0, 1, ... in the fence.
    assert any(fence & ((1 << FENCE_SHIFT) - 1) for fence in fences), fences
    assert len(shown) == JOBS
    assert all(status == fence for status, fence in shown), shown
    stats = await a.queue("together").stats()
    assert (stats.depth, stats.in_flight) == (0, 0)


async def test_a_refused_group_is_sent_again_member_by_member(
    clients: list[coord.Client],
) -> None:
    """Another client changes the job one member of a group reaches for, just before the
    group is sent (as its claim would): the store refuses the group; each member goes
    alone, the others are done, that one's ack goes alone and is done, and every job is
    handled once, at attempt 0."""
    a, b, c, _ = clients
    await _put(a, "refused")
    changed: list[str] = []

    async def change_one(ops: Sequence[Op]) -> None:
        [*_, update] = [op for op in ops if isinstance(op, Update)]
        entry = update.entry
        assert await c.backend.transact([Update(entry, entry.value)]) is not None
        changed.append(entry.key)

    sent = _Sent(b, change_one)
    handled = await _run_in_step(b, "refused")
    assert changed
    assert sent.refused, sent.claims
    assert sent.refused[0] > 1, (sent.claims, sent.refused)  # the group, first
    assert sorted(p for p, _, _ in handled) == [b"%02d" % n for n in range(JOBS)]  # once each
    assert {attempt for _, attempt, _ in handled} == {0}
    stats = await a.queue("refused").stats()
    assert (stats.depth, stats.in_flight) == (0, 0)  # all acked, each once
