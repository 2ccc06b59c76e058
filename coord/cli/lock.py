"""``coord lock NAME -- CMD...``: run a command while holding a mutex."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

import coord

from ._child import NOT_FOUND, run_until
from ._common import (
    FAILURE,
    NAME,
    Interrupt,
    release,
    run,
    show_identity,
    waiting,
)
from ._store import Store, store_options

if TYPE_CHECKING:
    from collections.abc import Sequence

    from coord._locks.task_lock import TaskLock

__all__ = ["GRACE", "LAYOUT", "WrapsCommand", "lock", "lost_how", "run_holding", "who_holds"]

GRACE = click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL when the command must stop.",
)

LAYOUT = click.option(
    "--layout",
    type=click.Choice(["coord", "etcd", "kazoo", "curator"]),
    default="coord",
    show_default=True,
    help="The keys' layout: 'etcd' shares NAME with `etcdctl lock NAME` / `etcdctl elect "
    "NAME` and Go's client/v3/concurrency (etcd:// only; the name is the etcd key prefix "
    "under the URL's namespace); 'kazoo' and 'curator' share it with kazoo's Lock/Election "
    "and Curator's InterProcessMutex/LeaderLatch (zk:// only; the name is the lock's "
    "node under the URL's chroot).",
)


class WrapsCommand(click.Command):
    """A command that runs another, ``coord CMD [OPTIONS] NAME -- CMD [ARGS]...``: the two
    usage errors that come from where ``--`` is are said as such (exit status 2).

    * CMD's own options taken for coord's (``coord lock demo ls -l``): the error says
      that they go after ``--``;
    * NAME left out (``coord lock -- sleep 1``): everything after ``--`` is CMD, so
      NAME must come before it; otherwise ``sleep`` would be the name and ``1`` the
      command (found missing, exit 127).
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)
        try:
            rest = super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            if "--" in given:
                raise
            hint = f"To give options to the command, put -- before it: {ctx.command_path}"
            message = f"{exc.message} {hint} NAME -- CMD [ARGS]..."
            raise click.NoSuchOption(exc.option_name, message, exc.possibilities, ctx) from None
        except click.MissingParameter:
            _check_name_before_dashes(ctx, given)
            raise
        _check_name_before_dashes(ctx, given)
        return rest


def _check_name_before_dashes(ctx: click.Context, given: list[str]) -> None:
    """Raise a usage error if NAME was taken from after ``--`` (so it was left out)."""
    if "--" not in given:
        return
    after = given[given.index("--") + 1 :]
    command = ctx.params.get("command") or ()
    if after and after[0] == ctx.params.get("name") and len(after) == len(command) + 1:
        raise click.UsageError(
            f"NAME is missing: it goes before --, and everything after -- is the command "
            f"(here {after[0]!r} would be taken for NAME)",
            ctx,
        )


@click.command(cls=WrapsCommand)
@click.argument("name", callback=NAME)
@click.argument("command", nargs=-1, required=True, metavar="-- CMD [ARGS]...")
@click.option("--try", "try_", is_flag=True, help="Fail at once (exit 1) if NAME is taken.")
@GRACE
@LAYOUT
@store_options
def lock(
    store: Store, name: str, command: tuple[str, ...], try_: bool, grace: float, layout: str
) -> None:
    """Run CMD while holding the mutex NAME; exit with CMD's status.

    Waits in FIFO order behind the holder and earlier waiters (a spinner on a terminal
    says for whom). CMD gets COORD_LOCK=NAME and COORD_FENCE=<fence> in its environment:
    the fence strictly increases from holder to holder, so a store that CMD writes to
    can refuse a stale holder's writes. The lock is held until CMD and every process it
    started have exited.

    NAME goes before --, and CMD's own options after it.

    If the lock is lost while CMD runs (the session expired, or the key was deleted),
    CMD and every process it started get SIGTERM (SIGKILL after --grace seconds) and
    coord exits 1 with one line on stderr. Ctrl-C or SIGTERM to coord is passed on to
    them, then the lock is released; the exit status is then 130 or 143.

    With --layout etcd the lock is the one `etcdctl lock NAME` and Go's
    concurrency.Mutex take: they and coord wait for each other, in the order they came.

    \b
    Example:
        coord lock nightly-backup -- ./backup.sh --full
        coord lock --layout etcd nightly-backup -- ./backup.sh
    """
    run(
        lambda interrupt: _lock(
            store, name, command, try_=try_, grace=grace, i=interrupt, layout=layout
        )
    )


async def _lock(
    store: Store,
    name: str,
    command: Sequence[str],
    *,
    try_: bool,
    grace: float,
    i: Interrupt,
    layout: str = "coord",
) -> int:
    async with store.connect() as client:
        mutex = client.mutex(name, layout=layout)
        if try_:
            try:
                hold = await mutex.try_acquire()
            except coord.LockedError:
                click.echo(f"coord: {name} is held by {await who_holds(mutex)}", err=True)
                return FAILURE
        else:

            async def what() -> str:
                return f"waiting for lock {name} (held by {await who_holds(mutex)})"

            async with waiting(what):
                hold = await mutex.acquire()
        env = {"COORD_LOCK": name, "COORD_FENCE": str(hold.fence)}
        status, lost = await run_holding(mutex, hold, command, env, grace, i)
        if lost is not None or status is None:
            click.echo(f"coord: lock lost, {lost_how(command, status)}: {lost}", err=True)
            return FAILURE
        return status


async def run_holding(
    lock: TaskLock,
    hold: coord.Hold,
    command: Sequence[str],
    env: dict[str, str],
    grace: float,
    interrupt: Interrupt,
) -> tuple[int | None, coord.LockLost | None]:
    """Run *command* while *hold* lasts, then release *lock*: CMD's exit status (None
    if it was stopped because the hold was lost), and the LockLost if it was."""
    try:
        status = await run_until(
            command, env=env, grace=grace, interrupt=interrupt, until=hold.wait_lost
        )
    except OSError as exc:
        click.echo(f"coord: cannot run {command[0]!r}: {exc.strerror or exc}", err=True)
        status = NOT_FOUND
    finally:
        lost = await release(lock)
    return status, lost


def lost_how(command: Sequence[str], status: int | None) -> str:
    """What became of the command when the hold was lost: stopped by us, or it had
    ended by itself (the loss was found at the release: it may have run unlocked)."""
    if status is None:
        return f"{command[0]!r} stopped"
    return f"{command[0]!r} had exited with status {status}, not all of it under the lock"


async def who_holds(lock: coord.Mutex | coord.Semaphore) -> str:
    """Who holds *lock* now (one read), for messages."""
    holders = await lock.holders()
    # A Go peer's key records nobody: its key (<name>/<lease id>) says which session.
    shown = [show_identity(h.identity) if h.identity else f"key {h.key}" for h in holders]
    return ", ".join(shown) or "nobody"
