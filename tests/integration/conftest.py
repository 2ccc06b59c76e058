"""Integration tests run on asyncio: aetcd's gRPC and aiokafka are asyncio-only (the
ZooKeeper tests choose their own loop in their conftest)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
