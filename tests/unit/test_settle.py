"""How a claim's ending is told when the store's answer is not "done"."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

import coord
from coord.testing import drop_key
from coord.testing.pytest_plugin import fresh_namespace

if TYPE_CHECKING:
    from coord.abc import Entry, Op

pytestmark = pytest.mark.anyio


async def test_an_ack_answered_session_expired_is_claim_lost_outcome_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ZooKeeper answers a request on a session that ended during a partition with
    SessionExpiredError; an ack that an earlier, lost reply may have applied is then of
    unknown outcome. The claim block says so with ClaimLost, never with a plain
    SessionExpiredError (seen in the fault suite: a partition as the body ends)."""
    async with coord.connect(f"memory://{fresh_namespace()}") as client:
        queue = client.queue("q")
        await queue.put(b"job")

        async def session_over(ops: list[Op]) -> None:
            raise coord.SessionExpiredError("the ZooKeeper session is over (transact)")

        with pytest.raises(coord.ClaimLost, match="outcome of the ack is unknown"):
            async with queue.claim():
                monkeypatch.setattr(client.backend, "transact", session_over)


async def test_an_ack_answered_after_the_ttl_is_unknown_and_its_answer_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The store applies the ack, but its answer comes after the TTL (etcd: a leader
    elected meanwhile; no session lost). The worker is told the outcome is unknown —
    never "refused", which would make the application redo a job that is done — and the
    answer, when it comes, is logged with the job's id (issue 17, item 2)."""
    async with coord.connect(f"memory://{fresh_namespace()}", ttl=1) as client:
        queue = client.queue("q")
        await queue.put(b"job")
        answer = anyio.Event()
        transact = client.backend.transact

        async def slow(ops: list[Op]) -> tuple[Entry | None, ...] | None:
            await answer.wait()
            return await transact(ops)

        with pytest.raises(coord.ClaimLost) as lost:
            async with queue.claim() as job:
                monkeypatch.setattr(client.backend, "transact", slow)
        assert (lost.value.outcome, lost.value.job_id) == ("unknown", job.id)
        assert "refused" not in str(lost.value)
        assert not client.session.lost
        answer.set()
        with anyio.fail_after(5):
            while f"ack of job {job.id}" not in caplog.text:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        assert "it was applied" in caplog.text
        monkeypatch.setattr(client.backend, "transact", transact)
        assert (await queue.stats()).depth == 0


async def test_a_deferred_job_whose_release_is_refused_raises_claim_lost() -> None:
    """defer() gives the job back at the block's exit; when the store refuses that (the
    claim is no longer ours), the block says so instead of returning normally."""
    async with coord.connect(f"memory://{fresh_namespace()}") as client:
        queue = client.queue("q")
        await queue.put(b"job")
        with pytest.raises(coord.ClaimLost) as lost:
            async with queue.claim() as job:
                job.defer()
                await drop_key(client, job._hold.entry.key)  # another client's doing
        assert (lost.value.outcome, lost.value.job_id) == ("not done", job.id)
