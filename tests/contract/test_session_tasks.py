"""What an idle lock's acquire and release cost the session in tasks, on every backend.

A registration and a release run in the caller's task where the store undoes a
registration cut short as cheaply as one that answered (``Backend.cheap_abandon``):
a task of the session each would cost a task and a loop turn per acquisition, a
tenth of an uncontended one's time on etcd. Elsewhere (ZooKeeper) the session finishes
each registration in a task of its own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import coord

pytestmark = pytest.mark.anyio


async def test_an_idle_locks_acquire_and_release_start_no_task_but_a_registration(
    clients: list[coord.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    client = clients[0]
    mutex = client.mutex("session-tasks")
    async with mutex:  # the session's own tasks (its deferred starts) are running now
        pass
    session = client.session
    started: list[Any] = []
    real = session.start_soon

    def counting(func: Any) -> None:
        started.append(func)
        real(func)

    monkeypatch.setattr(session, "start_soon", counting)
    for _ in range(3):
        async with mutex:
            pass
    assert len(started) == (0 if client.backend.cheap_abandon else 3)
    assert (await client.backend.entries("session-tasks/")).entries == ()
