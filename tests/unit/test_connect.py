"""What connect() checks at the call, and how fast a refused store fails: no server
needed (the ports are free, so every connection is refused)."""

from __future__ import annotations

import anyio
import anyio.abc
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


@pytest.mark.parametrize("url", ["etcd://127.0.0.1:2379", "zk://127.0.0.1:2181", "memory://"])
@pytest.mark.parametrize(
    ("value", "error"),
    [
        (True, TypeError),
        ("10", TypeError),
        (None, TypeError),
        (0, coord.ConfigurationError),
        (-1.0, coord.ConfigurationError),
        (float("nan"), coord.ConfigurationError),
        (float("inf"), coord.ConfigurationError),
    ],
)
def test_connect_timeout_is_checked_at_the_call(
    url: str, value: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="connect_timeout"):
        coord.connect(url, connect_timeout=value)  # type: ignore[arg-type]


def test_sessions_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="sessions"):
        coord.connect("memory://", sessions="no")  # type: ignore[arg-type]


@pytest.mark.parametrize("scheme", ["etcd", "zk"])
async def test_a_listener_that_never_answers_fails_within_the_connect_timeout(
    scheme: str,
) -> None:
    with anyio.fail_after(5):
        async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            async with anyio.create_task_group() as tg:
                tg.start_soon(listener.serve, _say_nothing)
                started = anyio.current_time()
                with pytest.raises(coord.BackendUnavailable) as info:
                    async with coord.connect(f"{scheme}://127.0.0.1:{port}", connect_timeout=0.5):
                        pass
                took = anyio.current_time() - started
                tg.cancel_scope.cancel()
    assert 0.5 <= took < 1.5
    assert str(info.value).endswith(
        f"127.0.0.1:{port} accepted the connection but did not answer within 0.5s"
    )


async def _say_nothing(stream: anyio.abc.SocketStream) -> None:
    async with stream:
        await anyio.sleep_forever()
