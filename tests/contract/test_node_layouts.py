"""The contract's calls for kazoo's and Curator's layouts (``create_sequential``,
``child_names``, and what ``position``, ``delete`` and ``wait_keys_changed`` do with
their nodes) on every store: served where ``layouts`` has them, refused elsewhere."""

from __future__ import annotations

import uuid
from functools import partial

import anyio
import pytest

import coord
from coord.abc import Entry

pytestmark = [pytest.mark.anyio]


def _speaks(client: coord.Client) -> bool:
    layouts = client.backend.layouts
    assert ("kazoo" in layouts) == ("curator" in layouts)
    return "kazoo" in layouts


async def test_refused_where_not_spoken(coord_url: str) -> None:
    async with coord.connect(coord_url, ttl=5) as client:
        if _speaks(client):
            pytest.skip("this store speaks the peer layouts")
        backend = client.backend
        with pytest.raises(coord.ConfigurationError, match="kazoo"):
            await backend.create_sequential("a/", "x__lock__", client.session.lease)
        with pytest.raises(coord.ConfigurationError, match="kazoo"):
            await backend.child_names("a/")
        with pytest.raises(coord.ConfigurationError, match="kazoo"):
            client.mutex("a", layout="kazoo")
        with pytest.raises(coord.ConfigurationError, match="curator"):
            client.election("a", layout="curator")
        with pytest.raises(coord.ConfigurationError, match="curator"):
            client.semaphore("a", 2, layout="curator")  # (at the call: nothing sent)


async def test_sequential_nodes(coord_url: str) -> None:
    async with coord.connect(coord_url, ttl=5) as client, coord.connect(coord_url) as other:
        if not _speaks(client):
            pytest.skip("this store speaks no peer layout")
        backend, lease = client.backend, client.session.lease
        assert await backend.child_names("a/") == coord.abc.Children((), 0)
        name = uuid.uuid4().hex + "__lock__"
        first = await backend.create_sequential("a/", name, lease, value=b"one")
        second = await backend.create_sequential("a/", f"_c_{uuid.uuid4()}-lock-", lease)
        assert first.key == f"a/{name}0000000000"
        assert second.key.endswith("-lock-0000000001")
        assert (first.value, first.lease) == (b"one", lease.id)
        assert second.revision > first.revision  # the czxid: the fence
        assert await backend.get(first.key) == first
        children = await backend.child_names("a/")
        assert sorted(children.names) == sorted(e.key.rpartition("/")[2] for e in (first, second))
        assert (await backend.position(first, ahead=0)).entry == first
        # The provisional entry of a create whose outcome is unknown finds it by name.
        assert await backend.delete(Entry("a/" + name, lease=lease.id))
        with pytest.raises(coord.abc.EntryGoneError):
            await backend.position(first, ahead=0)
        assert not await backend.delete(Entry("a/" + name, lease=lease.id))
        # Another session's node is not "ours" to delete by name.
        theirs = await other.backend.create_sequential("a/", name, other.session.lease)
        assert not await backend.delete(Entry("a/" + name, lease=lease.id))
        assert await backend.get(theirs.key) is not None
        with pytest.raises(coord.ConfigurationError):
            await backend.create_sequential("a/", "@w1", lease)


async def test_wait_keys_changed_on_children(coord_url: str) -> None:
    async with coord.connect(coord_url, ttl=5) as client:
        if not _speaks(client):
            pytest.skip("this store speaks no peer layout")
        backend, lease = client.backend, client.session.lease
        with anyio.fail_after(5):
            empty = await backend.child_names("w/")
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(backend.wait_keys_changed, "w/", revision=empty.revision))
                await anyio.sleep(0.2)
                node = await backend.create_sequential("w/", "x__lock__", lease)
            listed = await backend.child_names("w/")
            await backend.wait_keys_changed("w/", revision=empty.revision)  # at once
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(backend.wait_keys_changed, "w/", revision=listed.revision))
                await anyio.sleep(0.2)
                assert await backend.delete(node)
