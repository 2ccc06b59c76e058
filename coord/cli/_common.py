"""What the commands share: running a coroutine with one-line errors and signal handling,
exit codes, names, and how an identity is shown (the store options are in :mod:`._store`)."""

from __future__ import annotations

import signal
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import anyio
import click

import coord
from coord._core.keys import check_name

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

    from coord._locks.task_lock import TaskLock

__all__ = [
    "FAILURE",
    "NAME",
    "Interrupt",
    "count",
    "fail",
    "identity_in",
    "release",
    "run",
    "show_identity",
    "waiting",
]

#: Exit status for a failure (usage errors exit 2, by click).
FAILURE = 1


def _check_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return check_name(value)
    except coord.ConfigurationError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


#: ``callback=NAME`` checks a coordination name (``orders/42``) before anything connects.
NAME = _check_name


@dataclass
class Interrupt:
    """The SIGINT or SIGTERM that stops a command: the first cancels its work (a child
    command is sent the same signal), a second one hurries (the child is killed)."""

    signum: signal.Signals | None = None
    hurry: anyio.Event = field(default_factory=anyio.Event)


def run(fn: Callable[[Interrupt], Awaitable[int]]) -> NoReturn:
    """Run ``fn(interrupt)`` on asyncio and exit with its status: 128 + the signal number
    after SIGINT or SIGTERM, 1 with one line on stderr for an error."""
    try:
        code = anyio.run(_supervised, fn, backend="asyncio")
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except Exception as exc:
        fail(_describe(exc))
    sys.exit(code)


async def _supervised(fn: Callable[[Interrupt], Awaitable[int]]) -> int:
    interrupt = Interrupt()
    code = FAILURE
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as work:

                async def follow() -> None:
                    async for signum in signals:
                        if interrupt.signum is None:
                            interrupt.signum = signal.Signals(signum)
                            work.cancel()
                        else:
                            interrupt.hurry.set()

                tg.start_soon(follow)
                code = await fn(interrupt)
            tg.cancel_scope.cancel()
    return 128 + interrupt.signum if interrupt.signum is not None else code


def _describe(exc: BaseException) -> str:
    """One line for an error: the first leaf of an exception group, with its kind."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    if isinstance(exc, coord.BackendUnavailable):
        return f"the store cannot be reached: {exc}"
    if isinstance(exc, coord.CoordError | OSError):
        return str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}"


def fail(message: str) -> NoReturn:
    """Print ``coord: message`` on stderr and exit 1."""
    click.echo(f"coord: {message}", err=True)
    sys.exit(FAILURE)


def count(number: int, noun: str) -> str:
    """``1 job``, ``2 jobs``."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def identity_in(who: Mapping[str, Any]) -> dict[str, Any]:
    """The identity (host, pid, name) in a key's recorded JSON, or {} if it has none."""
    return {k: who[k] for k in ("host", "pid", "name") if k in who} if "pid" in who else {}


def show_identity(who: Mapping[str, Any]) -> str:
    """``pid 42 on host (name)``, or ``unknown`` for a key that records nobody."""
    if not who:
        return "unknown"
    text = f"pid {who.get('pid', '?')} on {who.get('host', '?')}"
    return f"{text} ({who['name']})" if who.get("name") else text


@asynccontextmanager
async def waiting(describe: Callable[[], Awaitable[str]]) -> AsyncIterator[None]:
    """A spinner saying what we wait for (``await describe()``: read only then), on
    stderr when it is a terminal; else nothing."""
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(await describe()):
        yield


async def release(lock: TaskLock) -> coord.LockLost | None:
    """Release what this task holds (shielded); the LockLost that says why, if it had
    been lost."""
    with anyio.CancelScope(shield=True):
        try:
            await lock.release()
        except coord.LockLost as exc:
            return exc
    return None
