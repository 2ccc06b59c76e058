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
