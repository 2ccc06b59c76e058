"""The backend contract (coord/abc.py), call by call, on every backend: the same calls
must give the same answers on memory, etcd and ZooKeeper (issue 7: they used to differ on
watch, entries, the lease of a re-written key, and lost history)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import pytest

import coord
from coord._core.keys import new_waiter_id, new_waiter_id_of, waiter_id_of
from coord.abc import Backend, ChangeKind, Create, Lease, Position
from coord.testing import compact, drop_key, expire_session

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from coord.abc import Change

pytestmark = pytest.mark.anyio


def wid(kind: str = "") -> str:
    return f"@{kind}{uuid.uuid4().hex}"


def parts(clients: list[coord.Client]) -> tuple[Backend, Lease, Backend, Lease]:
    a, b = clients[0], clients[1]
    return a.backend, a.session.lease, b.backend, b.session.lease


async def test_register_and_position(clients: list[coord.Client]) -> None:
    backend, lease, other, other_lease = parts(clients)
    first = await backend.register("c/reg/", wid("w"), lease, value=b"1")
    assert first.is_head
    assert first.entry.value == b"1"
    assert first.entry.lease == lease.id
    second = await other.register("c/reg/", wid("r"), other_lease, ahead=None)
    assert [e.key for e in second.ahead] == [first.entry.key]
    third = await backend.register("c/reg/", wid("r"), lease, ahead=None)
    assert [e.key for e in third.ahead] == [second.entry.key, first.entry.key]
    # kind: only the entries ahead whose waiter id starts with it
    only_writers = await backend.position(third.entry, ahead=None, kind="@w")
    assert [e.key for e in only_writers.ahead] == [first.entry.key]
    assert (await backend.position(third.entry, ahead=1)).ahead == (second.entry,)
    fourth = await backend.register("c/reg/", wid("w"), lease, ahead=5, kind="@r")
    assert [e.key for e in fourth.ahead] == [third.entry.key, second.entry.key]
    assert first.entry.revision < second.entry.revision < third.entry.revision
    await drop_key(clients[0], second.entry.key)
    with pytest.raises(coord.EntryGoneError):
        await backend.position(second.entry)


async def test_a_waiter_id_reads_back_from_its_key_whatever_the_store_adds(
    clients: list[coord.Client],
) -> None:
    """A store may put an order number before a waiter id and a suffix after it (and
    rename the entry: a long ZooKeeper queue's nodes move into shards), never change the
    id: a group member's id is read back from its key this way, on every store."""
    backend, lease, *_ = parts(clients)
    ids = [new_waiter_id() for _ in range(3)]
    registered = [(await backend.register("c/ids/", i, lease)).entry for i in ids]
    assert [new_waiter_id_of(e.key) for e in registered] == ids
    listed = (await backend.entries("c/ids/")).entries
    assert [new_waiter_id_of(e.key) for e in listed] == ids


@pytest.mark.parametrize("checkpoints", [0, 1, 2, 3, 5, 8])
async def test_a_repeat_after_an_unanswered_registration_makes_no_second_entry(
    clients: list[coord.Client], checkpoints: int
) -> None:
    """A registration cancelled wherever it was (not sent, in flight, answered but not
    returned), then registered again with its waiter id: one entry, the repeat's."""
    backend, lease, *_ = parts(clients)
    prefix, waiter = f"c/repeat{checkpoints}/", wid("w")
    ahead = await backend.register(prefix, wid("w"), lease)
    returned: list[Position] = []

    async def register() -> None:
        returned.append(await backend.register(prefix, waiter, lease))

    async with anyio.create_task_group() as tg:
        tg.start_soon(register)
        for _ in range(checkpoints):
            await anyio.lowlevel.checkpoint()
        tg.cancel_scope.cancel()
    listed = (await backend.entries(prefix)).entries
    if returned:
        # Answered and returned within the checkpoints (a fast store, a busy loop): no
        # repeat then (registering an answered waiter id again is the caller's error).
        assert [e for e in listed if waiter_id_of(e.key).startswith(waiter)] == [returned[0].entry]
        return
    again = await backend.register(prefix, waiter, lease)
    listed = (await backend.entries(prefix)).entries
    mine = [e for e in listed if waiter_id_of(e.key).startswith(waiter)]
    assert mine == [again.entry]
    assert [e.key for e in again.ahead] == [ahead.entry.key]


async def test_find_an_entry_by_its_waiter_id(clients: list[coord.Client]) -> None:
    """find() names the entry registered (or created in a transaction) with a waiter id,
    on the lease given: durable entries with None; nothing for an id never used, for
    another lease's entry, or once the entry is deleted."""
    backend, lease, other, other_lease = parts(clients)
    mine, durable, made = wid("f"), wid("d"), wid("t")
    registered = (await backend.register("c/find/", mine, lease, value=b"1")).entry
    kept = (await backend.register("c/find/", durable, None, value=b"2")).entry
    created = await backend.transact([Create("c/find/", made, b"3")])
    assert created is not None
    assert await other.find("c/find/", mine, lease) == registered
    assert await other.find("c/find/", durable, None) == kept
    assert await backend.find("c/find/", made, None) == created[0]
    assert await backend.find("c/find/", mine, None) is None  # bound to a lease
    assert await other.find("c/find/", mine, other_lease) is None  # another lease's
    assert await backend.find("c/find/", wid("f"), lease) is None  # never registered
    assert await backend.find("c/nothing-here/", mine, lease) is None
    await backend.delete(kept)
    assert await backend.find("c/find/", durable, None) is None


async def test_a_wait_as_an_exclusive_waiter_returns_only_a_true_position(
    clients: list[coord.Client],
) -> None:
    """``wait_deleted(..., entry=)`` means the same on every store: None ("read"), or a
    position with nothing ahead of my entry, which a read confirms (etcd proves it from
    the hand-over; memory and ZooKeeper return None). Once in turn, and once after the
    entry ahead left out of turn (then never a position: another holds ahead)."""
    backend, lease, other, other_lease = parts(clients)
    for out_of_turn in (False, True):
        prefix = f"c/excl{int(out_of_turn)}/"
        first = await other.register(prefix, wid(), other_lease)
        ahead = await other.register(prefix, wid(), other_lease) if out_of_turn else first
        mine = await backend.register(prefix, wid(), lease)
        assert [e.key for e in mine.ahead] == [ahead.entry.key]
        result: list[Position | None] = []

        async def wait(
            ahead: Position = ahead, mine: Position = mine, result: list[Position | None] = result
        ) -> None:
            keys = [ahead.entry.key]
            result.append(
                await backend.wait_deleted(keys, revision=mine.revision, entry=mine.entry)
            )

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await anyio.sleep(0.2)
                assert await other.delete(ahead.entry)
        (proven,) = result
        read = await backend.position(mine.entry)
        if proven is not None:
            assert not out_of_turn
            assert proven.entry == mine.entry
            assert proven.is_head
        assert read.is_head is not out_of_turn
        await backend.delete(mine.entry)
        if out_of_turn:
            await other.delete(first.entry)


async def test_wait_deleted_and_wait_changed(clients: list[coord.Client]) -> None:
    backend, lease, other, _ = parts(clients)
    position = await backend.register("c/wait/", wid(), lease, value=b"v")
    entry = position.entry
    gone = await backend.register("c/wait/", wid(), lease)
    await backend.delete(gone.entry)
    with anyio.fail_after(10):
        # Deleted after the revision it was read at: returns at once.
        await other.wait_deleted([gone.entry.key], revision=gone.revision)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: other.wait_changed(entry, revision=position.revision))
            await anyio.sleep(0.2)
            updated = await backend.compare_and_set(
                entry.key, b"v2", version=entry.version, lease=lease
            )
        assert updated is not None
        # Already different from the entry given: returns at once.
        await other.wait_changed(entry, revision=position.revision)
        read = await other.get(entry.key)
        assert read == updated
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: other.wait_changed(updated, revision=updated.version))
            tg.start_soon(lambda: other.wait_deleted([entry.key], revision=updated.version))
            await anyio.sleep(0.2)
            assert await backend.delete(updated)


async def test_wait_deleted_on_many_keys_read_before_a_write(
    clients: list[coord.Client],
) -> None:
    """A semaphore of limit n waits on the n entries ahead of it (up to 1000): a wait on
    that many keys, read before a write, waits (its check of the keys fits the store's
    transactions: etcd takes 128 operations in one), and returns once one of them goes."""
    backend, lease, other, _ = parts(clients)
    prefix = "c/many/"
    ahead = [await backend.register(prefix, wid(), lease, ahead=0) for _ in range(150)]
    read = await other.entries(prefix)
    assert len(read.entries) == 150
    await backend.put("c/many-noise", b"a write after the read")
    keys = [position.entry.key for position in ahead]
    with anyio.move_on_after(0.5) as waited:
        await other.wait_deleted(keys, revision=read.revision)
    assert waited.cancelled_caught  # none of them went: it waits
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: other.wait_deleted(keys, revision=read.revision))
            await anyio.sleep(0.2)
            assert await backend.delete(ahead[-1].entry)


async def test_guard_calls_back_once_when_the_key_goes(clients: list[coord.Client]) -> None:
    """guard(): a callback, once, when the key is deleted after the revision it was read
    at (by anyone), soon when it is gone already, and never after it is stopped; no task
    of the caller's waits meanwhile."""
    backend, lease, other, _ = parts(clients)
    fired: dict[str, anyio.Event] = {name: anyio.Event() for name in ("kept", "gone", "old")}
    calls: list[str] = []

    def on(name: str) -> Callable[[], None]:
        def call() -> None:
            calls.append(name)
            fired[name].set()

        return call

    kept = await backend.register("c/guard/", wid(), lease)
    gone = await backend.register("c/guard/", wid(), lease)
    stopped = await backend.register("c/guard/", wid(), lease)
    stop_kept = other.guard(kept.entry.key, revision=kept.revision, on_change=on("kept"))
    other.guard(gone.entry.key, revision=gone.revision, on_change=on("gone"))
    stop = other.guard(stopped.entry.key, revision=stopped.revision, on_change=on("stopped"))
    stop()
    stop()  # idempotent
    await anyio.sleep(0.3)  # the guards are armed by the backend's own tasks
    assert calls == []
    with anyio.fail_after(10):
        assert await backend.delete(gone.entry)
        await fired["gone"].wait()
        assert await backend.delete(stopped.entry)
        await backend.delete(kept.entry)
        await fired["kept"].wait()
        # A key deleted after the revision it was read at: called back soon, not now.
        other.guard(gone.entry.key, revision=gone.revision, on_change=on("old"))
        assert "old" not in calls
        await fired["old"].wait()
    await anyio.sleep(0.3)
    stop_kept()  # after its call: nothing happens
    assert sorted(calls) == ["gone", "kept", "old"]


async def test_delete_is_guarded(clients: list[coord.Client]) -> None:
    backend, lease, other, _ = parts(clients)
    entry = (await backend.register("c/del/", wid(), lease)).entry
    assert await backend.delete(entry) is True
    assert await backend.delete(entry) is False
    assert await other.get(entry.key) is None
    # A provisional entry (registration outcome unknown) is found by its id and lease.
    waiter_id = wid()
    await backend.register("c/del/", waiter_id, lease)
    provisional = coord.abc.Entry("c/del/" + waiter_id, lease=lease.id)
    assert await backend.delete(provisional) is True
    assert (await backend.entries("c/del/")).entries == ()


async def test_put_and_compare_and_set_keep_a_keys_lease(clients: list[coord.Client]) -> None:
    backend, lease, _, _ = parts(clients)
    bound = await backend.put("c/plain/bound", b"1", lease=lease)
    assert bound.lease == lease.id
    rewritten = await backend.put("c/plain/bound", b"2")
    assert (rewritten.value, rewritten.lease) == (b"2", lease.id), "a re-write moved the lease"
    assert rewritten.revision == bound.revision
    assert rewritten.version != bound.version
    free = await backend.put("c/plain/free", b"1")
    assert free.lease == 0
    assert (await backend.put("c/plain/free", b"2", lease=lease)).lease == 0
    assert await backend.compare_and_set("c/plain/free", b"x", version=None) is None
    stale = await backend.compare_and_set("c/plain/free", b"x", version=free.version)
    assert stale is None, "compare_and_set ignored the version"
    current = await backend.get("c/plain/free")
    assert current is not None
    done = await backend.compare_and_set("c/plain/free", b"3", version=current.version)
    assert done is not None
    assert done.value == b"3"
    created = await backend.compare_and_set("c/plain/new", b"n", version=None, lease=lease)
    assert created is not None
    assert created.lease == lease.id
    # A waiter entry updated by version keeps its creation revision and its lease.
    entry = (await backend.register("c/plain/", wid(), lease, value=b"a")).entry
    updated = await backend.compare_and_set(entry.key, b"b", version=entry.version)
    assert updated is not None
    assert (updated.revision, updated.lease, updated.value) == (entry.revision, lease.id, b"b")


async def test_plain_writes_never_make_waiter_keys(clients: list[coord.Client]) -> None:
    backend, lease, _, _ = parts(clients)
    for key in ("c/nowaiter/@x", "c/nowaiter/@x/y"):
        with pytest.raises(coord.ConfigurationError, match="register"):
            await backend.put(key, b"")
        with pytest.raises(coord.ConfigurationError, match="register"):
            await backend.compare_and_set(key, b"", version=None, lease=lease)
    assert (await backend.entries("c/nowaiter/")).entries == ()
    assert await backend.get("c/nowaiter/@x") is None


async def test_entries_lists_only_the_registered_entries_of_the_prefix(
    clients: list[coord.Client],
) -> None:
    backend, lease, other, other_lease = parts(clients)
    a = await backend.register("c/list/", wid(), lease)
    await backend.register("c/list/sub/", wid(), lease)  # a nested name's waiter
    await backend.put("c/list/plain", b"")
    b = await other.register("c/list/", wid(), other_lease)
    listing = await other.entries("c/list/")
    assert [e.key for e in listing.entries] == [a.entry.key, b.entry.key]
    assert [e.key for e in (await other.entries("c/list/", limit=1)).entries] == [a.entry.key]
    # The listing's revision is the store's (an etcd waiter's creation order is not one:
    # its store revision times 64 plus its place in its batch).
    assert listing.revision >= b.revision > 0  # listed after b's registration was read
    assert a.entry.revision < b.entry.revision


async def test_a_listing_that_may_be_stale_is_a_state_the_store_had(
    clients: list[coord.Client],
) -> None:
    """``entries(stale_ok=True)`` (etcd's serializable read) lists what the same read
    without it lists once the writes are acknowledged on this member, at a revision from
    which a watch misses nothing."""
    backend, lease, other, other_lease = parts(clients)
    a = await backend.register("c/stale/", wid(), lease, value=b"a")
    b = await other.register("c/stale/", wid(), other_lease, value=b"b")
    fresh = await other.entries("c/stale/")
    stale = await other.entries("c/stale/", stale_ok=True)
    assert [e.key for e in stale.entries] == [e.key for e in fresh.entries]
    assert [e.key for e in stale.entries] == [a.entry.key, b.entry.key]
    assert stale.revision >= b.revision
    with anyio.fail_after(10):
        async with other.watch("c/stale/", revision=stale.revision) as changes:
            await backend.delete(a.entry)
            deleted = await changes.__anext__()
            assert (deleted.kind, deleted.entry.key) == (ChangeKind.DELETE, a.entry.key)
    limited = await other.entries("c/stale/", limit=1, stale_ok=True)
    assert [e.key for e in limited.entries] == [b.entry.key]


async def test_watch_reports_creations_and_deletions_only(clients: list[coord.Client]) -> None:
    backend, lease, other, _ = parts(clients)
    listing = await other.entries("c/watch/")

    async def quiet(changes: AsyncIterator[Change]) -> None:
        with anyio.move_on_after(0.3) as nothing:
            extra = await changes.__anext__()
            pytest.fail(f"reported more than creations and deletions: {extra}")
        assert nothing.cancelled_caught

    with anyio.fail_after(10):
        async with other.watch("c/watch/", revision=listing.revision) as changes:
            entry = (await backend.register("c/watch/", wid(), lease, value=b"a")).entry
            created = await changes.__anext__()
            assert (created.kind, created.entry.key) == (ChangeKind.PUT, entry.key)
            await backend.compare_and_set(entry.key, b"b", version=entry.version)  # a value
            await backend.register("c/watch/sub/", wid(), lease)  # a nested name's waiter
            await quiet(changes)
            await backend.delete(entry)
            deleted = await changes.__anext__()
            assert (deleted.kind, deleted.entry.key) == (ChangeKind.DELETE, entry.key)
            await quiet(changes)


async def test_watch_never_misses_an_entry_that_came_and_went(
    clients: list[coord.Client],
) -> None:
    """Created and deleted between two looks: named (etcd, memory), or ResyncNeeded
    (ZooKeeper cannot name it): never silence."""
    backend, lease, other, _ = parts(clients)
    listing = await other.entries("c/flash/")
    keys = []
    with anyio.fail_after(10):
        async with other.watch("c/flash/", revision=listing.revision) as changes:
            for _ in range(3):
                entry = (await backend.register("c/flash/", wid(), lease)).entry
                await backend.delete(entry)
                keys.append(entry.key)
            seen: list[tuple[ChangeKind, str]] = []
            try:
                while len(seen) < 6:
                    change = await changes.__anext__()
                    seen.append((change.kind, change.entry.key))
            except coord.ResyncNeeded:
                return
    expected = [(kind, key) for key in keys for kind in (ChangeKind.PUT, ChangeKind.DELETE)]
    assert seen == expected


async def test_watch_from_lost_history_raises_resync_needed(
    clients: list[coord.Client],
) -> None:
    backend, lease, other, _ = parts(clients)
    listing = await other.entries("c/resync/")
    await backend.register("c/resync/", wid(), lease)
    await backend.delete((await backend.register("c/resync/", wid(), lease)).entry)
    await compact(clients[0])
    with anyio.fail_after(10):
        async with other.watch("c/resync/", revision=listing.revision) as changes:
            with pytest.raises(coord.ResyncNeeded):
                await changes.__anext__()
        fresh = await other.entries("c/resync/")
        assert len(fresh.entries) == 1
        async with other.watch("c/resync/", revision=fresh.revision) as changes:
            await backend.delete(fresh.entries[0])
            change = await changes.__anext__()
            assert change.kind is ChangeKind.DELETE


# -- durable entries and transactions (the queue's part of the contract, issue 8) ---------


async def test_durable_entries_outlive_their_session(clients: list[coord.Client]) -> None:
    backend, lease, other, _ = parts(clients)
    durable = await backend.register("c/dur/", wid("j"), None, value=b"job", ahead=0)
    bound = await backend.register("c/dur/", wid("j"), lease, ahead=0)
    assert durable.ahead == ()
    assert durable.entry.lease == 0
    assert durable.entry.value == b"job"
    repeated = wid("j")
    first = await backend.register("c/dur/", repeated, None, ahead=0)
    assert (await backend.register("c/dur/", repeated, None, ahead=0)).entry == first.entry
    await expire_session(clients[0])  # the lease goes, and its entries with it
    listing = await other.entries("c/dur/")
    assert [e.key for e in listing.entries] == [durable.entry.key, first.entry.key]
    assert bound.entry.key not in {e.key for e in listing.entries}


async def test_transact_is_all_or_nothing(clients: list[coord.Client]) -> None:
    from coord.abc import Create, Remove, Update

    other, other_lease, backend, lease = parts(clients)
    job = (await other.register("c/tx/jobs/", wid("j"), None, value=b"v0", ahead=0)).entry
    claim_id = wid("c")
    done = await backend.transact(
        [Update(job, b"v1"), Create("c/tx/claims/", claim_id, b"me", lease=lease)]
    )
    assert done is not None
    updated, claim = done
    assert updated is not None
    assert claim is not None
    assert (updated.key, updated.value, updated.revision) == (job.key, b"v1", job.revision)
    assert updated.version != job.version
    assert claim.lease == lease.id
    assert claim.value == b"me"
    assert claim.key.startswith("c/tx/claims/" + claim_id)
    assert claim.revision > job.revision
    assert await other.get(claim.key) == claim
    assert await backend.get(job.key) == updated
    # The old version of the job is a failed guard: nothing else happens either.
    stale = await other.transact(
        [Update(job, b"zombie"), Create("c/tx/claims/", wid("c"), b"", lease=other_lease)]
    )
    assert stale is None
    assert [e.key for e in (await backend.entries("c/tx/claims/")).entries] == [claim.key]
    assert (await backend.get(job.key)) == updated
    # A removed guard entry fails the whole transaction.
    await backend.delete(claim)
    assert await backend.transact([Remove(updated), Remove(claim)]) is None
    assert await backend.get(job.key) == updated
    # Everything guarded holds: all of it happens, at one new revision.
    claim2 = (await backend.register("c/tx/claims/", wid("c"), lease, ahead=0)).entry
    moved = await backend.transact(
        [Remove(updated), Remove(claim2), Create("c/tx/dead/", wid("d"), b"dl", None)]
    )
    assert moved is not None
    dead = moved[2]
    assert dead is not None
    assert moved[:2] == (None, None)
    assert dead.lease == 0
    assert await backend.get(job.key) is None
    assert await backend.get(claim2.key) is None
    assert [e.key for e in (await other.entries("c/tx/dead/")).entries] == [dead.key]


async def test_transact_creates_in_order_and_reports_creations(
    clients: list[coord.Client],
) -> None:
    from coord.abc import Create

    backend, lease, other, _ = parts(clients)
    listing = await other.entries("c/txw/")
    with anyio.fail_after(10):
        async with other.watch("c/txw/", revision=listing.revision) as changes:
            first = (await backend.register("c/txw/", wid(), None, ahead=0)).entry
            done = await backend.transact([Create("c/txw/", wid(), b"x", lease=lease)])
            assert done is not None
            second = done[0]
            assert second is not None
            assert second.revision > first.revision
            keys = [(await changes.__anext__()).entry.key for _ in range(2)]
            assert keys == [first.key, second.key]
    assert [e.key for e in (await other.entries("c/txw/")).entries] == [first.key, second.key]


async def test_transact_refuses_bad_requests_before_sending(clients: list[coord.Client]) -> None:
    from coord.abc import Create, Entry, Remove, Update

    backend, lease, _, _ = parts(clients)
    entry = (await backend.register("c/txbad/", wid(), lease)).entry
    plain = await backend.put("c/txbad/plain", b"")
    bad: list[list[coord.abc.Op]] = [
        [],
        [Update(plain, b"")],
        [Remove(Entry("c/txbad/@x"))],  # provisional
        [Update(entry, b""), Remove(entry)],
        [Create("c/txbad", wid(), b"")],
        [Create("c/txbad/", "nomark", b"")],
        [Update(entry, b"x" * (backend.max_value_size + 1))],
    ]
    for ops in bad:
        with pytest.raises(coord.ConfigurationError):
            await backend.transact(ops)
    with pytest.raises(TypeError, match="bytes"):
        await backend.transact([Update(entry, "text")])  # type: ignore[arg-type]
    assert await backend.get(entry.key) == entry
    with pytest.raises(coord.ConfigurationError, match="at most"):
        await backend.register("c/txbad/", wid(), None, value=b"x" * (backend.max_value_size + 1))
    assert [e.key for e in (await backend.entries("c/txbad/")).entries] == [entry.key]


async def test_transact_with_a_lost_lease_writes_nothing(clients: list[coord.Client]) -> None:
    from coord.abc import Create, Update

    backend, lease, other, _ = parts(clients)
    job = (await other.register("c/txlost/", wid("j"), None, ahead=0)).entry
    await expire_session(clients[0])
    # A lost lease is one the client knows is lost. Before it knows (ZooKeeper learns of
    # the expiry on reconnecting), a request may also fail as BackendUnavailable.
    with anyio.fail_after(30):
        await lease.wait_lost()
    with pytest.raises(coord.SessionExpiredError):
        await backend.transact([Update(job, b"x"), Create("c/txlost/", wid("c"), lease=lease)])
    assert await other.get(job.key) == job


async def test_transact_check_guards_and_put_writes_plain_keys(
    clients: list[coord.Client],
) -> None:
    from coord.abc import Check, Put, Update

    backend, lease, other, _ = parts(clients)
    mine = (await backend.register("c/txcheck/", wid(), lease, value=b"a")).entry
    # A Put creates a plain key (and its parents), then sets it; a Check writes nothing.
    assert await backend.transact([Check(mine), Put("c/data/x/y", b"1")]) == (None, None)
    assert await backend.transact([Put("c/data/x/y", b"2"), Check(mine)]) == (None, None)
    written = await other.get("c/data/x/y")
    assert written is not None
    assert written.value == b"2"
    assert written.lease == 0
    assert await backend.get(mine.key) == mine
    # A Check ignores the version: only the same entry (creation revision) counts.
    done = await backend.transact([Update(mine, b"b")])
    assert done is not None
    assert await backend.transact([Check(mine), Put("c/data/x/y", b"3")]) == (None, None)
    # Once the entry is gone the guard fails, and nothing is written.
    await drop_key(clients[0], mine.key)
    assert await backend.transact([Check(mine), Put("c/data/x/y", b"4")]) is None
    assert await backend.transact([Put("c/data/x/new", b"4"), Check(mine)]) is None
    assert (await other.get("c/data/x/y")) == await backend.get("c/data/x/y")
    assert (await other.get("c/data/x/y")).value == b"3"  # type: ignore[union-attr]
    assert await other.get("c/data/x/new") is None
    with pytest.raises(coord.ConfigurationError):
        await backend.transact([Put("c/data/@x", b"")])


async def test_names(clients: list[coord.Client]) -> None:
    backend, lease, other, _ = parts(clients)
    for name in ("c/names/a", "c/names/a/b/c", "c/names/ab", "c/other"):
        await backend.register(f"{name}/", wid("w"), lease)
    await backend.put("c/names/plain/key", b"")  # a plain key is not a name
    assert await other.names("c/names") == ["c/names/a", "c/names/a/b/c", "c/names/ab"]
    assert await other.names("c/names/a") == ["c/names/a", "c/names/a/b/c"]
    assert await other.names("c/names/a/b") == ["c/names/a/b/c"]
    assert await other.names("c/none") == []
    assert {"c/names/a", "c/other"} <= set(await other.names())
    await lease.revoke()
    assert await other.names("c/names") == []
