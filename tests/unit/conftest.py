"""Fixtures of the unit tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@pytest.fixture
async def tasks() -> AsyncIterator[anyio.abc.TaskGroup]:
    """A task group for the test's servers, cancelled when the test ends."""
    async with anyio.create_task_group() as tg:
        yield tg
        tg.cancel_scope.cancel()
