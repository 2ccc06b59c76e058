"""The etcd lease's keepalive (``coord/backends/etcd/_lease.py``) against a real server,
with replies injected where the keepalive reads them: only a reply for our lease says
whether it lives (issue 36, item 6)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from aetcd import rpc

import coord
from coord.backends.etcd import _lease

pytestmark = [pytest.mark.anyio, pytest.mark.etcd]


def _inject(monkeypatch: pytest.MonkeyPatch, reply: Any) -> list[Any]:
    """Before every real keepalive reply, the keepalive reads one made by *reply*
    (the real one stays on the stream, read next). Returns what was injected."""
    read = _lease.stream_read  # type: ignore[attr-defined]
    injected: list[Any] = []
    owed: list[bool] = []

    async def stream_read(call: Any) -> Any:
        if not owed:
            owed.append(True)
            injected.append(fake := reply())
            return fake
        owed.clear()
        return await read(call)

    monkeypatch.setattr(_lease, "stream_read", stream_read)
    return injected


async def test_a_keepalive_reply_for_another_lease_is_ignored(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty LeaseKeepAliveResponse (ID 0, TTL 0) read before each real reply used
    to end a healthy session at its first keepalive ("the store says the lease is
    gone"). It is a reply for another lease: ignored, the session lives on."""
    injected = _inject(monkeypatch, rpc.LeaseKeepAliveResponse)
    async with coord.connect(etcd_url, ttl=2) as client:
        session = client.session
        await anyio.sleep(2.5)  # about four keepalives at ttl / 3
        assert not session.lost, session.reason
        assert client.session is session
        assert len(injected) >= 3


async def test_a_reply_for_our_lease_with_no_ttl_means_it_is_gone(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our lease's id with TTL 0 is how etcd says the lease is gone: the session is
    lost at that keepalive."""
    lease_ids: list[int] = []
    _inject(monkeypatch, lambda: rpc.LeaseKeepAliveResponse(ID=lease_ids[0], TTL=0))
    async with coord.connect(etcd_url, ttl=2) as client:
        session = client.session
        lease_ids.append(session.lease.id)
        with anyio.fail_after(2):
            await session.wait_lost()
        assert "gone" in (session.lease.reason or "")  # type: ignore[attr-defined]
