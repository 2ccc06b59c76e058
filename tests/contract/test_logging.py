"""coord's log lines: a session's start, loss and replacement, a lock's loss, and (DEBUG)
every acquire and release, with the fields an operator needs and no secret."""

from __future__ import annotations

import logging
import re

import anyio
import pytest

import coord
from coord.testing import drop_key, expire_session

from .conftest import STORES


@pytest.fixture(params=[p for p in STORES if p.id in ("memory-asyncio", "etcd", "zookeeper")])
def store(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


def _lines(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    return [
        f"{r.levelname} {r.getMessage()}"
        for r in caplog.records
        if r.levelno >= level and r.name.startswith("coord")
    ]


async def test_session_start_loss_and_replacement(
    coord_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="coord")
    async with coord.connect(coord_url, ttl=5) as client:
        first = client.session
        url = client.backend.url
        assert f"INFO session {first.id:#x} opened on {url} (ttl 5s)" in _lines(caplog)
        caplog.clear()
        await expire_session(client)
        with anyio.fail_after(10):
            async for session in client.sessions():
                if session is not first:
                    break
        await anyio.sleep(0.1)  # the replacement's line comes right after it is published
        lines = _lines(caplog)
    lost = [line for line in lines if line.startswith(f"WARNING session {first.id:#x}")]
    assert len(lost) == 1, lines
    pattern = r"WARNING session \S+ on \S+ lost \(.+\); opening a new one"
    assert re.fullmatch(pattern, lost[0])
    replaced = [line for line in lines if "replacing" in line]
    assert replaced == [
        line
        for line in lines
        if line.startswith(f"INFO session {session.id:#x} opened on {url} (ttl 5s), ")
        and f"replacing {first.id:#x} after " in line
    ], lines
    assert len(replaced) == 1, lines


async def test_a_lock_loss_is_one_warning_and_acquires_are_debug_lines(
    clients: list[coord.Client], caplog: pytest.LogCaptureFixture
) -> None:
    client = clients[0]
    caplog.set_level(logging.DEBUG, logger="coord")
    async with client.mutex("logged") as hold:
        pass
    with pytest.raises(coord.LockLost):
        async with client.mutex("logged") as lost:
            await drop_key(client, lost.key)
            await anyio.sleep_forever()
    lines = [line for line in _lines(caplog, logging.DEBUG) if "'logged'" in line]
    assert re.fullmatch(
        rf"DEBUG mutex 'logged' acquired \(fence {hold.fence}\) after \d+\.\d{{3}}s",
        lines[0],
    ), lines
    assert re.fullmatch(
        rf"DEBUG mutex 'logged' released \(fence {hold.fence}\) after \d+\.\d{{3}}s",
        lines[1],
    ), lines
    warnings = [line for line in lines if line.startswith("WARNING")]
    assert warnings == [
        f"WARNING mutex 'logged' was lost while held (fence {lost.fence}): its key "
        "was deleted by someone else"
    ], lines


def test_no_secret_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    backend = coord.connect("etcd://root:s3cret@127.0.0.1:1/app").backend
    assert "s3cret" not in backend.url
    assert "s3cret" not in repr(backend)


async def test_lines_in_loggings_default_format_name_coord_once(
    coord_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The logger's name says "coord"; the message does not say it again
    (``INFO:coord:coord: session ... opened``)."""
    caplog.set_level(logging.DEBUG, logger="coord")
    async with coord.connect(coord_url, ttl=5) as client, client.mutex("once"):
        pass
    formatter = logging.Formatter(logging.BASIC_FORMAT)
    lines = [formatter.format(r) for r in caplog.records if r.name.startswith("coord")]
    assert any(line.startswith("INFO:coord:session ") for line in lines), lines
    assert not [line for line in lines if "coord: " in line], lines
