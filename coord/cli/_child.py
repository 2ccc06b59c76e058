"""Running the wrapped command: stdio inherited, stopped with a signal and then killed."""

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
    """Send *signum*; SIGKILL after *grace* seconds or at a second interrupt."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signum)
    with anyio.move_on_after(grace):
        async with anyio.create_task_group() as tg:

            async def hurry() -> None:
                await interrupt.hurry.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(hurry)
            await process.wait()
            tg.cancel_scope.cancel()
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
