"""Fixtures of the unit tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

from ._etcd_loops import LOOPS

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@pytest.fixture
async def tasks() -> AsyncIterator[anyio.abc.TaskGroup]:
    """A task group for the test's servers, cancelled when the test ends."""
    async with anyio.create_task_group() as tg:
        yield tg
        tg.cancel_scope.cancel()


@pytest.fixture(params=LOOPS)
def transport_loop(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The event loop, with asyncio's fast path on or off."""
    from coord.backends.etcd._grpc import _runtime  # (the etcd extra's: only here)

    loop, fast = request.param
    monkeypatch.setattr(_runtime, "fast_path", fast)
    return str(loop)
