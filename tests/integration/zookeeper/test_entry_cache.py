"""A stale listing of a queue's head keeps its entries while their data watches have not
fired (``backends/zookeeper/_cache.py``): the next look reads only what it has not seen
or what changed (a busy queue's lookers made 10 reads a job, 5 now). What each listing
returns must still be what a read made with it would return: a write or a delete made
by another client before the listing is always in it."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import coord
from coord.abc import Create, Remove, Update
from coord.backends.zookeeper import _cache

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from coord.backends.zookeeper import ZooKeeperBackend

pytestmark = pytest.mark.anyio


@pytest.fixture
async def pair(zookeeper_url: str) -> AsyncIterator[tuple[coord.Client, coord.Client]]:
    async with coord.connect(zookeeper_url, ttl=5) as a, coord.connect(zookeeper_url) as b:
        yield a, b


def _backend(client: coord.Client) -> ZooKeeperBackend:
    return client.backend  # type: ignore[return-value]


class _Reads:
    """Counts the reads of nodes (GetData) a client sends."""

    def __init__(self, backend: ZooKeeperBackend, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        conn = backend._conn
        ready = conn.ready

        async def counted_ready(*args: Any, **kwargs: Any) -> Any:
            client = await ready(*args, **kwargs)
            get = client.get_data_nowait
            if getattr(get, "counted", False):
                return client

            def get_data_nowait(path: str, *rest: Any, **options: Any) -> Any:
                self.paths.append(path)
                return get(path, *rest, **options)

            get_data_nowait.counted = True  # type: ignore[attr-defined]
            monkeypatch.setattr(client, "get_data_nowait", get_data_nowait)
            return client

        monkeypatch.setattr(conn, "ready", counted_ready)


async def _fill(client: coord.Client, prefix: str, n: int) -> None:
    ops = [Create(prefix, f"@{uuid.uuid4().hex}", f"v{i}".encode()) for i in range(n)]
    await client.backend.transact(ops)


async def _look(client: coord.Client, prefix: str, limit: int = 16) -> coord.abc.Listing:
    return await client.backend.entries(prefix, limit=limit, stale_ok=True)


async def test_a_second_look_reads_only_what_changed(
    pair: tuple[coord.Client, coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair
    prefix = "cache/_jobs/"
    await _fill(b, prefix, 6)
    reads = _Reads(_backend(a), monkeypatch)
    first = await _look(a, prefix)
    assert len(reads.paths) == 6
    assert [e.value for e in first.entries] == [f"v{i}".encode() for i in range(6)]
    changed, gone = first.entries[1], first.entries[4]
    await b.backend.transact([Update(changed, b"new")])
    await b.backend.transact([Remove(gone)])
    await _fill(b, prefix, 1)
    reads.paths.clear()
    second = await _look(a, prefix)
    # The changed one and the new one are read; the unchanged ones are not.
    assert len(reads.paths) == 2, reads.paths
    by_key = {e.key: e for e in second.entries}
    assert gone.key not in by_key
    assert by_key[changed.key].value == b"new"
    assert by_key[changed.key].version == changed.version + 1
    assert [e.key for e in second.entries] == [
        *(e.key for e in first.entries if e.key != gone.key),
        second.entries[-1].key,
    ]
    # A fresh (not stale) listing reads every entry, and agrees.
    reads.paths.clear()
    fresh = await a.backend.entries(prefix, limit=16)
    assert len(reads.paths) == len(fresh.entries) == 6
    assert fresh.entries == second.entries


async def test_a_write_before_the_listing_is_always_in_it(
    pair: tuple[coord.Client, coord.Client],
) -> None:
    """The other client writes, then this one lists at once, a hundred times: each
    listing shows the write (the watch's event comes before the listing's answer)."""
    a, b = pair
    prefix = "race/_jobs/"
    await _fill(b, prefix, 4)
    await _look(a, prefix)
    for round_ in range(100):
        listed = (await b.backend.entries(prefix, limit=16)).entries
        target = listed[round_ % len(listed)]
        value = f"round {round_}".encode()
        await b.backend.transact([Update(target, value)])
        seen = {e.key: e for e in (await _look(a, prefix)).entries}
        assert seen[target.key].value == value, f"round {round_}: a stale entry"
        assert seen[target.key].version == target.version + 1


async def test_a_lost_connection_drops_what_was_kept(
    pair: tuple[coord.Client, coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair
    prefix = "dropped/_jobs/"
    await _fill(b, prefix, 3)
    await _look(a, prefix)
    cache = _backend(a)._queues._cache
    assert len(cache) == 3
    _backend(a)._watches.wake_all()  # what a disconnect, or a replaced client, does
    assert len(cache) == 0
    reads = _Reads(_backend(a), monkeypatch)
    await _look(a, prefix)
    assert len(reads.paths) == 3


async def test_only_the_last_look_is_kept_within_a_byte_bound(
    pair: tuple[coord.Client, coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair
    prefix = "bounded/_jobs/"
    await _fill(b, prefix, 8)
    await _look(a, prefix, limit=8)
    cache = _backend(a)._queues._cache
    assert len(cache) == 8
    await _look(a, prefix, limit=3)  # a shorter look: the others are let go
    assert len(cache) == 3
    monkeypatch.setattr(_cache, "MAX_BYTES", 5)  # room for two values of 2 bytes
    _backend(a)._watches.wake_all()
    await _look(a, prefix, limit=8)
    assert len(cache) == 2
    with anyio.fail_after(5):
        assert len((await _look(a, prefix, limit=8)).entries) == 8
