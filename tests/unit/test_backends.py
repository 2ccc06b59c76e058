"""Backend selection and loop support, without any server."""

from __future__ import annotations

import pytest

import coord

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


async def test_etcd_under_trio_is_a_clear_error() -> None:
    client = coord.connect("etcd://127.0.0.1:1")
    with pytest.raises(coord.ConfigurationError, match="asyncio only"):
        async with client:
            pass


async def test_memory_runs_under_trio() -> None:
    async with coord.connect("memory://trio") as client, client.mutex("x") as hold:
        assert hold.fence > 0
