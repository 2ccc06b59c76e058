"""What connect() checks at the call, and how fast a refused store fails: no server
needed (the ports are free, so every connection is refused)."""

from __future__ import annotations

import anyio
import pytest

import coord
from coord.testing import free_port

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    ("url", "ttl"),
    [
        ("zk://127.0.0.1:2181", 3e6),  # ZooKeeper counts it in 32-bit milliseconds
        ("etcd://127.0.0.1:2379", 1e10),  # beyond etcd's MaxLeaseTTL
        ("memory://", float("inf")),
        ("memory://", 0),
    ],
)
def test_ttl_beyond_the_stores_limit_is_refused_at_the_call(url: str, ttl: float) -> None:
    with pytest.raises(coord.ConfigurationError, match="ttl"):
        coord.connect(url, ttl=ttl)


def test_ttls_within_the_limits_are_accepted() -> None:
    coord.connect("zk://127.0.0.1:2181", ttl=2e6)  # fits; the server may clamp it
    coord.connect("etcd://127.0.0.1:2379", ttl=9e9)


def test_renew_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="renew"):
        coord.connect("memory://", renew="no")  # type: ignore[arg-type]


@pytest.mark.parametrize("scheme", ["etcd", "zk"])
async def test_refused_everywhere_fails_fast_naming_every_endpoint(scheme: str) -> None:
    ports = [free_port(), free_port()]
    url = f"{scheme}://" + ",".join(f"127.0.0.1:{p}" for p in ports)
    started = anyio.current_time()
    with pytest.raises(coord.BackendUnavailable) as info:
        async with coord.connect(url, ttl=5):
            pass
    assert anyio.current_time() - started < 2
    for port in ports:
        assert f"127.0.0.1:{port}" in str(info.value)
