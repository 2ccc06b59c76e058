"""Long queues on ZooKeeper: waiter nodes moved into shards (issue 18).

A registration lists the queue's node; with thousands of waiter nodes in it, every
registration and every handoff read the whole queue (O(W²) for a burst). Now a waiter that
finds ``SHARD_AFTER`` waiter nodes ahead of it in the node moves its own into a shard (a
container per block of ``SHARD`` sequence numbers), keeping its sequence number and its
czxid as its fence (``backends/zookeeper/_waitqueue.py``). These tests shrink both numbers so
that a few waiters cross several shards.
"""

from __future__ import annotations

import itertools
import uuid
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import coord
from coord.abc import ChangeKind, Entry
from coord.backends.zookeeper import _paths
from coord.backends.zookeeper import _waitqueue as _queue
from coord.testing import wait_for_no_waiters, wait_for_waiters

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from anyio.abc import TaskGroup

    from coord.backends.zookeeper import ZooKeeperBackend

pytestmark = pytest.mark.anyio

AFTER, SHARD = 2, 4


@pytest.fixture(autouse=True)
def small_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_queue, "SHARD_AFTER", AFTER)
    monkeypatch.setattr(_queue, "SHARD", SHARD)
    monkeypatch.setattr(_paths, "SHARD", SHARD)


@pytest.fixture
async def client(zookeeper_url: str) -> AsyncIterator[coord.Client]:
    async with coord.connect(zookeeper_url, ttl=5) as client:
        yield client


def backend_of(client: coord.Client) -> ZooKeeperBackend:
    return client.backend  # type: ignore[return-value]


async def children(client: coord.Client, name: str) -> list[str]:
    backend = backend_of(client)
    listed = await backend._queues.children(backend._paths.parent(name + "/"))
    return listed[0] if listed else []


async def queue_in_order(
    tg: TaskGroup, client: coord.Client, name: str, count: int, body: Any, gates: int = 1
) -> None:
    """Start *count* tasks in *tg* running ``body(i)``, each once the one before is
    registered (behind the *gates* entries already there), so that registration order
    is task order; return once the last one is registered."""
    for i in range(count):
        tg.start_soon(body, i)
        with anyio.fail_after(10):
            await wait_for_waiters(client, name, gates + i + 1)


async def test_a_long_queue_moves_its_waiters_into_shards_and_serves_them_in_order(
    client: coord.Client,
) -> None:
    gate = client.mutex("m")
    await gate.acquire()
    order: list[int] = []
    fences: list[int] = []
    count = 5 * SHARD

    async def waiter(i: int) -> None:
        async with client.mutex("m") as hold:
            order.append(i)
            fences.append(hold.fence)

    async with anyio.create_task_group() as tg:
        await queue_in_order(tg, client, "m", count, waiter)
        listed = await children(client, "m")
        tickets = [c for c in listed if _paths.parse_waiter(c) is not None]
        shards = [c for c in listed if _paths.shard_index(c) is not None]
        assert len(tickets) <= AFTER + 1, "the queue's node keeps only the head's nodes"
        assert len(shards) >= 3, listed
        entries = (await client.backend.entries("m/")).entries
        assert [e.revision for e in entries] == sorted(e.revision for e in entries)
        assert sum(_paths.is_sharded(e.key.rpartition("/")[2]) for e in entries) >= count - AFTER
        await gate.release()
    assert order == list(range(count))
    assert all(a < b for a, b in itertools.pairwise(fences)), "fences must grow with the queue"
    assert (await client.backend.entries("m/")).entries == ()


async def test_waiters_that_leave_out_of_turn_across_whole_shards(client: coord.Client) -> None:
    """A run of waiters spanning whole shards gives up: each later waiter then waits for
    the nearest one still there, in a lower shard or in the queue's node."""
    gate = client.mutex("m")
    await gate.acquire()
    count = 6 * SHARD
    leaving = set(range(3, 3 + 3 * SHARD))
    scopes = {i: anyio.CancelScope() for i in leaving}
    order: list[int] = []

    async def waiter(i: int) -> None:
        with scopes.get(i, anyio.CancelScope()):
            async with client.mutex("m"):
                order.append(i)
                await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        await queue_in_order(tg, client, "m", count, waiter)
        for scope in scopes.values():
            scope.cancel()  # their keys are deleted by tasks of the session, soon
        await gate.release()
    assert order == [i for i in range(count) if i not in leaving]
    assert (await client.backend.entries("m/")).entries == ()


async def test_a_semaphore_and_readers_see_the_entries_ahead_in_shards(
    client: coord.Client,
) -> None:
    limit, count = 3, 4 * SHARD
    inside = most = 0

    async def slot(i: int) -> None:
        nonlocal inside, most
        async with client.semaphore("s", limit):
            inside += 1
            most = max(most, inside)
            await anyio.sleep(0.02)
            inside -= 1

    opened = anyio.Event()

    async def gate() -> None:  # holds a slot until the others are queued
        async with client.semaphore("s", limit):
            await opened.wait()

    async with anyio.create_task_group() as tg:
        for _ in range(limit):
            tg.start_soon(gate)
        with anyio.fail_after(10):
            await wait_for_waiters(client, "s", limit)
        await queue_in_order(tg, client, "s", count, slot, limit)
        listed = await children(client, "s")
        assert any(_paths.shard_index(c) is not None for c in listed), listed
        opened.set()
    assert most == limit

    rw = client.rwlock("rw")
    writers = readers = 0
    overlap: list[str] = []

    async def user(i: int) -> None:
        nonlocal writers, readers
        if i % 5 == 4:
            async with rw.write:
                writers += 1
                if writers > 1 or readers:
                    overlap.append(f"writer {i}")
                await anyio.sleep(0.01)
                writers -= 1
        else:
            async with rw.read:
                readers += 1
                if writers:
                    overlap.append(f"reader {i}")
                await anyio.sleep(0.01)
                readers -= 1

    await rw.write.acquire()  # the head, while the others register
    async with anyio.create_task_group() as tg:
        await queue_in_order(tg, client, "rw", count, user)
        listed = await children(client, "rw")
        assert any(_paths.shard_index(c) is not None for c in listed), listed
        await rw.write.release()
    assert overlap == []
    assert (await client.backend.entries("rw/")).entries == ()


async def test_a_registration_whose_outcome_is_unknown_is_found_in_its_shard(
    client: coord.Client,
) -> None:
    backend = backend_of(client)
    lease = client.session.lease
    for _ in range(AFTER):
        await backend.register("p/", f"@w{uuid.uuid4().hex}", lease)
    waiter_id = f"@w{uuid.uuid4().hex}"
    position = await backend.register("p/", waiter_id, lease)
    assert _paths.is_sharded(position.entry.key.rpartition("/")[2])
    found = await backend.find("p/", waiter_id, lease)
    assert found == position.entry
    assert await backend.get(position.entry.key) == position.entry
    # The delete of a provisional entry (its registration did not answer) finds it too.
    assert await backend.delete(Entry("p/" + waiter_id, lease=lease.id)) is True
    assert await backend.get(position.entry.key) is None
    assert await backend.find("p/", waiter_id, lease) is None


@pytest.mark.parametrize("applied", [True, False])
async def test_a_move_whose_answer_is_lost(
    client: coord.Client, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    """The move's transaction either happened or not: its caller finds out which, and
    the waiter has exactly one node."""
    backend = backend_of(client)
    lease = client.session.lease
    for _ in range(AFTER):
        await backend.register("p/", f"@w{uuid.uuid4().hex}", lease)
    conn = backend._queues._conn
    call = conn.call
    lost: list[str] = []

    async def losing(what: str, request: Any, **kwargs: Any) -> Any:
        if what == "move" and not lost:
            lost.append(what)
            if applied:
                await call(what, request, **kwargs)
            raise coord.BackendUnavailable("the answer was lost")
        return await call(what, request, **kwargs)

    monkeypatch.setattr(conn, "call", losing)
    waiter_id = f"@w{uuid.uuid4().hex}"
    position = await backend.register("p/", waiter_id, lease)
    assert lost == ["move"]
    assert _paths.is_sharded(position.entry.key.rpartition("/")[2])
    mine = [e for e in (await backend.entries("p/")).entries if waiter_id in e.key]
    assert mine == [position.entry]


async def test_an_observer_sees_a_leader_whose_node_is_in_a_shard(client: coord.Client) -> None:
    """Once the candidates in the queue's node are gone, the leader's node is in a shard:
    an observer reads it there, and waits for it there."""
    election = client.election("e")
    count = AFTER + 3
    campaigns: list[anyio.CancelScope] = [anyio.CancelScope() for _ in range(count)]
    expected = str(AFTER + 1).encode()
    seen = anyio.Event()

    async def candidate(i: int) -> None:
        with campaigns[i]:
            async with election.campaign(value=str(i).encode()):
                await anyio.sleep_forever()

    async def observe() -> None:
        async for leader in election.observe():
            if leader is not None and leader.value == expected:
                seen.set()

    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(candidate, i)
            with anyio.fail_after(10):
                await wait_for_waiters(client, "e", i + 1)
        tg.start_soon(observe)
        for i in range(AFTER + 1):
            campaigns[i].cancel()
        with anyio.fail_after(10):
            await seen.wait()
        tg.cancel_scope.cancel()


async def test_a_repeat_after_an_answer_lost_once_moved_makes_no_second_node(
    client: coord.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer is lost after the node moved into its shard (found by a review: the
    repeat looked for an earlier node in the queue's node only, made a second one, and a
    mutex then waited behind its own first node forever)."""
    backend = backend_of(client)
    lease = client.session.lease
    for _ in range(AFTER):
        await backend.register("p/", f"@w{uuid.uuid4().hex}", lease)
    locate = backend._queues._locate
    failed: list[str] = []

    async def outage(mine: Entry, *args: Any, **kwargs: Any) -> Any:
        if not failed and _paths.is_sharded(mine.key.rpartition("/")[2]):
            failed.append(mine.key)  # after the move, before the answer
            raise coord.BackendUnavailable("the connection was lost")
        return await locate(mine, *args, **kwargs)

    monkeypatch.setattr(backend._queues, "_locate", outage)
    waiter_id = f"@w{uuid.uuid4().hex}"
    with pytest.raises(coord.BackendUnavailable):
        await backend.register("p/", waiter_id, lease)
    position = await backend.register("p/", waiter_id, lease)  # the same waiter id
    assert failed == [position.entry.key]
    mine = [e.key for e in (await backend.entries("p/")).entries if waiter_id in e.key]
    assert mine == [position.entry.key]


async def test_a_watch_of_the_queue_sees_waiters_in_shards(client: coord.Client) -> None:
    """A deletion in a shard is reported (by its key in the shard), and wait_for_no_waiters
    returns when the last waiter leaves from a shard (before, only the server's reaping
    of the empty shards, a minute later in production, changed the queue's node)."""
    backend = backend_of(client)
    lease = client.session.lease
    positions = [
        await backend.register("p/", f"@w{uuid.uuid4().hex}", lease) for _ in range(AFTER + 2)
    ]
    last = positions[-1].entry
    assert _paths.is_sharded(last.key.rpartition("/")[2])
    listing = await backend.entries("p/")
    async with backend.watch("p/", revision=listing.revision) as changes:
        await backend.delete(last)
        with anyio.fail_after(5):
            change = await changes.__anext__()
    assert change.kind is ChangeKind.DELETE
    assert change.entry.key == last.key
    for position in positions[:AFTER]:
        await backend.delete(position.entry)
    final = positions[AFTER].entry  # the last one there, in a shard
    assert _paths.is_sharded(final.key.rpartition("/")[2])

    async def leave() -> None:
        await backend.delete(final)

    async with anyio.create_task_group() as tg:
        tg.start_soon(leave)
        with anyio.fail_after(5):
            await wait_for_no_waiters(client, "p")


async def test_a_group_watch_sees_a_sharded_member_leave_and_ids_stay_put(
    client: coord.Client, zookeeper_url: str
) -> None:
    """A change inside a shard moves the shard's pzxid, not the node's: a watch compared
    only the node's with the listing's, so a member that left its shard between a read
    and the next watch was never reported (found by review of group membership). And a
    member's id does not change when its node moves into a shard."""
    async with coord.connect(zookeeper_url, ttl=5) as joiner:
        scopes: list[anyio.CancelScope] = []
        memberships: list[coord.Membership] = []

        async def member(i: int, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            with anyio.CancelScope() as scope:
                async with joiner.group("sg").join(b"%d" % i) as membership:
                    scopes.append(scope)
                    memberships.append(membership)
                    task_status.started()
                    await anyio.sleep_forever()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for i in range(AFTER + 3):
                    await tg.start(member, i)
                assert any(":" in m.key for m in memberships), "no node moved into a shard"
                watch = client.group("sg").watch()
                first = await anext(watch)
                assert [m.id for m in first] == [m.id for m in memberships]
                scopes[-1].cancel()  # leaves while the watcher is busy with the first list
                while len(await client.group("sg").members()) != AFTER + 2:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
                second = await anext(watch)
                assert [m.id for m in second] == [m.id for m in memberships[:-1]]
                tg.cancel_scope.cancel()


async def test_a_wake_up_in_a_sharded_queue_lists_the_node_and_its_shard_together(
    client: coord.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter near the head of a long queue, whose own node was never moved, lists the
    queue's node and its shard in one round trip, as the queue is known to have shards;
    not one after the other (a short queue lists the node alone)."""
    gate = client.mutex("w")
    await gate.acquire()
    count = 2 * SHARD
    served = anyio.Event()

    async def waiter(i: int) -> None:
        async with client.mutex("w"):
            if i == 0:
                served.set()

    backend = backend_of(client)
    rounds: list[list[str]] = []
    real = backend._queues._list_many

    async def recording(paths: Any) -> Any:
        rounds.append(list(paths))
        return await real(paths)

    async with anyio.create_task_group() as tg:
        await queue_in_order(tg, client, "w", count, waiter)
        assert not _paths.is_sharded(
            (await client.backend.entries("w/", limit=2)).entries[1].key.rpartition("/")[2]
        ), "the first waiter's node is in the queue's node"
        monkeypatch.setattr(backend._queues, "_list_many", recording)
        await gate.release()
        with anyio.fail_after(10):
            await served.wait()
        monkeypatch.undo()
        tg.cancel_scope.cancel()
    node = backend._paths.parent("w/")
    assert rounds, "no listing"
    assert rounds[0][0] == node, rounds
    assert len(rounds[0]) == 2, rounds
