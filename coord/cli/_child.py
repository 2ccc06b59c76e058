"""Running the wrapped command: stdio inherited, stopped with a signal and then killed.

Stopping it reaches every process it started too (read from ``/proc`` when it is
stopped): the work a lost lock protected may run in a child (``sh -c "step1; step2"``),
and a shell that dies of SIGTERM leaves its children running. Each process is held by a
pidfd from then on, so a pid reused meanwhile is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence

    from anyio.abc import Process

    from ._common import Interrupt

__all__ = ["NOT_FOUND", "run_until"]

#: Exit status when the command cannot be run (as a shell does).
NOT_FOUND = 127


async def run_until(
    command: Sequence[str],
    *,
    env: Mapping[str, str],
    grace: float,
    interrupt: Interrupt,
    until: Callable[[], Awaitable[None]],
) -> int | None:
    """Run *command* with *env* added to the environment until it exits (its exit status
    is returned; 128 + N if signal N ended it) or until ``until()`` returns: then it is
    stopped (SIGTERM, SIGKILL after *grace* seconds) and None is returned.

    If cancelled, the command is stopped the same way (with the signal in *interrupt*,
    if one came) before the cancellation goes on.

    :raises OSError: if the command cannot be started
    """
    process = await anyio.open_process(
        list(command), stdin=None, stdout=None, stderr=None, env={**os.environ, **env}
    )
    status: int | None = None
    try:
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                await until()
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            status = await process.wait()
            tg.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            with anyio.CancelScope(shield=True):
                await _stop(process, interrupt.signum or signal.SIGTERM, grace, interrupt)
    if status is None:
        return None
    return 128 - status if status < 0 else status


async def _stop(
    process: Process, signum: signal.Signals, grace: float, interrupt: Interrupt
) -> None:
    """Send *signum* to the command and every process below it; SIGKILL to those left
    after *grace* seconds or at a second interrupt."""
    others = await anyio.to_thread.run_sync(_open_descendants, process.pid)
    try:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)
        _signal_all(others, signum)
        with anyio.move_on_after(grace):
            async with anyio.create_task_group() as tg:

                async def hurry() -> None:
                    await interrupt.hurry.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(hurry)
                await process.wait()
                for pidfd in others:
                    await anyio.wait_readable(pidfd)  # a pidfd is readable once it exited
                tg.cancel_scope.cancel()
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        _signal_all(others, signal.SIGKILL)
        await process.wait()
    finally:
        for pidfd in others:
            os.close(pidfd)


def _open_descendants(pid: int) -> list[int]:
    """pidfds of every process below *pid* (Linux; none where /proc or pidfds are
    missing). In a thread: it reads /proc."""
    if not hasattr(os, "pidfd_open"):
        return []
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                ppid = int(stat.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # not a process, or gone
        children.setdefault(ppid, []).append(int(name))
    pidfds, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            todo.append(child)
            with contextlib.suppress(OSError):  # gone already
                pidfds.append(os.pidfd_open(child))
    return pidfds


def _signal_all(pidfds: list[int], signum: signal.Signals) -> None:
    for pidfd in pidfds:
        with contextlib.suppress(OSError):  # exited (and reaped) already
            signal.pidfd_send_signal(pidfd, signum)
