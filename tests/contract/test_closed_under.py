"""A session lost and closed under a call means "the next session", never ClosedError
while the client is open, on every backend.

A client's keeper closes each session once it is lost, and opens the next. A call that
was using the lost session can find it closed by the time its reply comes: a
registration answered after the loss, a claim whose transaction came back just then.
Whatever it was, a waiter waits on the next session, a holder is told ``LockLost`` (or its
subclass), and ``Group.run`` / ``Partitioner.run`` join again; ``ClosedError`` is for a
closed client only.

The race is made deterministic: the store's answer is held back until the session has
been declared lost and its keeper has closed it (the next one is not open yet).
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import pytest

from ._recorder import Recorder

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from contextlib import AbstractAsyncContextManager

    import coord
    from coord.abc import Backend

pytestmark = pytest.mark.anyio

NAME = "closed-under"


async def lose_session(client: coord.Client) -> None:
    """Declare the client's session lost; return once its keeper has closed it (before
    the next session is open)."""
    session = client.session
    session.declare_lost("lost by the test")
    while session.running:
        await anyio.lowlevel.checkpoint()


def lose_after(client: coord.Client, monkeypatch: pytest.MonkeyPatch, method: str) -> list[int]:
    """Make the first call of ``client.backend.<method>`` that writes on the session's
    lease lose the session once the store has answered, before the answer is returned.
    Returns a list that counts the losses made (one at most)."""
    backend: Backend = client.backend
    real = getattr(backend, method)
    made: list[int] = []

    async def losing(*args: Any, **kwargs: Any) -> Any:
        answer = await real(*args, **kwargs)
        if not made and _on_lease(method, args):
            made.append(1)
            await lose_session(client)
        return answer

    monkeypatch.setattr(backend, method, losing)
    return made


def _on_lease(method: str, args: tuple[Any, ...]) -> bool:
    if method == "register":
        return args[2] is not None  # (prefix, waiter_id, lease): not a durable entry
    ops = args[0]  # transact(ops): one that creates an entry on a lease (a claim)
    return any(getattr(op, "lease", None) is not None for op in ops)


@asynccontextmanager
async def _partition_owner(client: coord.Client) -> AsyncIterator[Any]:
    async with client.partitioner(NAME, partitions=2).join() as owner:
        yield owner.membership


HOLDS = [
    pytest.param(lambda c: c.mutex(NAME), id="mutex"),
    pytest.param(lambda c: c.mutex(NAME, local_handoff=2), id="mutex-cohort"),
    pytest.param(lambda c: c.semaphore(NAME, 2), id="semaphore"),
    pytest.param(lambda c: c.rwlock(NAME).read, id="rwlock-read"),
    pytest.param(lambda c: c.rwlock(NAME).write, id="rwlock-write"),
    pytest.param(lambda c: c.election(NAME).campaign(b"x"), id="election"),
    pytest.param(lambda c: c.group(NAME).join(b"x"), id="group"),
    pytest.param(_partition_owner, id="partitioner"),
]


@pytest.mark.parametrize("make", HOLDS)
async def test_a_registration_answered_after_the_session_closed_waits_on_the_next(
    clients: list[coord.Client],
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[[coord.Client], AbstractAsyncContextManager[Any]],
) -> None:
    client = clients[0]
    first = client.session
    made = lose_after(client, monkeypatch, "register")
    with anyio.fail_after(15):
        async with make(client) as held:
            assert made
            assert held.session is not first
            assert not held.session.lost
            assert not held.lost


async def test_a_claim_answered_after_the_session_closed_claims_on_the_next(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    client = clients[0]
    queue = client.queue(NAME, retry_delay=0.01)
    await queue.put(b"job")
    first = client.session
    made = lose_after(client, monkeypatch, "transact")
    with anyio.fail_after(15):
        async with queue.claim() as job:
            assert made
            assert job.payload == b"job"
            assert client.session is not first


@pytest.mark.parametrize("recipe", ["group", "partitioner"])
async def test_run_keeps_joining_when_a_registration_comes_back_after_the_close(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch, recipe: str
) -> None:
    client = clients[0]
    first = client.session
    made = lose_after(client, monkeypatch, "register")
    sessions: Recorder[coord.Session] = Recorder()

    async def member(membership: coord.Membership) -> None:
        sessions.append(membership.session)

    async def work(hold: coord.PartitionHold) -> None:
        sessions.append(hold.session)

    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            if recipe == "group":
                tg.start_soon(lambda: client.group(NAME).run(member, cooldown=0.05))
            else:
                tg.start_soon(lambda: client.partitioner(NAME, partitions=1).run(work))
            await sessions.wait_for(lambda items: len(items) >= 1)
            assert made
            assert sessions.items[0] is not first
            tg.cancel_scope.cancel()
