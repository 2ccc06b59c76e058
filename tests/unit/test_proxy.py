"""coord.testing.TcpProxy against a small echo server: every fault it injects."""

from __future__ import annotations

import socketserver
import threading
from typing import TYPE_CHECKING

import anyio
import pytest

from coord.testing import TcpProxy

if TYPE_CHECKING:
    from collections.abc import Iterator

    from anyio.abc import SocketStream

pytestmark = pytest.mark.anyio


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while data := self.request.recv(65536):
                self.server.received.append(data)  # type: ignore[attr-defined]
                self.request.sendall(data)
        except ConnectionError:
            pass  # the proxy reset the connection: what the test asked for


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    received: list[bytes]


@pytest.fixture
def echo() -> Iterator[_EchoServer]:
    server = _EchoServer(("127.0.0.1", 0), _Echo)
    server.received = []
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(echo: _EchoServer) -> Iterator[TcpProxy]:
    with TcpProxy(echo.server_address[1]) as proxy:
        yield proxy


async def _connect(proxy: TcpProxy) -> SocketStream:
    return await anyio.connect_tcp("127.0.0.1", proxy.port)


async def _round_trip(stream: SocketStream, data: bytes = b"ping") -> bytes:
    await stream.send(data)
    return await stream.receive()


async def test_forwards_both_ways(proxy: TcpProxy, echo: _EchoServer) -> None:
    async with await _connect(proxy) as stream:
        assert await _round_trip(stream) == b"ping"
    assert proxy.connections == 1
    assert proxy.forwarded == {"requests": 4, "replies": 4}
    assert echo.received == [b"ping"]


async def test_delay_is_latency(proxy: TcpProxy) -> None:
    async with await _connect(proxy) as stream:
        proxy.delay(0.3)
        started = anyio.current_time()
        assert await _round_trip(stream) == b"ping"
        assert anyio.current_time() - started >= 0.3
        proxy.heal()
        started = anyio.current_time()
        assert await _round_trip(stream) == b"ping"
        assert anyio.current_time() - started < 0.2


async def test_dropped_replies_are_lost_and_heal_resets(proxy: TcpProxy, echo: _EchoServer) -> None:
    async with await _connect(proxy) as stream:
        proxy.drop()
        await stream.send(b"lost")
        with anyio.move_on_after(0.3) as scope:
            await stream.receive()
        assert scope.cancelled_caught, "a dropped reply arrived"
        assert echo.received == [b"lost"], "the request must reach the server"
        proxy.heal()
        with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError, OSError)):
            with anyio.fail_after(5):
                await stream.receive()
    async with await _connect(proxy) as stream:  # new connections work
        assert await _round_trip(stream) == b"ping"


async def test_blackhole_holds_then_delivers(proxy: TcpProxy, echo: _EchoServer) -> None:
    async with await _connect(proxy) as stream:
        proxy.blackhole()
        await stream.send(b"held")
        with anyio.move_on_after(0.3):
            await stream.receive()
        assert echo.received == [], "a partition let a request through"
        proxy.heal()
        with anyio.fail_after(5):
            assert await stream.receive() == b"held"


async def test_reset_breaks_open_connections_only(proxy: TcpProxy) -> None:
    async with await _connect(proxy) as stream:
        assert await _round_trip(stream) == b"ping"
        proxy.reset()
        with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError, OSError)):
            with anyio.fail_after(5):
                await _round_trip(stream)
    async with await _connect(proxy) as stream:
        assert await _round_trip(stream) == b"ping"


async def test_refuse_then_heal(proxy: TcpProxy) -> None:
    proxy.refuse()
    await anyio.sleep(0.1)  # applied by the proxy's thread
    with pytest.raises(OSError, match=r"(?i)refused|connection attempts failed"):
        await _connect(proxy)
    proxy.heal()
    with anyio.fail_after(5):
        while True:  # re-listening is applied by the proxy's thread, soon
            try:
                stream = await _connect(proxy)
            except OSError:
                await anyio.sleep(0.05)
                continue
            break
    async with stream:
        assert await _round_trip(stream) == b"ping"


def test_bad_direction_is_refused() -> None:
    with TcpProxy(1) as proxy, pytest.raises(ValueError, match="direction"):
        proxy.delay(1, direction="sideways")  # type: ignore[arg-type]


async def test_controls_before_the_thread_runs_are_applied(echo: _EchoServer) -> None:
    proxy = TcpProxy(echo.server_address[1])
    proxy.refuse()
    proxy.heal()  # the listener closed by refuse() must never be served again
    proxy.start()
    try:
        with anyio.fail_after(5):
            async with await _connect(proxy) as stream:
                assert await _round_trip(stream) == b"ping"
        refused = TcpProxy(echo.server_address[1])
        refused.refuse()
        refused.start()
        await anyio.sleep(0.1)
        with pytest.raises(OSError, match=r"(?i)refused|connection attempts failed"):
            await _connect(refused)
        await anyio.to_thread.run_sync(refused.close)
    finally:
        await anyio.to_thread.run_sync(proxy.close)


def test_closing_with_connections_in_flight_leaves_no_task_behind(echo: _EchoServer) -> None:
    """Closing the proxy while connections are being accepted and pumped ends all of its
    tasks before its loop closes (a CI run failed on a task destroyed pending, whose
    clean-up then ran on the closed loop: an unraisable error)."""
    import gc
    import socket

    for _ in range(20):
        proxy = TcpProxy(echo.server_address[1]).start()
        clients = [socket.create_connection(("127.0.0.1", proxy.port)) for _ in range(5)]
        try:
            for sock in clients:
                sock.sendall(b"ping")
            proxy.close()
        finally:
            for sock in clients:
                sock.close()
    # A pending task destroyed would warn here (filterwarnings: error). Once, not per
    # proxy: twenty full collections of a long-lived worker's heap made this case run
    # past its 20 s timeout on a loaded machine (27 s; 0.9 s alone).
    gc.collect()
