"""The ordered waiter entries of the etcd backend (backends/etcd/_waitqueue.py), where its
invariants can break: a queue whose tail went while waiters remain, batches of waiters
registered by one transaction, answers lost on an empty queue, a backend closed with a
batch in flight. Each of these found a way to two holders or a key left behind in
review; key order must stay queue order and fences must keep increasing."""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from aetcd import rpc

import coord
from coord._core.url import parse_url
from coord.abc import Create, Entry
from coord.backends.etcd import EtcdBackend, _register
from coord.backends.etcd._connection import Answer
from coord.backends.etcd._kv import range_end
from coord.backends.etcd._register import _Tail
from coord.backends.etcd._waitqueue import queue_range
from coord.testing import expire_session, wait_for_no_waiters

from ._handoff import requests_of

if TYPE_CHECKING:
    from coord.abc import Backend, Lease, Position

pytestmark = [pytest.mark.anyio, pytest.mark.etcd]


def wid() -> str:
    return f"@w{uuid.uuid4().hex}"


async def batch(backend: Backend, prefix: str, lease: Lease, n: int) -> list[Position]:
    """*n* registrations at once: one batch of the backend's sender."""
    return list(await asyncio.gather(*(backend.register(prefix, wid(), lease) for _ in range(n))))


async def clients(stack: AsyncExitStack, url: str, n: int) -> list[coord.Client]:
    return [await stack.enter_async_context(coord.connect(url, ttl=30)) for _ in range(n)]


async def test_a_queue_whose_tail_went_takes_newcomers_after_its_waiters(etcd_url: str) -> None:
    """A's five waiters go with its session, B's newest gives up (taking the tail): C
    registers behind B's waiters, with a higher fence than B's holder."""
    async with AsyncExitStack() as stack:
        a, b, c = await clients(stack, etcd_url, 3)
        await batch(a.backend, "m/", a.session.lease, 5)
        pb = await batch(b.backend, "m/", b.session.lease, 5)
        await expire_session(a)
        assert (await b.backend.position(pb[0].entry)).is_head
        assert await b.backend.delete(pb[-1].entry)
        pc = await c.backend.register("m/", wid(), c.session.lease)
        assert not pc.is_head
        assert [e.key for e in pc.ahead] == [pb[-2].entry.key]
        assert pc.entry.revision > max(p.entry.revision for p in pb)


async def test_a_newcomer_after_the_newest_gave_up_is_last_with_the_highest_fence(
    etcd_url: str,
) -> None:
    async with AsyncExitStack() as stack:
        a, c = await clients(stack, etcd_url, 2)
        pa = await batch(a.backend, "m/", a.session.lease, 5)
        assert await a.backend.delete(pa[-1].entry)
        pc = await c.backend.register("m/", wid(), c.session.lease)
        assert pc.entry.revision > max(p.entry.revision for p in pa)
        listed = (await a.backend.entries("m/")).entries
        assert [e.key for e in listed] == [p.entry.key for p in pa[:-1]] + [pc.entry.key]


async def test_one_holder_after_a_crash_and_a_timeout(etcd_url: str) -> None:
    """The same through the mutex: A's waiters die with A, B's first holds, B's newest
    times out, C comes: B's holder and C never hold at once, fences increase."""
    holding: list[str] = []
    fences: list[int] = []
    overlaps: list[list[str]] = []

    async def worker(client: coord.Client, name: str, give_up: float = 60) -> None:
        with anyio.move_on_after(give_up):
            try:
                async with client.mutex("m") as hold:
                    holding.append(name)
                    fences.append(hold.fence)
                    if len([h for h in holding if not h.startswith("a")]) > 1:
                        overlaps.append(list(holding))
                    try:
                        await anyio.sleep(1)
                    finally:
                        holding.remove(name)
            except (coord.LockLost, coord.SessionExpiredError):
                assert name.startswith("a"), f"{name} lost its hold"

    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(coord.connect(etcd_url, ttl=30, renew=False))
        b, c = await clients(stack, etcd_url, 2)
        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(worker, a, f"a{i}")
            await anyio.sleep(0.3)
            for i in range(4):
                tg.start_soon(worker, b, f"b{i}")
            tg.start_soon(worker, b, "b-gives-up", 1.0)
            await anyio.sleep(0.3)
            await expire_session(a)
            await anyio.sleep(1.0)  # b's newest gives up: its delete takes the tail
            tg.start_soon(worker, c, "c0")
        assert overlaps == []
        assert fences == sorted(fences)
        assert len(set(fences)) == len(fences)


async def test_a_repeat_of_an_unsent_registration_after_the_queue_moved_on(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's registration fails before it is sent; B takes the lock, C comes and goes (the
    tail with it); A repeats: A queues behind B."""
    async with AsyncExitStack() as stack:
        a, b, c = await clients(stack, etcd_url, 3)
        _register_faults(a.backend, monkeypatch, "cut", "cut")  # and its settling
        waiter = wid()
        with pytest.raises(coord.BackendUnavailable):
            await a.backend.register("m/", waiter, a.session.lease)
        for i in range(3):  # the store's other tenants write meanwhile
            await b.backend.put(f"other/{i}", b"x")
        pb = await b.backend.register("m/", wid(), b.session.lease)
        assert pb.is_head
        pc = await c.backend.register("m/", wid(), c.session.lease)
        assert await c.backend.delete(pc.entry)
        pa = await a.backend.register("m/", waiter, a.session.lease)
        assert not pa.is_head
        assert pa.entry.revision > pb.entry.revision


async def test_a_repeat_after_a_lost_answer_on_an_empty_queue_finds_its_entry(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's registration is applied, its answer lost; B registers behind and gives up (the
    tail goes); A repeats: its first entry, not a second one."""
    async with AsyncExitStack() as stack:
        a, b = await clients(stack, etcd_url, 2)
        _register_faults(a.backend, monkeypatch, "apply", "cut")  # and its settling
        waiter = wid()
        with pytest.raises(coord.BackendUnavailable):
            await a.backend.register("m/", waiter, a.session.lease)
        pb = await b.backend.register("m/", wid(), b.session.lease)
        assert await b.backend.delete(pb.entry)
        pa = await a.backend.register("m/", waiter, a.session.lease)
        assert pa.is_head
        listed = (await a.backend.entries("m/")).entries
        assert listed == (pa.entry,)


async def test_a_batch_is_listed_in_key_order_with_increasing_fences(etcd_url: str) -> None:
    async with coord.connect(etcd_url, ttl=30) as a:
        positions = await batch(a.backend, "m/", a.session.lease, 64)
        listed = (await a.backend.entries("m/")).entries
        assert [e.key for e in listed] == sorted(p.entry.key for p in positions)
        revisions = [e.revision for e in listed]
        assert revisions == sorted(set(revisions))
        assert {p.entry for p in positions} == set(listed)


async def test_closing_with_a_batch_in_flight_answers_its_callers(etcd_url: str) -> None:
    backend = EtcdBackend.from_url(parse_url(etcd_url))
    await backend.__aenter__()
    lease = await backend.grant(30)
    task = asyncio.ensure_future(backend.register("m/", wid(), lease))
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the sender has taken the batch; its request is in flight
    await backend.aclose()
    with anyio.fail_after(3):
        with pytest.raises(coord.ClosedError):
            await task


async def test_a_wrong_guess_of_an_empty_queue_is_corrected(etcd_url: str) -> None:
    """A client that believes the queue has no tail and numbers from too low gets the
    queue's last key in the answer and registers after it (the range compare)."""
    async with AsyncExitStack() as stack:
        a, b = await clients(stack, etcd_url, 2)
        pa = await batch(a.backend, "m/", a.session.lease, 3)
        assert await a.backend.delete(pa[-1].entry)  # the tail goes; two waiters remain
        registrar = b.backend._registrar  # type: ignore[attr-defined]
        registrar._tails[b.backend._key("m/")] = _Tail(0, 0)  # type: ignore[attr-defined]
        pb = await b.backend.register("m/", wid(), b.session.lease)
        assert [e.key for e in pb.ahead] == [pa[1].entry.key]
        listed = (await b.backend.entries("m/")).entries
        assert [e.key for e in listed] == [pa[0].entry.key, pa[1].entry.key, pb.entry.key]


def _register_faults(
    backend: Any, monkeypatch: pytest.MonkeyPatch, *steps: str, in_flight: float = 0.0
) -> tuple[Any, list[tuple[Any, ...]]]:
    """Faults on the backend's next registration transactions (attempts and settlings),
    one step each, then none: ``"hold"`` raises BackendUnavailable after *in_flight*
    seconds and keeps the request back, for the test to send late; ``"apply"`` sends it
    and loses the answer; ``"cut"`` fails it before it is sent. A registration made with
    no tail settles a failed attempt itself: give it a step too.

    :returns: the real ``_txn``, and the requests held back (what, args, kwargs)
    """
    real = backend._txn
    todo = list(steps)
    held: list[tuple[Any, ...]] = []

    async def txn(what: str, *args: Any, **kwargs: Any) -> Any:
        if what != "register" or not todo:
            return await real(what, *args, **kwargs)
        step = todo.pop(0)
        if step == "hold":
            held.append((what, args, kwargs))
            await anyio.sleep(in_flight)
        elif step == "apply":
            await real(what, *args, **kwargs)
        raise coord.BackendUnavailable(f"injected: {step}")

    monkeypatch.setattr(backend, "_txn", txn)
    return real, held


@pytest.mark.parametrize("step", ["cut", "apply"])
async def test_a_failed_attempt_on_an_empty_queue_is_settled_and_made_again(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """Not repeated inside the call (a late first try could apply after a repeat), a
    registration with no tail settles its attempt and goes again: one entry."""
    async with coord.connect(etcd_url, ttl=30) as a:
        _register_faults(a.backend, monkeypatch, step)
        position = await a.backend.register("m/", wid(), a.session.lease)
        assert position.is_head
        assert (await a.backend.entries("m/")).entries == (position.entry,)


async def test_a_lost_registration_on_an_empty_queue_cannot_apply_after_it_was_settled(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt is late, not lost: it reaches the store after its repeat has
    registered, held and released (the queue is empty again, its compares would hold)."""
    async with coord.connect(etcd_url, ttl=30) as a:
        real, held = _register_faults(a.backend, monkeypatch, "hold", "cut")
        waiter = wid()
        with pytest.raises(coord.BackendUnavailable):
            await a.backend.register("m/", waiter, a.session.lease)
        again = await a.backend.register("m/", waiter, a.session.lease)
        assert again.is_head
        assert await a.backend.delete(again.entry)
        what, args, kwargs = held[0]
        late = await real(what, *args, **kwargs)
        assert not late.succeeded
        assert (await a.backend.entries("m/")).entries == ()


@pytest.mark.parametrize("applied", [False, True])
@pytest.mark.parametrize("tail", ["live", "idle", "none"])
async def test_abandoning_a_lost_registration_leaves_nothing(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch, applied: bool, tail: str
) -> None:
    """Neither the entry nor a live tail of its own (waiting until the session ends), on
    a queue with a tail (another waiter's, or idle: the queue empty) or without."""
    async with AsyncExitStack() as stack:
        other, a = await clients(stack, etcd_url, 2)
        first = await other.backend.register("m/", wid(), other.session.lease)
        if tail != "live":
            assert await other.backend.delete(first.entry)  # the tail is idle
            assert await a.backend.get("m/@") is not None
        if tail == "none":  # gone with its session (here by hand): a new run
            await a.backend._fault_delete_key("m/@")  # type: ignore[attr-defined]
        step = "apply" if applied else "hold"  # with no tail, its own settling fails too
        steps = (step, "cut") if tail == "none" else (step,)
        _register_faults(a.backend, monkeypatch, *steps)
        waiter = wid()
        with pytest.raises(coord.BackendUnavailable):
            await a.backend.register("m/", waiter, a.session.lease)
        provisional = Entry("m/" + waiter, lease=a.session.lease.id)
        assert await a.backend.delete(provisional) is applied
        if tail == "live":
            assert await other.backend.delete(first.entry)
        assert (await a.backend.entries("m/")).entries == ()
        left = await a.backend.get("m/@")
        # Only an idle tail, of the session that left the queue empty: none of a's.
        assert left is None or (left.value.endswith(b".") and left.lease == other.session.lease.id)


async def test_a_foreign_key_among_the_waiters_is_an_error_not_a_loop(etcd_url: str) -> None:
    """A queue's claim (``@c``, no order number) under a name that a mutex also uses."""
    async with coord.connect(etcd_url, ttl=30) as a:
        await a.backend.transact([Create("m/", f"@c{uuid.uuid4().hex}", b"", a.session.lease)])
        with anyio.fail_after(5), pytest.raises(coord.ConfigurationError, match="not one"):
            await a.backend.register("m/", wid(), a.session.lease)


def fail_first_position(backend: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The first "position" read raises BackendUnavailable (store unreachable for the
    whole request budget, e.g. a partition of > request_timeout)."""
    conn = backend._conn
    real = conn.call_answer
    failed: list[str] = []

    async def answer(what: str, *args: Any, **kwargs: Any) -> Any:
        if what == "position" and not failed:
            failed.append(what)
            raise coord.BackendUnavailable("injected: position read failed")
        return await real(what, *args, **kwargs)

    monkeypatch.setattr(conn, "call_answer", answer)
    return failed


async def test_a_repeat_after_a_failed_position_read_finds_the_entry(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with coord.connect(etcd_url, ttl=30) as a:
        fail_first_position(a.backend, monkeypatch)
        ahead = await a.backend.register("m/", wid(), a.session.lease)  # read as the head
        waiter = wid()
        with pytest.raises(coord.BackendUnavailable):
            # Registered (the txn answered), then the position read failed (two entries
            # ahead asked for: the registration knows of one).
            await a.backend.register("m/", waiter, a.session.lease, ahead=2)
        again = await a.backend.register("m/", waiter, a.session.lease, ahead=2)
        listed = (await a.backend.entries("m/")).entries
        # One waiter id never has two entries: the repeat returns the first.
        assert len(listed) == 2, [e.key for e in listed]
        assert again.ahead == (ahead.entry,)


async def test_an_acquire_whose_position_read_failed_does_not_wait_on_itself(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with AsyncExitStack() as stack:
        a, b = await clients(stack, etcd_url, 2)
        failed = fail_first_position(a.backend, monkeypatch)
        other = b.semaphore("m", 2)
        await other.acquire()  # one slot of two taken: a reads its position
        acquired = False
        with anyio.move_on_after(5):
            # (an idle lock's registration already says it is the head: no read)
            async with a.semaphore("m", 2):
                acquired = True
        assert failed == ["position"]
        keys = [e.key for e in (await b.backend.entries("m/")).entries]
        assert acquired, f"a's acquire hung; keys left: {keys}"
        await other.release()
        with anyio.fail_after(5):
            async with b.semaphore("m", 2):
                pass


@pytest.mark.parametrize("tail", [False, True])
async def test_an_abandonment_that_failed_is_repeated_until_the_late_attempt_cannot_apply(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch, tail: bool
) -> None:
    """The attempt is in flight (answer lost, not applied yet); the abandonment's settle
    fails before it is sent; the delete is repeated (as _delete_until_done does): abandon
    settles it then (it was not applied: False), and the late attempt cannot apply: no
    key is left bound to the live lease."""
    async with AsyncExitStack() as stack:
        other, a = await clients(stack, etcd_url, 2)
        if tail:  # a queue with a tail (another's waiter): the attempt compares its mod
            first = await other.backend.register("m/", wid(), other.session.lease)
        # Held back; with no tail, its own settling fails; then the abandonment's.
        steps = ("hold", "cut") if tail else ("hold", "cut", "cut")
        real, held = _register_faults(a.backend, monkeypatch, *steps)
        waiter = wid()
        with pytest.raises(coord.BackendUnavailable):
            await a.backend.register("m/", waiter, a.session.lease)
        provisional = Entry("m/" + waiter, lease=a.session.lease.id)
        with pytest.raises(coord.BackendUnavailable):
            await a.backend.delete(provisional)
        assert await a.backend.delete(provisional) is False  # the repeat settles it
        what, args, kwargs = held[0]
        late = await real(what, *args, **kwargs)
        if tail:
            assert await other.backend.delete(first.entry)
        left = (await a.backend.entries("m/")).entries
        assert not late.succeeded
        assert left == (), [e.key for e in left]


async def test_a_timed_out_acquire_whose_clean_up_failed_leaves_nothing_that_blocks(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with AsyncExitStack() as stack:
        a, b = await clients(stack, etcd_url, 2)
        real, held = _register_faults(a.backend, monkeypatch, "hold", "cut", "cut", in_flight=0.3)
        with anyio.move_on_after(0.1):
            async with a.mutex("m"):
                pytest.fail("acquired")
        await anyio.sleep(1.5)  # the session's task abandons it (settle fails, repeated)
        what, args, kwargs = held[0]
        await real(what, *args, **kwargs)  # the late attempt arrives
        with anyio.fail_after(5):
            async with b.semaphore("m", 2):
                pass


def _ranges(ops: Any) -> list[Any]:
    """The key ranges (not single keys) that the operations *ops* read, nested ones too."""
    found = []
    for op in ops:
        kind = op.WhichOneof("request")
        if kind == "request_range" and op.request_range.range_end:
            found.append(op.request_range)
        elif kind == "request_txn":
            found += _ranges([*op.request_txn.success, *op.request_txn.failure])
    return found


async def test_an_idle_lock_costs_two_requests_and_reads_no_range(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release of an idle lock's only waiter leaves the tail idle (the queue is
    empty): the next acquire registers without reading anything, so its cost does not
    grow with the keys deleted under the name. etcd keeps each deleted key in its index
    until a compaction, and a range from the queue's start walks them all: 50,000 old
    waiter keys made such a read 6.6 ms of the store's apply loop, for every acquire of
    an idle lock. Two requests a cycle; the tail goes with the session."""
    async with AsyncExitStack() as stack:
        a, b = await clients(stack, etcd_url, 2)
        sent: list[tuple[str, Any]] = []
        conn = a.backend._conn  # type: ignore[attr-defined]
        real = conn.call_answer

        async def recording(what: str, method: Any, request: Any, **kwargs: Any) -> Any:
            sent.append((what, request))
            return await real(what, method, request, **kwargs)

        monkeypatch.setattr(conn, "call_answer", recording)
        mutex = a.mutex("idle")
        fences = []
        for _ in range(4):
            async with mutex as hold:
                fences.append(hold.fence)
        assert fences == sorted(set(fences))
        # The first registration reads the tail; then a register and a delete a cycle.
        assert [what for what, _ in sent] == ["register"] + ["register", "delete"] * 4
        for what, request in sent[2:]:
            assert isinstance(request, rpc.TxnRequest), what
            assert _ranges(request.success) == [], (what, request)
        tail = await b.backend.get("idle/@")
        assert tail is not None
        assert tail.value.endswith(b".")
        assert tail.lease == a.session.lease.id
        # Another client's acquire takes it over, and leaves it idle, its own.
        async with b.mutex("idle"):
            pass
        tail = await b.backend.get("idle/@")
        assert tail is not None
        assert tail.lease == b.session.lease.id
    async with coord.connect(etcd_url, ttl=30) as c:
        assert await c.backend.get("idle/@") is None  # gone with the sessions


async def test_a_client_keeps_a_bounded_number_of_idle_tails(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past IDLE_TAILS names left idle, the oldest tails go (each only if untouched
    since): a client that locks many names does not fill the store for its session."""
    monkeypatch.setattr(_register, "IDLE_TAILS", 4)
    monkeypatch.setattr(_register, "IDLE_SWEEP", 3)
    async with AsyncExitStack() as stack:
        a, b = await clients(stack, etcd_url, 2)
        names = [f"n{i}" for i in range(5)]
        for name in names[:4]:
            async with a.mutex(name):
                pass
        async with b.mutex("n1"):  # b moves n1's tail: a's sweep leaves it
            pass
        async with a.mutex("n4"):  # a's fifth: its three oldest go
            pass
        registrar = a.backend._registrar  # type: ignore[attr-defined]
        with anyio.fail_after(5):
            while registrar._sweeping:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        assert list(registrar._idle) == [a.backend._key(f"{n}/") for n in ("n3", "n4")]  # type: ignore[attr-defined]
        left = [name for name in names if await b.backend.get(f"{name}/@") is not None]
        assert left == ["n1", "n3", "n4"], left
        async with a.mutex("n2"):  # a swept tail: registered without one, correctly
            pass


async def test_an_idle_tail_made_by_a_release_whose_answer_was_lost_is_swept_too(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repeat of a release whose first answer was lost finds the tail idle already
    (its failure branch reads it): numbered as that waiter, it is this client's, and
    counts towards IDLE_TAILS like the others."""
    monkeypatch.setattr(_register, "IDLE_TAILS", 2)
    monkeypatch.setattr(_register, "IDLE_SWEEP", 1)
    async with AsyncExitStack() as stack:
        a, b = await clients(stack, etcd_url, 2)
        conn: Any = a.backend._conn  # type: ignore[attr-defined]
        real = conn.call_answer

        async def lossy(what: str, method: Any, request: Any, **kwargs: Any) -> Any:
            if what != "delete":
                return await real(what, method, request, **kwargs)
            first = await real(what, method, request, **kwargs)  # applied, answer lost
            again = await real(what, method, request, **kwargs)
            return Answer(again.reply, again.sent, first.attempts + 1)

        monkeypatch.setattr(conn, "call_answer", lossy)
        names = [f"n{i}" for i in range(6)]
        for name in names:
            async with a.mutex(name):
                pass
        registrar = a.backend._registrar  # type: ignore[attr-defined]
        with anyio.fail_after(5):
            while registrar._sweeping:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        left = [name for name in names if await b.backend.get(f"{name}/@") is not None]
        assert left == ["n4", "n5"], left


async def test_a_tail_of_another_layout_is_a_clear_error(etcd_url: str) -> None:
    """A coord of another key layout under the same name: its acquire says so."""
    async with coord.connect(etcd_url, ttl=30) as a:
        etcd: Any = a.backend
        await etcd._conn.call(
            "put", lambda c: c.kv.Put, rpc.PutRequest(key=etcd._key("m/@"), value=b"v2:17")
        )
        with anyio.fail_after(5), pytest.raises(coord.ConfigurationError, match="layout"):
            await a.backend.register("m/", wid(), a.session.lease)


async def test_a_waiter_whose_waiter_ahead_left_reads_a_window_not_the_queues_past(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiter right ahead of mine leaves out of turn: my position read finds the one
    ahead of it within a window of order numbers below mine. No read starts at the
    queue's start: that one would walk every key deleted under the name since the last
    compaction."""
    async with AsyncExitStack() as stack:
        a, b, c = await clients(stack, etcd_url, 3)
        for _ in range(3):  # some past
            async with a.mutex("m"):
                pass
        held = await a.backend.register("m/", wid(), a.session.lease)
        gone = await b.backend.register("m/", wid(), b.session.lease)
        mine = await c.backend.register("m/", wid(), c.session.lease)
        assert mine.ahead == (gone.entry,)
        assert await b.backend.delete(gone.entry)
        sent: list[Any] = []
        conn: Any = c.backend._conn  # type: ignore[attr-defined]
        real = conn.call_answer

        async def recording(what: str, method: Any, request: Any, **kwargs: Any) -> Any:
            sent.append(request)
            return await real(what, method, request, **kwargs)

        monkeypatch.setattr(conn, "call_answer", recording)
        position = await c.backend.position(mine.entry, ahead=1)
        assert position.ahead == (held.entry,)
        start = queue_range(c.backend._key("m/"))[0]  # type: ignore[attr-defined]
        reads = [r for r in sent if isinstance(r, rpc.RangeRequest)]
        reads += [q for r in sent if isinstance(r, rpc.TxnRequest) for q in _ranges(r.success)]
        assert reads
        assert all(r.key != start for r in reads), reads
        # With nobody ahead any more, the queue's first key tells (mine).
        assert await a.backend.delete(held.entry)
        assert (await c.backend.position(mine.entry, ahead=1)).is_head


async def test_an_idle_locks_acquire_reads_no_position_and_a_tailless_queue_is_not_empty(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no tail, the registration also reads the queue's first key: if it is mine,
    nobody is ahead and no position read follows (an idle lock's acquire). But no tail
    does not mean an empty queue: the waiters of a tail that left with its newest
    waiter's session are still ahead."""
    async with AsyncExitStack() as stack:
        a, b, c = await clients(stack, etcd_url, 3)
        reads = requests_of(a, monkeypatch)
        async with a.mutex("idle"):
            pass
        assert "position" not in reads, reads
        first = await b.backend.register("m/", wid(), b.session.lease)
        await c.backend.register("m/", wid(), c.session.lease)  # the newest: the tail's
        await c.session.lease.revoke()  # its key and the tail go; b's stays
        assert await a.backend.get("m/@") is None
        mine = await a.backend.register("m/", wid(), a.session.lease)
        assert mine.ahead == (first.entry,)


async def all_keys(backend: EtcdBackend) -> list[bytes]:
    """Every key under the backend's namespace."""
    root = backend._root
    request = rpc.RangeRequest(key=root, range_end=range_end(root), keys_only=True)
    reply = await backend._conn.call("list", lambda c: c.kv.Range, request)
    return [bytes(kv.key) for kv in reply.kvs]


async def test_acquires_cut_short_with_their_registration_in_flight_leave_no_key(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An acquire registers in its own task; the transaction goes out from a task of the
    backend, so a caller cancelled (natively) with it in flight leaves it whole: its
    abandonment deletes the key by its answer. Cut in the caller's task, its outcome
    would be unknown, settled by a kill key bound to the live lease, one per cancel
    (an adversarial review's finding)."""
    async with coord.connect(etcd_url, ttl=30) as a:
        backend = a.backend
        assert isinstance(backend, EtcdBackend)
        registrar = backend._registrar
        sent = asyncio.Event()
        real = registrar._attempt

        async def attempt(*args: Any, **kwargs: Any) -> Any:
            sent.set()
            return await real(*args, **kwargs)

        monkeypatch.setattr(registrar, "_attempt", attempt)
        for _ in range(10):
            sent.clear()
            task = asyncio.create_task(a.mutex("idle").acquire())
            await sent.wait()
            await asyncio.sleep(0)  # the transaction is on its way
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
                await a.mutex("idle").release()  # (not reached: it is cancelled)
        rng = random.Random(3)
        for _ in range(200):  # the public API alone: a timeout anywhere in an acquire
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(rng.random() * 0.002), a.mutex("idle"):
                    pass
        with anyio.fail_after(10):
            await wait_for_no_waiters(a, "idle")
            while await all_keys(backend):  # noqa: ASYNC110 (abandonments to finish)
                await anyio.sleep(0.05)


async def test_acquires_cancelled_before_sending_cost_no_listing(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acquires cancelled while they wait for one of the session's request slots sent
    nothing: undoing them reads nothing (the search for a registration whose outcome is
    unknown lists the queue). An adversarial review's finding: 600 of them cost 59-65
    listings."""
    async with coord.connect(etcd_url, ttl=30) as a, coord.connect(etcd_url, ttl=30) as b:
        holder = b.mutex("slots")
        await holder.acquire()
        backend = a.backend
        assert isinstance(backend, EtcdBackend)
        listings = 0
        real = backend._find_ordered

        async def counting(*args: Any, **kwargs: Any) -> Any:
            nonlocal listings
            listings += 1
            return await real(*args, **kwargs)

        monkeypatch.setattr(backend, "_find_ordered", counting)
        tasks = [asyncio.create_task(a.mutex("slots").acquire()) for _ in range(600)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # each has started: 32 hold a slot, the others wait for one
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await holder.release()
        with anyio.fail_after(60):
            await wait_for_no_waiters(b, "slots")
        assert listings == 0


async def test_a_registration_one_behind_the_tail_goes_through_in_one_request(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B's tail is one registration of one number old: the guess in the failure branch of
    its transaction registers it right after that one, with no second round trip; two
    behind, it goes again. Key order stays queue order, fences keep increasing."""
    async with AsyncExitStack() as stack:
        a, b = await clients(stack, etcd_url, 2)
        positions = [await b.backend.register("g/", wid(), b.session.lease)]  # B's tail
        positions.append(await a.backend.register("g/", wid(), a.session.lease))
        sent = requests_of(b, monkeypatch)
        positions.append(await b.backend.register("g/", wid(), b.session.lease))
        assert sent == ["register"]
        assert positions[-1].ahead == (positions[-2].entry,)
        positions += [await a.backend.register("g/", wid(), a.session.lease) for _ in range(2)]
        sent.clear()
        positions.append(await b.backend.register("g/", wid(), b.session.lease))
        assert sent == ["register", "register"]
        assert positions[-1].ahead == (positions[-2].entry,)
        listed = (await a.backend.entries("g/")).entries
        assert list(listed) == [p.entry for p in positions]
        fences = [e.revision for e in listed]
        assert fences == sorted(set(fences))


async def guessing(stack: AsyncExitStack, url: str) -> tuple[coord.Client, coord.Client]:
    """Clients A and B, and a queue whose tail B knows one registration (A's) old."""
    a, b = await clients(stack, url, 2)
    await b.backend.register("g/", wid(), b.session.lease)
    await a.backend.register("g/", wid(), a.session.lease)
    return a, b


@pytest.mark.parametrize("branch", ["guess", "own"])
async def test_a_lost_answer_is_found_in_the_branch_applied_not_made_twice(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch, branch: str
) -> None:
    """Applied, its answer lost: the repeat finds its entry in whichever branch applied.
    Its own branch applied with one number makes the tail look as its guess expects: the
    guess also asks that the own branch's key be absent, so the settle finds the entry
    instead of moving the tail and registering the waiter a second time."""
    async with AsyncExitStack() as stack:
        if branch == "guess":
            _, b = await guessing(stack, etcd_url)
        else:
            b = (await clients(stack, etcd_url, 1))[0]
            await b.backend.register("g/", wid(), b.session.lease)  # B knows the tail
        _register_faults(b.backend, monkeypatch, "apply")
        waiter = wid()
        with pytest.raises(coord.BackendUnavailable):
            await b.backend.register("g/", waiter, b.session.lease)
        again = await b.backend.register("g/", waiter, b.session.lease)
        mine = [e for e in (await b.backend.entries("g/")).entries if e.key.endswith(waiter)]
        assert mine == [again.entry]


async def test_an_abandoned_guessed_registration_cannot_apply_late(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held back, not applied: its abandonment finds the tail as its guess expects and
    moves it, so the late transaction can apply neither branch."""
    async with AsyncExitStack() as stack:
        a, b = await guessing(stack, etcd_url)
        real, held = _register_faults(b.backend, monkeypatch, "hold")
        waiter = wid()
        with pytest.raises(coord.BackendUnavailable):
            await b.backend.register("g/", waiter, b.session.lease)
        assert await b.backend.delete(Entry("g/" + waiter, lease=b.session.lease.id)) is False
        what, args, kwargs = held[0]
        late = await real(what, *args, **kwargs)
        assert not late.succeeded
        assert not late.responses[2].response_txn.succeeded
        listed = (await a.backend.entries("g/")).entries
        assert not [e for e in listed if e.key.endswith(waiter)]


async def test_a_release_reads_the_tail_for_the_next_registration(
    etcd_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B's own tail is two registrations (A's) old, more than the guess takes; B's release
    reads the tail, so B's next registration goes through in one request."""
    async with AsyncExitStack() as stack:
        a, b = await clients(stack, etcd_url, 2)
        held = await b.backend.register("g/", wid(), b.session.lease)  # B's tail
        behind = [await a.backend.register("g/", wid(), a.session.lease) for _ in range(2)]
        assert await b.backend.delete(held.entry)
        sent = requests_of(b, monkeypatch)
        position = await b.backend.register("g/", wid(), b.session.lease)
        assert sent == ["register"]
        assert position.ahead == (behind[-1].entry,)
