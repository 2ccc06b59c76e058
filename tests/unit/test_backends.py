"""Backend selection and loop support, without any server."""

from __future__ import annotations

import pytest
import trio

import coord

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


async def test_etcd_under_trio_is_refused_at_the_call() -> None:
    """Saying why in coord's own terms (not "its client library", which coord no longer
    uses for etcd's connections)."""
    with pytest.raises(coord.ConfigurationError, match="asyncio only") as refused:
        coord.connect("etcd://127.0.0.1:1")
    assert "coord's HTTP/2 transport for etcd's gRPC is built on asyncio" in str(refused.value)
    assert "client library" not in str(refused.value)


def test_etcd_made_outside_a_loop_is_refused_when_opened_under_trio() -> None:
    client = coord.connect("etcd://127.0.0.1:1")  # no event loop yet: checked at open

    async def open_it() -> None:
        async with client:
            pass

    with pytest.raises(coord.ConfigurationError, match="asyncio only"):
        trio.run(open_it)


async def test_memory_runs_under_trio() -> None:
    async with coord.connect("memory://trio") as client, client.mutex("x") as hold:
        assert hold.fence > 0
