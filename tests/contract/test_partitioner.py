"""Partition ownership, on every backend (issue 19, item 2): every partition owned by one
member, balanced and sticky across joins and leaves, with a fence per partition that
increases from owner to owner; a partition taken away is released only after the work on
it ended; a lost session cancels the work and its partitions are owned again; run()
rejoins on a new session; bad input refused at the call; nothing left in the store."""

from __future__ import annotations

import contextlib
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import anyio
import pytest

import coord
from coord._core.keys import internal_name
from coord.testing import drop_key, expire_session

from ._recorder import Recorder

if TYPE_CHECKING:
    from collections.abc import Sequence

pytestmark = pytest.mark.anyio

P = 8


async def keys(client: coord.Client, name: str) -> list[str]:
    """Every waiter entry under *name*: members, the record, the partitions' locks."""
    names = await client.backend.names(name)
    return [e.key for n in names for e in (await client.backend.entries(n + "/")).entries]


async def settled(owners: Sequence[coord.Owner], partitions: int = P) -> list[frozenset[int]]:
    """Wait until *owners* own every partition between them, each once, balanced; return
    what each owns."""
    with anyio.fail_after(20):
        while True:
            owned = [owner.assignment.owned for owner in owners]
            every = [p for mine in owned for p in mine]
            share = partitions // len(owners)
            if sorted(every) == list(range(partitions)) and all(
                share <= len(mine) <= share + 1 for mine in owned
            ):
                return owned
            await anyio.sleep(0.02)


class Members:
    """Members joined in tasks of their own (a join is entered and left by one task)."""

    def __init__(self, tg: anyio.abc.TaskGroup, name: str = "parts") -> None:
        self._tg = tg
        self._name = name
        self.owners: dict[str, coord.Owner] = {}
        self._leave: dict[str, anyio.Event] = {}
        self.errors: list[BaseException] = []

    async def join(self, tag: str, client: coord.Client, partitions: int = P) -> coord.Owner:
        joined, leave = anyio.Event(), anyio.Event()
        self._leave[tag] = leave

        async def member() -> None:
            try:
                async with client.partitioner(self._name, partitions=partitions).join() as owner:
                    self.owners[tag] = owner
                    joined.set()
                    await leave.wait()
            except coord.CoordError as exc:
                self.errors.append(exc)
                joined.set()
            finally:
                self.owners.pop(tag, None)

        self._tg.start_soon(member)
        await joined.wait()
        return self.owners[tag]

    def leave(self, tag: str) -> None:
        self._leave[tag].set()


async def test_one_member_owns_every_partition_each_with_its_fence(
    clients: list[coord.Client],
) -> None:
    a = clients[0]
    partitioner = a.partitioner("solo", partitions=P)
    with anyio.fail_after(20):
        async with partitioner.join(b"me") as owner:
            [owned] = await settled([owner])
            assignment = owner.assignment
            assert owned == frozenset(range(P)) == assignment.assigned
            assert assignment.generation > 0
            assert len(set(assignment.fences.values())) == P
            for p in range(P):
                async with owner.partition(p) as hold:
                    assert isinstance(hold, coord.PartitionHold)
                    assert hold.partition == p
                    assert hold.fence == assignment.fence(p)
                    assert not hold.lost
            members = await partitioner.members()
            assert [m.id for m in members] == [owner.id]
            assert members[0].value == b"me"
            stored = await clients[1].partitioner("solo", partitions=P).assignment()
            assert stored == dict.fromkeys(range(P), owner.id)
    with anyio.fail_after(10):
        while await keys(clients[1], "solo"):  # noqa: ASYNC110  (the session's task deletes)
            await anyio.sleep(0.05)


async def test_joins_and_leaves_move_only_what_the_balance_needs(
    clients: list[coord.Client],
) -> None:
    a, b, c, _ = clients
    async with anyio.create_task_group() as tg:
        members = Members(tg)
        first = await members.join("a", a)
        [before] = await settled([first])
        second = await members.join("b", b)
        after = await settled([first, second])
        assert after[0] <= before, "a join takes from the others, gives nothing to them"
        assert len(after[1]) == P // 2
        third = await members.join("c", c)
        owned = await settled([first, second, third])
        moved = sum(len(was - now) for was, now in zip(after, owned[:2], strict=True))
        assert moved == len(owned[2]) == P // 3, "only the newcomer's share moves"
        for owner in (first, second, third):
            stats = owner.statistics()
            assert stats.lost == 0
            assert stats.taken - stats.released == stats.owned == len(owner.assignment.owned)
        assert first.statistics().released == P - len(owned[0])
        members.leave("b")
        left = await settled([first, third])
        assert owned[0] <= left[0]
        assert owned[2] <= left[1], "a leave moves only the leaver's partitions"
        fences = {p: first.assignment.fences.get(p) or third.assignment.fence(p) for p in range(P)}
        members.leave("a")  # the coordinator: the next in line takes over
        [final] = await settled([third])
        assert final == frozenset(range(P))
        for p in range(P):
            assert third.assignment.fence(p) >= fences[p]
            if p not in left[1]:
                assert third.assignment.fence(p) > fences[p], "a new owner, a higher fence"
        members.leave("c")
    assert not members.errors


async def test_a_partition_moves_only_after_the_work_on_it_ended(
    clients: list[coord.Client],
) -> None:
    a, b, _, _ = clients
    events: Recorder[tuple[str, int]] = Recorder()
    stopped: list[BaseException] = []

    async def work(owner: coord.Owner, p: int) -> None:
        try:
            async with owner.partition(p) as hold:
                events.append(("started", hold.fence))
                try:
                    await anyio.sleep_forever()
                finally:
                    with anyio.CancelScope(shield=True):
                        await anyio.sleep(0.3)  # a slow stop: the next owner waits for it
                        events.append(("stopped", hold.fence))
        except coord.PartitionLost as exc:
            stopped.append(exc)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            members = Members(tg, "moves")
            first = await members.join("a", a)
            await settled([first])
            for p in range(P):
                tg.start_soon(work, first, p)
            await events.wait_for(lambda items: len(items) == P)
            second = await members.join("b", b)
            _, theirs = await settled([first, second])
            for p in theirs:
                tg.start_soon(work, second, p)
            await events.wait_for(lambda items: len(items) == P + 2 * len(theirs))
            moves, moved = events.items[P:], list(stopped)
            members.leave("a")
            members.leave("b")
    assert len(moved) == len(theirs)
    assert all(isinstance(exc, coord.LockLost) for exc in moved)
    assert all("moved to another member" in str(exc) for exc in moved)
    # Each moved partition: the first owner stopped before the second started, and the
    # second owner's fence is higher.
    assert [kind for kind, _ in moves] == ["stopped"] * len(theirs) + ["started"] * len(theirs)
    old = sorted(fence for kind, fence in moves if kind == "stopped")
    new = sorted(fence for kind, fence in moves if kind == "started")
    assert min(new) > max(old)


async def test_a_lost_session_cancels_the_work_and_others_own_its_partitions(
    clients: list[coord.Client],
) -> None:
    a, b, _, _ = clients
    lost: list[BaseException] = []
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            members = Members(tg, "loss")
            survivor = await members.join("b", b)
            await settled([survivor])
            try:
                async with a.partitioner("loss", partitions=P).join() as owner:
                    mine, _ = await settled([owner, survivor])
                    p = min(mine)
                    try:
                        async with owner.partition(p) as hold:
                            await expire_session(a)
                            await anyio.sleep_forever()
                    except coord.PartitionLost as exc:
                        lost.append(exc)
                        assert hold.lost
                        raise
            except coord.LockLost as exc:
                lost.append(exc)
            assert owner.statistics().lost >= 1
            assert owner.statistics().owned == 0
            [everything] = await settled([survivor])
            assert everything == frozenset(range(P))
            assert survivor.assignment.fence(p) > hold.fence
            members.leave("b")
    assert [type(exc) for exc in lost][-1] in (coord.MembershipLost, coord.PartitionLost)
    assert any(isinstance(exc, coord.PartitionLost) for exc in lost)


async def test_run_works_every_owned_partition_and_rejoins_after_a_loss(
    clients: list[coord.Client],
) -> None:
    a, b, _, _ = clients
    holds: Recorder[coord.PartitionHold] = Recorder()

    async def work(hold: coord.PartitionHold) -> None:
        holds.append(hold)

    with anyio.fail_after(40):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: a.partitioner("run", partitions=P).run(work, cooldown=0.05))
            await holds.wait_for(lambda items: {h.partition for h in items} == set(range(P)))
            first_session = a.session
            await expire_session(a)
            await holds.wait_for(
                lambda items: (
                    {h.partition for h in items if h.session is not first_session} == set(range(P))
                )
            )
            tg.cancel_scope.cancel()
    with anyio.fail_after(10):
        while await keys(b, "run"):  # noqa: ASYNC110  (the session's task deletes)
            await anyio.sleep(0.05)


async def test_bad_input_is_refused_at_the_call(clients: list[coord.Client]) -> None:
    a = clients[0]
    for count in (0, -1, 10_001):
        with pytest.raises(coord.ConfigurationError):
            a.partitioner("bad", partitions=count)
    for wrong in ("8", 8.0, True):
        with pytest.raises(TypeError):
            a.partitioner("bad", partitions=wrong)  # type: ignore[arg-type]
    partitioner = a.partitioner("bad", partitions=P)
    with pytest.raises(TypeError):
        partitioner.partition_of(8)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        partitioner.join("text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await partitioner.run(None)  # type: ignore[arg-type]
    assert partitioner.partition_of("k") == partitioner.partition_of(b"k")
    async with partitioner.join() as owner:
        await settled([owner])
        with pytest.raises(coord.PartitionLost):
            async with owner.partition(P):
                pass  # pragma: no cover
        with pytest.raises(coord.ConfigurationError, match="every member must use the same"):
            async with clients[1].partitioner("bad", partitions=P + 1).join():
                await anyio.sleep_forever()
    with anyio.move_on_after(10):
        while await keys(a, "bad"):  # noqa: ASYNC110  (the session's task deletes)
            await anyio.sleep(0.05)
    assert await keys(a, "bad") == []


async def test_a_cancelled_join_or_owner_leaves_nothing(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    with anyio.CancelScope() as scope:
        scope.cancel()
        async with a.partitioner("gone", partitions=P).join():
            pytest.fail("joined in a cancelled scope")  # pragma: no cover
    with anyio.move_on_after(0.5):
        async with AsyncExitStack() as stack:
            owner = await stack.enter_async_context(a.partitioner("gone", partitions=P).join())
            await settled([owner])
            await anyio.sleep_forever()
    with anyio.fail_after(10):
        while await keys(b, "gone"):  # noqa: ASYNC110  (the session's task deletes)
            await anyio.sleep(0.05)


# -- found by an adversarial review ----------------------------------------------------


async def test_members_joining_together_settle(clients: list[coord.Client]) -> None:
    """Two members join a few ms apart: the first is given everything, then half moves.
    A partition taken away while its acquire was returning used to stay held, unworked."""
    a, b, _, _ = clients
    for trial, delay in enumerate((0, 0.003, 0.01, 0.02)):
        async with anyio.create_task_group() as tg:
            members = Members(tg, f"together{trial}")
            first = await members.join("a", a, partitions=64)
            await anyio.sleep(delay)
            second = await members.join("b", b, partitions=64)
            await settled([first, second], 64)
            members.leave("a")
            members.leave("b")
        assert not members.errors


async def test_a_partition_given_back_while_it_is_released_is_owned_again(
    clients: list[coord.Client],
) -> None:
    """Half moves away while the work on it is slow to stop, then comes back (the other
    member leaves): it is queued for again behind its own key, and owned."""
    a, b, _, _ = clients

    async def slow_work(owner: coord.Owner, p: int) -> None:
        with contextlib.suppress(coord.PartitionLost):
            async with owner.partition(p):
                try:
                    await anyio.sleep_forever()
                finally:
                    with anyio.CancelScope(shield=True):
                        await anyio.sleep(1.0)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            members = Members(tg, "flip")
            first = await members.join("a", a)
            await settled([first])
            for p in range(P):
                tg.start_soon(slow_work, first, p)
            await anyio.sleep(0.1)
            await members.join("b", b)
            while len(first.assignment.owned) == P:  # noqa: ASYNC110
                await anyio.sleep(0.01)
            members.leave("b")  # everything goes back to the first, still stopping work
            assert await settled([first]) == [frozenset(range(P))]
            tg.cancel_scope.cancel()


async def test_a_partition_whose_key_is_deleted_is_owned_again(
    clients: list[coord.Client],
) -> None:
    a = clients[0]
    async with a.partitioner("dropped", partitions=4).join() as owner:
        await settled([owner], 4)
        fence = owner.assignment.fence(2)
        with pytest.raises(coord.PartitionLost):
            async with owner.partition(2) as hold:
                await drop_key(a, hold.key)
                await anyio.sleep_forever()
        [owned] = await settled([owner], 4)
        assert owned == frozenset(range(4))
        assert owner.assignment.fence(2) > fence
        assert owner.statistics().lost == 1


async def test_names_under_the_partitioner_are_its_own_and_checked_at_the_call(
    clients: list[coord.Client],
) -> None:
    """A name whose partition locks' names would be too long is refused at the call (it
    used to fail in the session's task group, closing the client's session). A user
    cannot name the records' place; a foreign entry there (written by other means) is
    not a record: it is never deleted."""
    a, b, _, _ = clients
    with pytest.raises(coord.ConfigurationError, match="too long"):
        a.partitioner("n" * 500, partitions=100)
    a.partitioner("n" * 490, partitions=100)
    with pytest.raises(coord.ConfigurationError, match="'_assignment'"):
        b.mutex("col/_assignment")
    async with b.mutex(internal_name("col", "_assignment")) as other:
        async with a.partitioner("col", partitions=2).join() as owner:
            await settled([owner], 2)
        assert not other.lost


async def test_assignments_end_when_the_member_leaves_and_a_late_block_is_told(
    clients: list[coord.Client],
) -> None:
    a, b, _, _ = clients
    seen: Recorder[frozenset[int]] = Recorder()
    told: list[BaseException] = []

    async def follow(owner: coord.Owner) -> None:
        async for assignment in owner.assignments():
            seen.append(assignment.owned)

    async def stubborn(owner: coord.Owner, p: int) -> None:
        try:
            async with owner.partition(p):
                with anyio.CancelScope(shield=True):  # finishes its work, moved or not
                    await anyio.sleep(0.5)
        except coord.PartitionLost as exc:
            told.append(exc)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as outside:
            async with anyio.create_task_group() as tg:
                members = Members(tg, "ending")
                owner = await members.join("a", a)
                outside.start_soon(follow, owner)
                await settled([owner])
                outside.start_soon(stubborn, owner, P - 1)  # the highest moves first
                await anyio.sleep(0.1)
                await members.join("b", b)
                await seen.wait_for(lambda items: len(items[-1]) == P // 2)
                members.leave("a")
                members.leave("b")
            # The follower outside the block ends on its own (a task group would wait).
    assert seen.items[-1] == frozenset()
    assert len(told) == 1
    assert "moved to another member" in str(told[0])


async def test_run_raises_the_works_exception_itself(clients: list[coord.Client]) -> None:
    async def work(hold: coord.PartitionHold) -> None:
        raise ValueError(f"boom {hold.partition}")

    with anyio.fail_after(10), pytest.raises(ValueError, match="boom"):
        await clients[0].partitioner("raises", partitions=2).run(work)
    with anyio.fail_after(10):
        while await keys(clients[1], "raises"):  # noqa: ASYNC110  (the session's task deletes)
            await anyio.sleep(0.05)


async def test_a_member_that_rejoins_on_a_new_session_gets_a_share_and_others_keep_theirs(
    clients: list[coord.Client],
) -> None:
    """A member's session is lost; it joins again on the client's next session. The
    others keep what they owned (plus what the balance gives them while it is away), and
    when it is back it takes only its new share."""
    a, b, c, _ = clients
    with anyio.fail_after(40):
        async with anyio.create_task_group() as tg:
            members = Members(tg, "rejoin")
            steady = [await members.join("b", b), await members.join("c", c)]
            first = await members.join("a", a)
            before = await settled([*steady, first])
            old_session = a.session
            await expire_session(a)
            away = await settled(steady)  # the others own everything meanwhile
            for mine, was in zip(away, before[:2], strict=True):
                assert was <= mine, "a member that stays keeps what it had"
            while "a" in members.owners or a.session is old_session:  # noqa: ASYNC110
                await anyio.sleep(0.02)
            again = await members.join("a2", a)
            assert again.membership is not None
            assert again.membership.session is not old_session
            back = await settled([*steady, again])
            moved = sum(len(was - now) for was, now in zip(away, back[:2], strict=True))
            assert moved == len(back[2]), "only the newcomer's share moves"
            for tag in ("b", "c", "a2"):
                members.leave(tag)
    assert [type(e) for e in members.errors] == [coord.MembershipLost]


async def test_a_leave_wakes_each_member_once(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No herd: when one of four members leaves, the coordinator wakes once for the
    membership and each remaining member once for the new record (the leaver's successor
    also wakes once, for the member ahead of it: not counted here). If every member
    followed the membership too, each would wake twice."""
    from coord._membership import member as _owning

    wakes: list[str] = []
    follow_changes = _owning._next_change

    async def counted(backend: coord.abc.Backend, prefix: str, revision: int) -> None:
        await follow_changes(backend, prefix, revision)
        wakes.append(prefix.rpartition("/_assignment/")[1] or "members")

    monkeypatch.setattr(_owning, "_next_change", counted)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            members = Members(tg, "herd")
            owners = [await members.join(tag, c) for tag, c in zip("abcd", clients, strict=True)]
            await settled(owners)
            await anyio.sleep(0.3)  # every wake of the joins is over
            wakes.clear()
            members.leave("c")
            await settled([owners[0], owners[1], owners[3]])
            await anyio.sleep(0.3)
            counts = {kind: wakes.count(kind) for kind in set(wakes)}
            for tag in "abd":
                members.leave(tag)
    assert counts == {"/_assignment/": 3, "members": 1}, wakes


# -- found by a second adversarial review ----------------------------------------------


async def _slow_to_stop(owner: coord.Owner, p: int, release: anyio.Event) -> None:
    with contextlib.suppress(coord.PartitionLost):
        async with owner.partition(p):
            try:
                await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await release.wait()


@pytest.mark.parametrize("renew", [True, False])
async def test_a_waiting_key_deleted_by_someone_else_is_queued_again(
    clients: list[coord.Client], coord_url: str, renew: bool
) -> None:
    """A member queues for a partition behind its previous owner, whose work is slow to
    stop; its waiting key is deleted. It queues again (on a client that does not renew,
    the wait used to end as if the session had), and owns the partition in the end."""
    b = clients[1]
    release = anyio.Event()
    async with coord.connect(coord_url, ttl=5.0, renew=renew) as a:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                members = Members(tg, "waitdrop")
                first = await members.join("b", b, partitions=2)
                await settled([first], 2)
                for p in range(2):
                    tg.start_soon(_slow_to_stop, first, p, release)
                await anyio.sleep(0.1)
                second = await members.join("a", a, partitions=2)
                waiting: list[coord.abc.Entry] = []
                while not waiting:
                    for p in range(2):
                        listing = await a.backend.entries(f"waitdrop/_partitions/{p}/")
                        waiting += [e for e in listing.entries if e.lease == a.session.lease.id]
                    await anyio.sleep(0.02)
                await drop_key(a, waiting[0].key)
                await anyio.sleep(0.3)
                release.set()
                await settled([first, second], 2)
                tg.cancel_scope.cancel()


async def test_assigned_leaves_out_the_partitions_on_their_way_out(
    clients: list[coord.Client],
) -> None:
    a, b, _, _ = clients
    release = anyio.Event()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            members = Members(tg, "assigned")
            first = await members.join("a", a, partitions=4)
            await settled([first], 4)
            for p in range(4):
                tg.start_soon(_slow_to_stop, first, p, release)
            await anyio.sleep(0.1)
            await members.join("b", b, partitions=4)
            while len(first.assignment.owned) == 4:  # noqa: ASYNC110
                await anyio.sleep(0.01)
            # Two are on their way out (their work still stopping): not given any more.
            assert first.assignment.assigned == first.assignment.owned
            assert first.statistics().assigned == 2
            release.set()
            tg.cancel_scope.cancel()


async def _assigned(owner: coord.Owner, count: int) -> coord.Assignment:
    """The first assignment that gives *owner* *count* partitions."""
    async for assignment in owner.assignments():
        if len(assignment.assigned) == count:
            return assignment
    raise AssertionError("the membership ended")


async def test_entering_an_assigned_partition_waits_until_its_previous_owner_let_it_go(
    clients: list[coord.Client],
) -> None:
    """docs/partitions.md's first example entered a partition assigned but not yet owned
    and got PartitionLost on etcd and ZooKeeper (the memory store took it at once).
    Entering waits for such a partition; one that is not assigned is refused at once."""
    a, b, _, _ = clients
    go = anyio.Event()
    events: Recorder[tuple[str, int, int]] = Recorder()

    async def slow(owner: coord.Owner, p: int) -> None:  # the first owner: stops at "go"
        with contextlib.suppress(coord.PartitionLost):
            async with owner.partition(p) as hold:
                events.append(("working", p, hold.fence))
                try:
                    await anyio.sleep_forever()
                finally:
                    with anyio.CancelScope(shield=True):
                        await go.wait()
                        events.append(("stopped", p, hold.fence))

    async def enter(owner: coord.Owner, p: int) -> None:
        async with owner.partition(p) as hold:
            events.append(("started", p, hold.fence))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            members = Members(tg, "wait-own")
            first = await members.join("a", a)
            await settled([first])
            for p in range(P):
                tg.start_soon(slow, first, p)
            await events.wait_for(lambda items: len(items) == P)
            second = await members.join("b", b)
            assignment = await _assigned(second, P // 2)
            theirs = sorted(assignment.assigned)
            assert assignment.owned == frozenset()  # the first's blocks still run
            for p in theirs:
                tg.start_soon(enter, second, p)
            mine = min(set(range(P)) - set(theirs))
            with pytest.raises(coord.PartitionLost, match="does not give it to this member"):
                async with second.partition(mine):
                    pass
            await anyio.sleep(0.3)  # the entering blocks wait: nothing may start
            assert len(events) == P
            go.set()
            await events.wait_for(lambda items: sum(e[0] == "started" for e in items) == P // 2)
            members.leave("a")
            members.leave("b")
    moves = [e for e in events.items[P:] if e[1] in theirs]
    for p in theirs:
        (stopped,) = [e for e in moves if e[:2] == ("stopped", p)]
        (started,) = [e for e in moves if e[:2] == ("started", p)]
        assert moves.index(stopped) < moves.index(started)
        assert started[2] > stopped[2]


async def test_a_block_waiting_for_its_partition_is_told_when_the_member_leaves(
    clients: list[coord.Client],
) -> None:
    a, b, _, _ = clients
    told: Recorder[str] = Recorder()

    async def hold_on(owner: coord.Owner, p: int) -> None:  # the first owner: a slow stop
        with contextlib.suppress(coord.PartitionLost):  # (told that it moved, at the end)
            async with owner.partition(p):
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(1.0)

    async def enter(owner: coord.Owner, p: int) -> None:
        try:
            async with owner.partition(p):
                told.append("entered")
        except coord.PartitionLost as exc:
            told.append(str(exc))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            members = Members(tg, "wait-leave")
            first = await members.join("a", a, partitions=2)
            await settled([first], 2)
            for p in range(2):
                tg.start_soon(hold_on, first, p)
            await anyio.sleep(0.1)
            second = await members.join("b", b, partitions=2)
            (theirs,) = (await _assigned(second, 1)).assigned
            tg.start_soon(enter, second, theirs)
            await anyio.sleep(0.2)
            assert told.items == []
            members.leave("b")
            await told.wait_for(lambda items: len(items) == 1)
            members.leave("a")
    assert "the member left the group" in told.items[0]
