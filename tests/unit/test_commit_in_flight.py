"""How a session's acks and joint transactions go out (coord._jobs.commit.Committer):
alone when nothing is in flight; a second group while one is out only once at least
half as many wait as it carries (two workers of a client each keep one transaction out,
where they took turns, one transaction at a time); and everything waiting goes with the
next answer."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from coord._jobs.commit import Committer
from coord.abc import Entry, Remove

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

pytestmark = pytest.mark.anyio


class _Held:
    """A backend whose transactions are answered (each op's entry None) when let go."""

    def __init__(self) -> None:
        self.sent: list[int] = []  # the members (acks of one Remove) of each transaction
        self.gates: list[anyio.Event] = []
        self.arrived = anyio.Event()

    async def transact(self, ops: Any) -> tuple[None, ...]:
        gate = anyio.Event()
        self.sent.append(len(ops))
        self.gates.append(gate)
        self.arrived.set()
        await gate.wait()
        return (None,) * len(ops)

    async def sent_count(self, n: int) -> None:
        with anyio.fail_after(5):
            while len(self.sent) < n:
                self.arrived = anyio.Event()
                await self.arrived.wait()


def _ack(n: int) -> list[Remove]:
    return [Remove(Entry(f"q/_jobs/@j{n}", b"", 1, 1))]


async def _settled() -> None:
    for _ in range(20):
        await anyio.lowlevel.checkpoint()


async def _two_out(tg: TaskGroup, committer: Committer, backend: _Held) -> None:
    """One ack, then another while it is out: the second goes at once, not after the
    first answer (1 waiting against 1 flying)."""
    tg.start_soon(committer.transact, _ack(0))
    await backend.sent_count(1)
    tg.start_soon(committer.transact, _ack(1))
    await backend.sent_count(2)
    assert backend.sent == [1, 1]


async def test_two_workers_of_a_session_each_keep_a_transaction_out() -> None:
    backend = _Held()
    committer = Committer(SimpleNamespace(backend=backend))  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        await _two_out(tg, committer, backend)
        for gate in backend.gates:
            gate.set()


async def test_a_second_group_waits_for_half_as_many_as_fly() -> None:
    backend = _Held()
    committer = Committer(SimpleNamespace(backend=backend))  # type: ignore[arg-type]

    async def more(*numbers: int) -> None:
        for n in numbers:
            tg.start_soon(committer.transact, _ack(n))
            await _settled()

    async with anyio.create_task_group() as tg:
        await more(0, 1)  # one, then one more (1 waiting against 1 flying)
        await backend.sent_count(2)
        await more(2, 3, 4, 5)
        assert backend.sent == [1, 1]  # two groups out: the most
        backend.gates[0].set()
        await backend.sent_count(3)
        assert backend.sent == [1, 1, 4]  # every one waiting, with the answer
        await more(6, 7, 8)
        assert backend.sent == [1, 1, 4]
        backend.gates[1].set()  # out: the 4; 3 waiting, at least half of 4: they go
        await backend.sent_count(4)
        assert backend.sent == [1, 1, 4, 3]
        await more(9)
        backend.gates[2].set()  # out: the 3; 1 waiting, less than half of 3: it waits
        await _settled()
        assert backend.sent == [1, 1, 4, 3]
        backend.gates[3].set()  # nothing out: it goes
        await backend.sent_count(5)
        assert backend.sent == [1, 1, 4, 3, 1]
        backend.gates[4].set()


async def test_the_rest_of_a_split_group_goes_as_the_second_group() -> None:
    """A group takes at most _MOST operations: the members it leaves behind, if at least
    half as many as it carries, go as the second group at once, not with its answer."""
    backend = _Held()
    committer = Committer(SimpleNamespace(backend=backend))  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        await _two_out(tg, committer, backend)  # two groups out: the most
        for n in range(2, 50):  # 48 wait (32 operations a group at most)
            tg.start_soon(committer.transact, _ack(n))
        await _settled()
        assert backend.sent == [1, 1]
        backend.gates[0].set()
        backend.gates[1].set()
        await backend.sent_count(4)  # 32, and the 16 left: half of the 32 that fly
        assert backend.sent == [1, 1, 32, 16]
        for gate in backend.gates:
            gate.set()


async def test_a_group_whose_sender_is_cancelled_tells_its_members_unknown() -> None:
    """The task that sends a group is cancelled alone while the group is out: the group
    may have been applied, so its other members are told their outcome is unknown
    (BackendUnavailable: the caller reads the store), never sent again alone (a store
    that applied the group refuses a repeat, which would tell a done ack "refused")."""
    from coord._core.exceptions import BackendUnavailable

    backend = _Held()
    committer = Committer(SimpleNamespace(backend=backend))  # type: ignore[arg-type]
    told: dict[int, object] = {}
    scopes: dict[int, anyio.CancelScope] = {}

    async def ack(n: int) -> None:
        with anyio.CancelScope() as scopes[n]:
            try:
                told[n] = await committer.transact(_ack(n))
            except BackendUnavailable as exc:
                told[n] = exc

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for n in (0, 1):  # two groups out: the most
                tg.start_soon(ack, n)
                await backend.sent_count(n + 1)
            for n in (2, 3):
                tg.start_soon(ack, n)
                await _settled()
            backend.gates[0].set()  # the oldest waiting (2) sends 2 and 3
            await backend.sent_count(3)
            assert backend.sent == [1, 1, 2]
            scopes[2].cancel()  # its sender, alone
            await _settled()
            assert isinstance(told.get(3), BackendUnavailable)
            assert backend.sent == [1, 1, 2], "sent again alone"
            for gate in backend.gates:
                gate.set()
    assert 2 not in told


async def test_a_member_whose_operations_cannot_be_made_costs_its_group_nothing() -> None:
    """A joint transaction whose operations raise when numbered in a group is told that
    error; the group goes without it, and its sender is not the one told."""
    backend = _Held()
    committer = Committer(SimpleNamespace(backend=backend))  # type: ignore[arg-type]
    told: dict[str, object] = {}

    def good(seq: int) -> list[Remove]:
        return _ack(100 + seq)

    def bad(seq: int) -> list[Remove]:
        if seq:
            raise ValueError("cannot be made")
        return _ack(200)

    async def joint(name: str, stamped: Any) -> None:
        try:
            told[name] = await committer.transact_joint(stamped)
        except ValueError as exc:
            told[name] = exc

    async def ack(n: int) -> None:
        told[f"ack{n}"] = await committer.transact(_ack(n))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for n in (0, 1):  # two groups out: the most
                tg.start_soon(ack, n)
                await backend.sent_count(n + 1)
            tg.start_soon(joint, "good", good)
            await _settled()
            tg.start_soon(joint, "bad", bad)
            await _settled()
            tg.start_soon(ack, 4)
            await _settled()
            backend.gates[0].set()  # "good" sends the three waiting: "bad" cannot go
            await backend.sent_count(3)
            assert backend.sent == [1, 1, 2]
            for gate in backend.gates:
                gate.set()
    assert isinstance(told["bad"], ValueError)
    assert told["good"] == ((None,), 0)
    assert told["ack4"] == (None,)
