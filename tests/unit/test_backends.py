"""Backend selection and loop support, without any server."""

from __future__ import annotations

import pytest
import trio

import coord
from coord.backends.memory import MemoryBackend

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


async def test_etcd_is_accepted_under_trio() -> None:
    """etcd's transport runs on anyio streams: no refusal at the call (the store is
    reached only when the client opens)."""
    client = coord.connect("etcd://127.0.0.1:1")
    assert client.backend.any_event_loop


class _AsyncioOnly(MemoryBackend):
    any_event_loop = False
    asyncio_only_because = "a reason of its own"


def test_an_asyncio_only_backend_is_refused_when_opened_under_trio() -> None:
    """The refusal a backend that cannot run on trio gets (none of coord's now)."""
    client = coord.Client(_AsyncioOnly())

    async def open_it() -> None:
        async with client:
            pass

    with pytest.raises(coord.ConfigurationError, match="asyncio only") as refused:
        trio.run(open_it)
    assert "a reason of its own" in str(refused.value)


async def test_memory_runs_under_trio() -> None:
    async with coord.connect("memory://trio") as client, client.mutex("x") as hold:
        assert hold.fence > 0


def test_an_etcd_listing_reads_past_every_key_one_revision_can_hold() -> None:
    """A listing with a limit reads _TIE_ROOM keys more (up to twice as many), so that the
    keys of its last store revision, which etcd may cut anywhere, can be left out with
    enough left: no revision may hold more (a registration's waiters and their links,
    or a transaction's creates)."""
    from coord.backends.etcd import _backend, _waitqueue

    assert _backend._TIE_ROOM >= 2 * _waitqueue.BATCH
    assert _backend._TIE_ROOM >= _backend.EtcdBackend.max_ops
