"""The Election conformance suite, run on every backend: order and fences, confirmation,
loss (body cancelled, LeadershipLost), resign, proclaim, cancelled campaigns, observe and
the run() supervisor. Each test is written against a bug of etcd's Election, Curator's
LeaderLatch, kazoo's Election or client-go's leader election (issue 7)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import pytest

import coord
from coord.testing import drop_key, expire_session, wait_for_waiters
from coord.testing._faults import _wait_for_queue as wait_for_queue

from ._recorder import Recorder

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from anyio.abc import ObjectReceiveStream, ObjectSendStream

pytestmark = pytest.mark.anyio


async def candidate_keys(client: coord.Client, name: str) -> list[str]:
    return [e.key for e in (await client.backend.entries(name + "/")).entries]


async def test_candidates_lead_in_order_with_increasing_fences(
    clients: list[coord.Client],
) -> None:
    led: Recorder[tuple[bytes, int]] = Recorder()
    release = [anyio.Event() for _ in clients]

    async def candidate(i: int) -> None:
        async with clients[i].election("order").campaign(b"c%d" % i) as term:
            assert term.value == b"c%d" % i
            leader = await clients[i].election("order").leader()
            assert leader == coord.Leader(term.key, term.value, term.fence)
            led.append((term.value, term.fence))
            await release[i].wait()

    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(candidate, i)
                await wait_for_waiters(clients[0], "order", i + 1)
            for i in range(4):
                await led.wait_for(lambda items: len(items) > i)  # noqa: B023
                assert [v for v, _ in led.items] == [b"c%d" % j for j in range(i + 1)]
                release[i].set()
    fences = [f for _, f in led.items]
    assert fences == sorted(set(fences)), "fences must strictly increase from term to term"
    assert await clients[0].election("order").leader() is None
    assert await candidate_keys(clients[0], "order") == []


@pytest.mark.parametrize("fault", ["session expired", "key deleted"])
async def test_loss_cancels_the_leader_and_raises_leadership_lost(
    clients: list[coord.Client], fault: str
) -> None:
    a, b, _, _ = clients
    reached = False
    with anyio.fail_after(15):
        with pytest.raises(coord.LeadershipLost) as raised:
            async with a.election("loss").campaign(b"a") as term:
                if fault == "key deleted":
                    await drop_key(a, term.key)
                else:
                    await expire_session(a)
                await anyio.sleep_forever()
                reached = True
        assert isinstance(raised.value, coord.LockLost)
        assert not reached
        assert term.lost
        # Nobody stays in charge by mistake: the next candidate leads.
        async with b.election("loss").campaign(b"b") as next_term:
            assert next_term.fence > term.fence
            leader = await b.election("loss").leader()
            assert leader is not None
            assert leader.value == b"b"


async def test_loss_then_exit_without_checkpoint_is_leadership_lost(
    clients: list[coord.Client],
) -> None:
    a = clients[0]
    with anyio.fail_after(10), pytest.raises(coord.LeadershipLost):
        async with a.election("silent").campaign(b"a") as term:
            await drop_key(a, term.key)
            with anyio.CancelScope(shield=True):  # no cancellation point after this
                await term.wait_lost()


async def test_resign_deletes_the_key_and_hands_over(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    followed: list[int] = []

    async def follower() -> None:
        async with b.election("resign").campaign(b"b") as term:
            followed.append(term.fence)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            async with a.election("resign").campaign(b"a") as term:
                tg.start_soon(follower)
                await wait_for_waiters(a, "resign", 2)
                assert (await candidate_keys(a, "resign"))[0] == term.key
                assert followed == []
    assert followed
    assert followed[0] > term.fence
    assert await candidate_keys(a, "resign") == []
    assert term.released
    assert not term.lost


async def test_proclaim_changes_the_value_only_while_leading(
    clients: list[coord.Client],
) -> None:
    a, b, _, _ = clients
    election = a.election("proclaim")
    async with election.campaign(b"one") as term:
        await term.proclaim(b"two")
        assert term.value == b"two"
        leader = await b.election("proclaim").leader()
        assert leader == coord.Leader(term.key, b"two", term.fence)
        await term.proclaim(b"three")
        assert (await election.leader()) == coord.Leader(term.key, b"three", term.fence)
    with pytest.raises(coord.LeadershipLost, match="ended"):
        await term.proclaim(b"late")
    with anyio.fail_after(10), pytest.raises(coord.LeadershipLost):
        async with election.campaign(b"one") as term:
            await drop_key(a, term.key)
            with anyio.CancelScope(shield=True):  # the body is cancelled; proclaim refuses
                with pytest.raises(coord.LeadershipLost):
                    await term.proclaim(b"zombie")
    assert await election.leader() is None


async def test_a_cancelled_campaign_leaves_no_key(clients: list[coord.Client]) -> None:
    a, b, _, _ = clients
    async with a.election("cancel").campaign(b"a"):
        with anyio.move_on_after(10):
            async with anyio.create_task_group() as tg:

                async def hopeless() -> None:
                    async with b.election("cancel").campaign(b"b"):
                        pytest.fail("led while another leads")

                tg.start_soon(hopeless)
                await wait_for_waiters(a, "cancel", 2)
                tg.cancel_scope.cancel()
        with anyio.fail_after(10):
            await wait_for_queue(a, "cancel", lambda n: n == 1)
    assert await candidate_keys(a, "cancel") == []


async def test_bad_values_are_refused_at_the_call(clients: list[coord.Client]) -> None:
    election = clients[0].election("bad")
    with pytest.raises(TypeError, match="bytes"):
        election.campaign("text")  # type: ignore[arg-type]
    with pytest.raises(coord.ConfigurationError, match="cooldown"):
        await election.run(anyio.sleep_forever, b"x", cooldown=-1)  # type: ignore[arg-type]
    with pytest.raises(coord.ConfigurationError):
        clients[0].election("bad//name")
    assert await candidate_keys(clients[0], "bad") == []


async def test_a_task_campaigning_twice_gets_an_error(clients: list[coord.Client]) -> None:
    election = clients[0].election("twice")
    async with election.campaign(b"a"):
        with pytest.raises(coord.LockedError, match="wait on itself"):
            async with election.campaign(b"a"):
                pass


async def next_leader(
    receive: ObjectReceiveStream[coord.Leader | None],
) -> coord.Leader | None:
    with anyio.fail_after(10):
        return await receive.receive()


async def test_observe_from_no_leader_through_two_terms(clients: list[coord.Client]) -> None:
    a, b, c, _ = clients
    send, receive = anyio.create_memory_object_stream[coord.Leader | None](100)

    async def observe(send: ObjectSendStream[coord.Leader | None]) -> None:
        async with send:
            async for leader in c.election("observe").observe():
                await send.send(leader)

    async with anyio.create_task_group() as tg:
        tg.start_soon(observe, send)
        assert await next_leader(receive) is None
        async with a.election("observe").campaign(b"a") as first:
            assert await next_leader(receive) == coord.Leader(first.key, b"a", first.fence)
            await first.proclaim(b"a2")
            assert await next_leader(receive) == coord.Leader(first.key, b"a2", first.fence)
        assert await next_leader(receive) is None
        with pytest.raises(coord.LeadershipLost):
            async with b.election("observe").campaign(b"b") as second:
                assert await next_leader(receive) == coord.Leader(second.key, b"b", second.fence)
                await drop_key(b, second.key)  # a term lost, not resigned: seen all the same
                await anyio.sleep_forever()
        assert await next_leader(receive) is None
        tg.cancel_scope.cancel()
    assert second.lost
    with receive:
        extra = [item async for item in receive]
    assert extra == [], "yielded twice, or made up"


async def test_observe_deduplicates(clients: list[coord.Client]) -> None:
    a, _, c, _ = clients
    seen: Recorder[coord.Leader | None] = Recorder()
    async with a.election("dedup").campaign(b"a") as term:
        async with anyio.create_task_group() as tg:

            async def observe() -> None:
                async for leader in c.election("dedup").observe():
                    seen.append(leader)

            tg.start_soon(observe)
            await seen.wait_for(bool)
            for value in (b"x", b"x2"):
                await term.proclaim(value)
            last = coord.Leader(term.key, b"x2", term.fence)
            await seen.wait_for(lambda items: bool(items) and items[-1] == last)
            await anyio.sleep(0.3)
            tg.cancel_scope.cancel()
    values = [s.value if s else None for s in seen.items]
    assert values[0] == b"a"
    assert len(values) == len(set(values)), f"a state was yielded twice: {values}"


async def test_run_campaigns_again_after_a_loss_and_after_returning(
    clients: list[coord.Client], caplog: pytest.LogCaptureFixture
) -> None:
    a = clients[0]
    election = a.election("run")
    terms: Recorder[coord.Term] = Recorder()
    started = anyio.Event()

    async def lead(term: coord.Term) -> None:
        nonlocal started
        terms.append(term)
        started.set()
        if len(terms) == 2:
            return  # steps down: run campaigns again after the cooldown
        await anyio.sleep_forever()

    caplog.set_level(logging.INFO, logger="coord")
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: election.run(lead, b"me", cooldown=0.05))
            await started.wait()
            started = anyio.Event()
            await drop_key(a, terms.items[0].key)  # lost: run must campaign again by itself
            await terms.wait_for(lambda items: len(items) >= 3)
            tg.cancel_scope.cancel()
    first, second, third = terms.items[:3]
    assert first.lost
    assert not second.lost, "returning from fn resigns"
    assert first.fence < second.fence < third.fence
    lines = [r.getMessage() for r in caplog.records if "run" in r.getMessage()]
    starts = [m for m in lines if "stopped leading" not in m and "leading (term" in m]
    stops = [m for m in lines if "stopped leading" in m]
    assert len(starts) == 3
    assert len(stops) == 3, "every start must be paired with a stop"
    for term in terms.items:
        assert any(f"term {term.fence})" in m for m in starts)
        assert any(f"term {term.fence})" in m for m in stops)


@pytest.mark.parametrize("fault", ["key deleted", "session expired"])
async def test_a_candidate_never_leads_on_a_key_it_lost_while_waiting(
    clients: list[coord.Client], fault: str
) -> None:
    """etcd #19597: a candidate whose key (or lease) went while it waited could report
    leadership while holding no key. Here it registers again (a new session, a new key)
    and leads only once that key is confirmed at the head of the queue."""
    a, b, _, _ = clients
    led: Recorder[coord.Term] = Recorder()

    async def candidate() -> None:
        async with b.election("confirm").campaign(b"b") as term:
            leader = await b.election("confirm").leader()
            assert leader is not None
            assert leader.key == term.key, "leads, but the head of the queue is someone else"
            led.append(term)

    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            async with a.election("confirm").campaign(b"a"):
                tg.start_soon(candidate)
                await wait_for_waiters(a, "confirm", 2)
                lost_key = (await candidate_keys(a, "confirm"))[1]
                if fault == "key deleted":
                    await drop_key(a, lost_key)
                else:
                    await expire_session(b)
                await wait_for_queue(a, "confirm", lambda n: n == 2)  # registered again
                assert led.items == []
                new_key = (await candidate_keys(a, "confirm"))[1]
                assert new_key != lost_key
            await led.wait_for(bool)  # a resigned: b leads, on its new key
    assert led.items[0].key == new_key


async def test_observe_survives_its_own_clients_session_losses(
    clients: list[coord.Client],
) -> None:
    """Between a lost session and the next, ZooKeeper refuses every request: observe()
    reads again once the next session is there, and never ends on its own."""
    a, _, c, _ = clients
    seen: list[coord.Leader | None] = []

    async def observe() -> None:
        async for leader in c.election("obs-own").observe():
            seen.append(leader)  # noqa: PERF401  (it never ends: read while it runs)

    async with anyio.create_task_group() as tg:
        tg.start_soon(observe)
        with anyio.fail_after(10):
            while not seen:  # noqa: ASYNC110  (a test watching a side effect)
                await anyio.sleep(0.01)
        for _ in range(2):
            old = c.session
            await expire_session(c)
            with anyio.fail_after(20):
                while c.session is old or c.session.lost:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
        assert await c.election("obs-own").leader() is None
        async with a.election("obs-own").campaign(b"a") as term:
            with anyio.fail_after(10):
                while not seen or seen[-1] is None:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            assert seen[-1] == coord.Leader(term.key, b"a", term.fence)
        tg.cancel_scope.cancel()


async def test_observe_with_renew_false_raises_once_its_session_is_lost(
    coord_url: str, clients: list[coord.Client]
) -> None:
    """With renew=False no session follows a lost one: observe() raises
    SessionExpiredError at once, on every store, whether it was waiting for a change or
    is called again (issue 17, item 7: on ZooKeeper, which refuses every request once
    the session is over, it waited in silence; on etcd it went on)."""
    async with coord.connect(coord_url, ttl=5, renew=False) as client:
        election = client.election("obs-final")
        observer = election.observe()
        with anyio.fail_after(15):
            assert await anext(observer) is None
            async with clients[0].election("obs-final").campaign(b"a") as term:
                assert await anext(observer) == coord.Leader(term.key, b"a", term.fence)
                await expire_session(client)
                with pytest.raises(coord.SessionExpiredError, match="renew=False"):
                    await anext(observer)  # waiting for the leader to change
            with pytest.raises(coord.SessionExpiredError, match="renew=False"):
                await anext(election.observe())


@pytest.mark.parametrize(("renew", "sessions"), [(True, True), (False, True), (True, False)])
async def test_observe_raises_closed_error_when_its_client_closes(
    coord_url: str, renew: bool, sessions: bool
) -> None:
    """Waiting for a change, observe() ends with ClosedError when its client closes (on
    etcd and memory it waited on, on a watch of a closed client)."""
    errors: list[BaseException] = []

    async def follow(observer: AsyncIterator[coord.Leader | None]) -> None:
        try:
            await anext(observer)
        except coord.CoordError as exc:
            errors.append(exc)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            async with coord.connect(coord_url, ttl=5, renew=renew, sessions=sessions) as client:
                observer = client.election("obs-closed").observe()
                assert await anext(observer) is None
                tg.start_soon(follow, observer)
                await anyio.sleep(0.2)
    assert [type(error) for error in errors] == [coord.ClosedError]


async def candidates(client: coord.Client) -> tuple[object, ...]:
    return (await client.backend.entries("handoff/")).entries


async def test_leader_is_never_none_while_someone_leads(clients: list[coord.Client]) -> None:
    """Leaders hand over while the next candidate is already queued: leader() must never
    say "no leader" (on ZooKeeper the head could be deleted between the listing and its
    read, and the entry behind it was not read)."""
    a, b, c, d = clients
    nones = reads = 0
    stop = anyio.Event()

    async def poll() -> None:
        nonlocal nones, reads
        election = c.election("handoff")
        while not stop.is_set():
            leader = await election.leader()
            if stop.is_set():
                break  # the candidates may be leaving: the queue may be empty now
            reads += 1
            nones += leader is None

    async def candidate(client: coord.Client, value: bytes) -> None:
        while not stop.is_set():
            async with client.election("handoff").campaign(value):
                # resign only once somebody else is queued behind me
                while not stop.is_set() and len(await candidates(client)) < 2:  # noqa: ASYNC110
                    await anyio.sleep(0.001)

    async with anyio.create_task_group() as tg:
        for client, value in ((a, b"a"), (b, b"b"), (d, b"d")):
            tg.start_soon(candidate, client, value)
        with anyio.fail_after(10):
            while len(await candidates(c)) < 2:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        for _ in range(3):
            tg.start_soon(poll)
        await anyio.sleep(3)
        stop.set()
    assert reads > 0
    assert nones == 0, f"leader() said 'no leader' {nones} times of {reads} while one led"


async def test_the_leader_says_who_leads_and_since_when(coord_url: str) -> None:
    """As a lock's waiters do: host, pid and the client's name, and when it campaigned
    (``coord leader --json`` printed ``"identity": {}`` for every value but the CLI's
    default). The value stays the user's own, through proclaim; an entry written by
    something else reads as its whole value, from nobody known."""
    import os
    import socket
    import time

    async with coord.connect(coord_url, identity="scheduler-1") as client:
        election = client.election("who")
        before = time.time()
        async with election.campaign(b"10.0.0.7") as term:
            leader = await election.leader()
            assert leader is not None
            assert leader.value == term.value == b"10.0.0.7"
            expected = {"host": socket.gethostname(), "pid": os.getpid(), "name": "scheduler-1"}
            assert leader.identity == expected
            assert leader.since is not None
            assert before - 1 <= leader.since <= time.time() + 1
            (waiter,) = await client.mutex("who").waiters()  # one layout, the same record
            assert waiter.identity.items() >= expected.items()
            assert waiter.since == leader.since
            await term.proclaim(b"10.0.0.7, draining")
            proclaimed = await election.leader()
            assert proclaimed is not None
            assert proclaimed.value == term.value == b"10.0.0.7, draining"
            assert (proclaimed.identity, proclaimed.since) == (expected, leader.since)
        await client.backend.register("who/", "@wforeign", None, value=b'{"a": 1}\nraw')
        foreign = await election.leader()
        assert foreign is not None
        assert (foreign.value, foreign.identity, foreign.since) == (b'{"a": 1}\nraw', {}, None)
