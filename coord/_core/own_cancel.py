"""A task's own cancellation: asyncio's ``task.cancel()`` made by user code in a task that
coord runs it in (a ``queue.run()`` worker, a partitioner's task per partition).

Such a task runs the user's code inside coord's own anyio scopes, and no one outside
holds it, so a native cancellation there comes from the user's code (its
``asyncio.current_task().cancel()``, or a ``CancelledError`` it raised or let through
from a task it awaited), never from coord, whose cancellations are its scopes'. Let
through, it would end coord's task: the loop would stop with no error. So the loops
tell it from a scope's (:func:`by_scope`), withdraw it (:func:`withdraw`) and raise the
user code's failure instead (:func:`as_failure`). One the user code took itself still
counts on the task, and a cancel scope of coord's that cuts it short later does not take
that scope's own cancellation then: ``queue.run()``'s claim block withdraws both and
tells its scope's (``Claiming.__aexit__``: the job's timeout, the claim's loss), and at
the drain the job is given back as it was (``_Workers._escaped``). Inert on trio, which
has no native cancellation.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING

import anyio

from .background import asyncio_task

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["as_failure", "by_scope", "pending", "withdraw"]


async def as_failure(call: Callable[[], Awaitable[object]], error: Callable[[], Exception]) -> None:
    """Await ``call()``; a native cancellation of its own (it raised ``CancelledError``
    with no cancel scope around cancelled, or returned with one still to come) is
    withdrawn and raised as ``error()``, chained. One it took itself and returned after
    is withdrawn too (its own business). A scope's cancellation is raised as itself."""
    try:
        await call()
    except asyncio.CancelledError as exc:
        if by_scope():
            raise
        await withdraw()
        raise error() from exc
    if pending() and await withdraw():
        raise error()


def by_scope() -> bool:
    """Whether a cancel scope around the caller is cancelled (coord's, or one of the
    caller's own that reaches this task): a cancellation seen now is that scope's."""
    return anyio.current_effective_deadline() == -math.inf


def pending() -> bool:
    """Whether the current task holds cancellation requests of its own (asyncio's
    ``Task.cancelling()`` with no cancel scope around it cancelled). Not a checkpoint."""
    task = asyncio_task()
    return task is not None and task.cancelling() > 0 and not by_scope()


async def withdraw() -> bool:
    """Withdraw the current task's own cancellation: take the ``CancelledError`` still to
    come, if any (on Python 3.11 ``Task.uncancel()`` leaves one that ``cancel()`` made
    while the task ran), then every request. Call it with no cancel scope around
    cancelled (see :func:`by_scope`). Whether a ``CancelledError`` was still to come.

    :raises CancelledError: a cancel scope's, come meanwhile (left to that scope)
    """
    task = asyncio_task()
    if task is None:
        return False
    came = False
    while True:
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            if by_scope():
                raise
            came = True
            continue
        break
    if not by_scope():  # (else the scope's own request is among them: left to it)
        while task.cancelling():
            task.uncancel()
    return came
