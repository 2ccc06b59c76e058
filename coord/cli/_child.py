"""Running the wrapped command: stdio inherited, stopped with a signal and then killed.

The command's work may go on in processes it started (``sh -c "step1 & step2"``), so:

* coord becomes a child subreaper (Linux): a process whose parent exits is re-parented
  to coord, not to init, and stays among coord's descendants;
* the lock is held until the command *and every process below coord* have exited;
* stopping the command stops all of them (read from ``/proc`` at that moment; each is
  then held by a pidfd, so a pid reused meanwhile is never signalled).

A job's command (``coord queue work``, several side by side) runs in a session of its
own instead, with the job's payload on its stdin: its processes are those of its session
(below coord), so that one job's command is waited for and stopped without the others.

What nothing can cover: coord itself killed with SIGKILL. Its key then expires after
the TTL while the command may run on; the fence is what protects the resource then.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
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
    stdin: bytes | None = None,
) -> int | None:
    """Run *command* with *env* added to the environment until it exits (its exit status
    is returned; 128 + N if signal N ended it) or until ``until()`` returns: then it is
    stopped (SIGTERM, SIGKILL after *grace* seconds) and None is returned.

    If cancelled, the command is stopped the same way (with the signal in *interrupt*,
    if one came) before the cancellation goes on.

    :param stdin: None: the command shares coord's stdin, and its processes are all
        those below coord. Bytes: they are the command's stdin, and it runs in a
        session of its own, whose processes are its own (several commands run side by
        side, and a Ctrl-C on the terminal reaches coord only, which decides when to
        pass it on)
    :raises OSError: if the command cannot be started
    """
    _become_subreaper()
    process = await anyio.open_process(
        list(command),
        stdin=None if stdin is None else subprocess.PIPE,
        stdout=None,
        stderr=None,
        env={**os.environ, **env},
        start_new_session=stdin is not None,
    )
    session = None if stdin is None else process.pid
    status: int | None = None
    done = False
    try:
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                await until()
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            if stdin is not None:
                tg.start_soon(_feed, process, stdin)
            status = await process.wait()
            await _wait_for_descendants(session)  # what it started still runs
            done = True
            tg.cancel_scope.cancel()
    finally:
        if not done:
            with anyio.CancelScope(shield=True):
                signum = interrupt.signum or signal.SIGTERM
                await _stop(process, signum, grace, interrupt, session)
    if status is None:
        return None
    return 128 - status if status < 0 else status


async def _feed(process: Process, data: bytes) -> None:
    """Write *data* to the command's stdin and close it (a command that exits without
    reading it all is no error)."""
    assert process.stdin is not None
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        async with process.stdin:
            await process.stdin.send(data)


async def _stop(
    process: Process,
    signum: signal.Signals,
    grace: float,
    interrupt: Interrupt,
    session: int | None = None,
) -> None:
    """Send *signum* to the command and every process below it (of its *session* only,
    if given); SIGKILL to those left after *grace* seconds or at a second interrupt."""
    others = await anyio.to_thread.run_sync(_open_descendants, os.getpid(), process.pid, session)
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


async def _wait_for_descendants(session: int | None) -> None:
    """Return once every process below coord (of *session* only, if given) has exited
    (the command is reaped)."""
    pidfds = await anyio.to_thread.run_sync(_open_descendants, os.getpid(), None, session)
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


def _open_descendants(pid: int, skip: int | None, session: int | None = None) -> list[int]:
    """pidfds of every process below *pid* but *skip*, and only those of *session* if
    it is given (Linux; none where /proc or pidfds are missing). In a thread: it reads
    /proc."""
    if not hasattr(os, "pidfd_open"):
        return []
    children: dict[int, list[int]] = {}
    sessions: dict[int, int] = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
                ppid, sessions[int(name)] = int(fields[1]), int(fields[3])
        except (OSError, ValueError, IndexError):
            continue  # not a process, or gone
        children.setdefault(ppid, []).append(int(name))
    pidfds, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            todo.append(child)
            if child == skip or (session is not None and sessions.get(child) != session):
                continue
            with contextlib.suppress(OSError):  # gone already
                pidfds.append(os.pidfd_open(child))
    return pidfds


def _signal_all(pidfds: list[int], signum: signal.Signals) -> None:
    for pidfd in pidfds:
        with contextlib.suppress(OSError):  # exited (and reaped) already
            signal.pidfd_send_signal(pidfd, signum)
