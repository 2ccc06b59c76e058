"""Kafka tests: real Kafka-protocol brokers started by the test plugin (aiokafka is
asyncio code)."""

from __future__ import annotations

import pytest

pytest.importorskip("aiokafka")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
