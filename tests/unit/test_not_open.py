"""A client used before ``async with`` says that it is not open yet and how to open it;
one used after it says that it is closed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest

import coord
from coord.testing.pytest_plugin import fresh_namespace

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

pytestmark = pytest.mark.anyio


async def _first(election: coord.Election) -> object:
    async for leader in election.observe():
        return leader
    return None


async def _enter(context: Any) -> object:
    async with context as value:
        return value


def _calls(client: coord.Client) -> dict[str, Callable[[], Awaitable[object]]]:
    queue, election, rw = client.queue("q"), client.election("e"), client.rwlock("rw")
    return {
        "mutex acquire": client.mutex("m").acquire,
        "async with mutex": lambda: _enter(client.mutex("m")),
        "try_acquire": client.mutex("m").try_acquire,
        "waiters": client.mutex("m").waiters,
        "semaphore": client.semaphore("s", 2).acquire,
        "read lock": rw.read.acquire,
        "campaign": lambda: _enter(election.campaign(b"me")),
        "leader": election.leader,
        "observe": lambda: _first(election),
        "put": lambda: queue.put(b"job"),
        "claim": lambda: _enter(queue.claim()),
        "stats": queue.stats,
    }


async def _messages(client: coord.Client) -> dict[str, str]:
    said = {}
    for what, call in _calls(client).items():
        with anyio.fail_after(5):
            try:
                await call()
            except coord.ClosedError as exc:
                said[what] = str(exc)
            else:
                said[what] = "(no error)"
    try:
        _ = client.session
    except coord.ClosedError as exc:
        said["session"] = str(exc)
    return said


async def test_before_async_with_it_is_not_open_yet() -> None:
    client = coord.connect(f"memory://{fresh_namespace()}")
    said = await _messages(client)
    wrong = {
        what: message
        for what, message in said.items()
        if "not open yet" not in message or "async with coord.connect(" not in message
    }
    assert wrong == {}


async def test_after_async_with_it_is_closed() -> None:
    async with coord.connect(f"memory://{fresh_namespace()}") as client:
        pass
    said = await _messages(client)
    said.pop("session", None)  # (the last session, lost, stays readable after the close)
    assert {what: m for what, m in said.items() if "closed" not in m or "open" in m} == {}


def _reads(client: coord.Client) -> dict[str, Callable[[], Awaitable[object]]]:
    election = client.election("e")
    return {
        "waiters": client.mutex("m").waiters,
        "leader": election.leader,
        "observe": lambda: _first(election),
        "stats": client.queue("q").stats,
        "dead letters": client.queue("q").dead_letters,
    }


async def _read_errors(client: coord.Client) -> dict[str, str]:
    said = {}
    for what, call in _reads(client).items():
        with anyio.fail_after(5), pytest.raises(coord.ClosedError) as caught:
            await call()
        said[what] = str(caught.value)
    return said


async def test_a_client_that_only_reads_is_not_open_before_and_closed_after() -> None:
    """``sessions=False``: its reads say "not open yet" before ``async with`` and
    "closed" after it (they reached a closed backend before)."""
    client = coord.connect(f"memory://{fresh_namespace()}", sessions=False)
    before = await _read_errors(client)
    assert {w: m for w, m in before.items() if "not open yet" not in m} == {}
    async with client:
        assert await client.election("e").leader() is None
    after = await _read_errors(client)
    assert {w: m for w, m in after.items() if "client is closed" not in m} == {}
