"""The event loops the etcd transport's tests run on: asyncio with its fast path (what
asyncio users run), asyncio on the generic anyio path, and trio (which takes the generic
path): the same connection code under each of the transport's pipes.

A module sets ``anyio_backend = transport_loops()``; a test that needs asyncio (a server
written on asyncio's protocols, asyncio's own cancellation) narrows it with
``@pytest.mark.parametrize("transport_loop", ASYNCIO, indirect=True)``.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["ASYNCIO", "LOOPS", "transport_loops"]

LOOPS = [
    pytest.param(("asyncio", True), id="asyncio"),
    pytest.param(("asyncio", False), id="asyncio-anyio"),
    pytest.param(("trio", False), id="trio"),
]
ASYNCIO = LOOPS[:2]


def transport_loops() -> Any:
    """An ``anyio_backend`` fixture that follows ``transport_loop`` (``conftest.py``)."""

    @pytest.fixture
    def anyio_backend(transport_loop: str) -> str:
        return transport_loop

    return anyio_backend
