"""Running the wrapped command: stdio inherited, stopped with a signal and then killed.

The command's work may go on in processes it started (``sh -c "step1 & step2"``), so:

* coord becomes a child subreaper (Linux): a process whose parent exits is re-parented
  to coord, not to init, and stays among coord's descendants;
* the lock is held until the command *and every process below coord* have exited;
* stopping the command stops all of them (read from ``/proc`` at that moment; each is
  then held by a pidfd, so a pid reused meanwhile is never signalled).

What nothing can cover: coord itself killed with SIGKILL. Its key then expires after
the TTL while the command may run on; the fence is what protects the resource then.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence

    from anyio.abc import Process

    from ._common import Interrupt

__all__ = ["NOT_FOUND", "run_until"]

_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>

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
    _become_subreaper()
    process = await anyio.open_process(
        list(command), stdin=None, stdout=None, stderr=None, env={**os.environ, **env}
    )
    status: int | None = None
    done = False
    try:
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                await until()
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            status = await process.wait()
            await _wait_for_descendants()  # what it started still runs under the lock
            done = True
            tg.cancel_scope.cancel()
    finally:
        if not done:
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
    others = await anyio.to_thread.run_sync(_open_descendants, os.getpid(), process.pid)
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


async def _wait_for_descendants() -> None:
    """Return once every process below coord has exited (the command is reaped)."""
    pidfds = await anyio.to_thread.run_sync(_open_descendants, os.getpid(), None)
    try:
        for pidfd in pidfds:
            await anyio.wait_readable(pidfd)  # a pidfd is readable once it exited
    finally:
        for pidfd in pidfds:
            os.close(pidfd)


def _become_subreaper() -> None:
    """Orphans below coord are re-parented to coord (Linux's PR_SET_CHILD_SUBREAPER)
    instead of init, so that they can still be found and stopped. Elsewhere: nothing."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _open_descendants(pid: int, skip: int | None) -> list[int]:
    """pidfds of every process below *pid* but *skip* (Linux; none where /proc or
    pidfds are missing). In a thread: it reads /proc."""
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
            if child == skip:
                continue
            with contextlib.suppress(OSError):  # gone already
                pidfds.append(os.pidfd_open(child))
    return pidfds


def _signal_all(pidfds: list[int], signum: signal.Signals) -> None:
    for pidfd in pidfds:
        with contextlib.suppress(OSError):  # exited (and reaped) already
            signal.pidfd_send_signal(pidfd, signum)
