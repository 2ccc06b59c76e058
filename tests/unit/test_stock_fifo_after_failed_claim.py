"""A lone worker's claim that fails without a conflict (the store did not answer: a
BackendUnavailable, counted as a conflict by the looker) took the oldest job out of the
stock; before 31f1ddd the stock was dropped (1 conflict of 1 claim) and the head read
again, so the worker claimed that job next. Since, a first conflict cuts the stock to
the looker's own lane, which alone is every job: the younger jobs are kept and the
oldest one, still claimable, is passed over (FIFO for a lone worker broken)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import coord
from coord._core.exceptions import BackendUnavailable
from coord.abc import Create
from coord.testing.pytest_plugin import fresh_namespace

pytestmark = pytest.mark.anyio


async def test_a_lone_worker_claims_the_oldest_job_after_a_claim_the_store_did_not_answer() -> None:
    async with coord.connect(f"memory://{fresh_namespace()}") as client:
        queue = client.queue("q")
        first = await queue.put(b"first")
        for n in range(3):
            await queue.put(f"later {n}".encode())
        backend = client.backend
        transact = backend.transact
        failed: list[Any] = []

        async def flaky(ops: Any, *args: Any, **kwargs: Any) -> Any:
            claims = [op for op in ops if isinstance(op, Create) and "/_claims/" in op.prefix]
            if claims and not failed:
                failed.append(ops)
                raise BackendUnavailable("no answer (injected, before it was applied)")
            return await transact(ops, *args, **kwargs)

        backend.transact = flaky  # type: ignore[method-assign]
        with anyio.fail_after(10):
            async with queue.claim() as job:
                assert failed, "(the first claim failed)"
                assert job.id == first.id, "a younger job was claimed before the oldest"
