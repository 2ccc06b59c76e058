"""A client that only reads (``coord.connect(url, sessions=False)``): it grants no lease,
reads and watches what other clients hold, and refuses at the call what needs a
session."""

from __future__ import annotations

import anyio
import pytest

import coord
from coord.backends.memory import MemoryBackend
from coord.testing.pytest_plugin import fresh_namespace

pytestmark = pytest.mark.anyio


async def test_it_reads_and_watches_and_grants_no_lease() -> None:
    url = f"memory://{fresh_namespace()}"
    async with coord.connect(url, identity="worker") as worker:
        backend = worker.backend
        assert isinstance(backend, MemoryBackend)
        leases = set(backend.store._leases)
        await worker.queue("jobs").put(b"x")
        async with (
            worker.mutex("m"),
            worker.election("e").campaign(b"me"),
            coord.connect(url, sessions=False) as reader,
        ):
            assert "no sessions" in repr(reader)
            assert [w.identity.get("name") for w in await reader.mutex("m").waiters()] == ["worker"]
            leader = await reader.election("e").leader()
            assert leader is not None
            assert leader.value == b"me"
            async for first in reader.election("e").observe():
                assert first == leader
                break
            assert (await reader.queue("jobs").stats()).depth == 1
            assert await reader.queue("jobs").dead_letters() == []
            assert set(backend.store._leases) == leases  # the reader granted none
        assert reader.statistics().sessions_opened == 0


async def test_what_needs_a_session_is_refused_at_the_call() -> None:
    async with coord.connect(f"memory://{fresh_namespace()}", sessions=False) as reader:
        refusals = [
            reader.mutex("m").acquire(),
            reader.mutex("m").try_acquire(),
            reader.semaphore("s", 2).acquire(),
            reader.rwlock("rw").read.acquire(),
            reader.election("e").campaign(b"v").acquire(),
            reader.queue("q").put(b"x"),
        ]
        for call in refusals:
            with anyio.fail_after(1), pytest.raises(coord.ConfigurationError, match="no session"):
                await call
        with pytest.raises(coord.ConfigurationError, match="no session"):
            reader.session  # noqa: B018
        assert [s async for s in reader.sessions()] == []
