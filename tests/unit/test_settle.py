"""How a claim's ending is told when the store's answer is not "done"."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

import coord
from coord.testing.pytest_plugin import fresh_namespace

if TYPE_CHECKING:
    from coord.abc import Op

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
