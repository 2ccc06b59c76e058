"""``coord queue put|ls|cancel|unpark|dlq|requeue|purge|work NAME``: a thin shell over
:class:`coord.Queue`."""

from __future__ import annotations

import json
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any

import click

import coord
from coord._jobs import records as _records
from coord._jobs.put import check_job_id
from coord._sessions.identity import parse_identity

from ._child import NOT_FOUND, run_until
from ._common import FAILURE, NAME, Interrupt, count, identity_in, run, show_identity
from ._store import OneLineUsageError, Store, read_options, store_options
from .lock import WrapsCommand

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["queue"]

_JSON = click.option("--json", "as_json", is_flag=True, help="A JSON list, for scripts.")


@click.group()
def queue() -> None:
    """Put jobs on a queue, list them, cancel them, unpark them, handle its dead
    letters, and work on its jobs.

    The queue NAME is the one workers use through client.queue(NAME); coord queue work
    is such a worker, running a command per job.
    """


def _job_ids(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """``callback=_job_ids`` checks job ids (one, or a tuple) before anything connects."""
    try:
        if value is None or isinstance(value, str):
            return None if value is None else check_job_id(value)
        return tuple(check_job_id(job_id) for job_id in value)
    except coord.ConfigurationError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _job_key(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    try:
        return _records.check_key(value)
    except coord.ConfigurationError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


@queue.command()
@click.argument("name", callback=NAME)
@click.argument("payload", required=False)
@click.option("--key", help="Ordering key: jobs with one key run one at a time, in order.")
@click.option(
    "--job-id",
    callback=_job_ids,
    help="The job's id (default: a fresh one). A put repeating an id queues nothing more "
    "while that job is queued or in flight, and for the queue's dedupe window.",
)
@click.option(
    "--delay",
    type=float,
    metavar="SECONDS",
    help="Claimable only SECONDS from now (a delayed job holds the later jobs of its key).",
)
@click.option(
    "--priority",
    type=int,
    default=0,
    show_default=True,
    help="Higher first among claimable jobs; the queue's workers must open it with "
    "priorities=True.",
)
@click.option(
    "--timeout",
    type=float,
    metavar="SECONDS",
    help="A claim's body running longer is cancelled: a failed attempt.",
)
@store_options
def put(
    store: Store,
    name: str,
    payload: str | None,
    key: str | None,
    delay: float | None,
    priority: int,
    timeout: float | None,
    job_id: str | None,
) -> None:
    """Append a job with PAYLOAD (text; '-' or none: read it from stdin) to queue NAME
    and print its id.

    Nothing on stdin is refused (exit 2): an empty job is queued only when asked for,
    as an empty PAYLOAD ('').
    """
    if payload in (None, "-"):
        data = sys.stdin.buffer.read()
        if not data:
            raise OneLineUsageError(
                "nothing on stdin to put: an empty job is queued only when asked for, "
                f"as an empty PAYLOAD (coord queue put {name} '')"
            )
    else:
        data = payload.encode()

    async def main(_: object) -> int:
        async with store.connect() as client:
            queue = client.queue(name, priorities=priority != 0)
            ref = await queue.put(
                data, key=key, job_id=job_id, delay=delay, priority=priority, timeout=timeout
            )
        click.echo(ref.id)
        return 0

    run(main)


@queue.command(name="ls")
@click.argument("name", callback=NAME)
@_JSON
@read_options
def ls(store: Store, name: str, as_json: bool) -> None:
    """List the jobs of queue NAME in put order: id, key, attempt, priority (if not
    0), state (ready, claimed, parked, retry at HH:MM:SS, waiting until HH:MM:SS for a
    delayed job, or waiting behind the earlier job of its key, which runs first),
    payload size, and who claims it."""

    async def main(_: object) -> int:
        async with store.connect() as client:
            jobs = await _jobs_of(client, name)
        if as_json:
            click.echo(json.dumps(jobs, indent=2))
        elif not jobs:
            click.echo(f"no jobs in queue {name}")
        for job in [] if as_json else jobs:
            who = f"  by {show_identity(job['claimed_by'])}" if job["claimed_by"] else ""
            priority = f"priority={job['priority']}  " if job["priority"] else ""
            click.echo(
                f"{job['id']}  key={job['key'] or '-'}  attempt={job['attempt']}  {priority}"
                f"{_state(job)}  {count(job['size'], 'byte')}{who}"
            )
        return 0

    run(main)


def _state(job: dict[str, Any]) -> str:
    return f"waiting behind {job['behind']}" if job["behind"] else job["state"]


async def _jobs_of(client: coord.Client, name: str) -> list[dict[str, Any]]:
    backend = client.backend
    entries = (await backend.entries(f"{name}/_jobs/")).entries
    claims = {
        _records.id_of(e.key): identity_in(parse_identity(e.value))
        for e in (await backend.entries(f"{name}/_claims/")).entries
    }
    first_of_key: dict[str, str] = {}  # a key's oldest job runs first, the others wait
    jobs = []
    for entry in entries:
        state, payload = _records.decode(entry)
        claimed = state.claim is not None and state.claim in claims
        behind = first_of_key.setdefault(state.key, state.id) if state.key else state.id
        jobs.append(
            {
                "id": state.id,
                "key": state.key,
                "attempt": state.attempt,
                "priority": state.priority,
                "timeout": state.timeout,
                "not_before": state.not_before or None,
                "state": _what(state, claimed, waiting=behind != state.id),
                "behind": behind if behind != state.id else None,
                "error": state.error,
                "size": len(payload),
                "claimed_by": claims.get(state.claim or "", {}) if claimed else {},
            }
        )
    return jobs


def _what(state: _records.State, claimed: bool, *, waiting: bool) -> str:
    if state.parked:
        return "parked"
    if claimed:
        return "claimed"
    if waiting:
        return "waiting"
    if state.not_before > time.time():
        # Backing off after a failed attempt, or delayed at its put.
        what = "retry at " if state.attempt else "waiting until "
        return what + time.strftime("%H:%M:%S", time.localtime(state.not_before))
    return "ready"


@queue.command()
@click.argument("name", callback=NAME)
@_JSON
@read_options
def dlq(store: Store, name: str, as_json: bool) -> None:
    """List the dead letters of queue NAME: id, key, attempts, last error."""

    async def main(_: object) -> int:
        async with store.connect() as client:
            letters = await client.queue(name).dead_letters()
        records = [
            {
                "id": d.id,
                "key": d.key,
                "attempts": d.attempts,
                "error": d.error,
                "size": len(d.payload),
            }
            for d in letters
        ]
        if as_json:
            click.echo(json.dumps(records, indent=2))
        elif not records:
            click.echo(f"no dead letters in queue {name}")
        for r in [] if as_json else records:
            key = r["key"] or "-"
            click.echo(f"{r['id']}  key={key}  attempts={r['attempts']}  error={r['error']}")
        return 0

    run(main)


@queue.command()
@click.argument("name", callback=NAME)
@click.argument("job_ids", nargs=-1, required=True, metavar="JOB_ID...")
@store_options
def requeue(store: Store, name: str, job_ids: tuple[str, ...]) -> None:
    """Put dead letters of queue NAME back at the end of the queue (attempt 0)."""

    async def main(_: object) -> int:
        async with store.connect() as client:
            q = client.queue(name)
            for job_id in job_ids:
                await q.requeue(job_id)
                click.echo(f"requeued {job_id}")
        return 0

    run(main)


@queue.command()
@click.argument("name", callback=NAME)
@click.argument("job_ids", nargs=-1, required=True, metavar="JOB_ID...", callback=_job_ids)
@store_options
def cancel(store: Store, name: str, job_ids: tuple[str, ...]) -> None:
    """Cancel queued jobs of queue NAME: delete each unless a worker holds it now.

    Prints one line per id: cancelled, claimed (a worker has it: it runs, nothing was
    changed), or not found (no queued job has that id: acked, never put, or a dead
    letter: see purge). A parked job, or one waiting to be retried, is queued. Exit
    status 0 if every job was cancelled, 1 if any was not.
    """

    async def main(_: object) -> int:
        cancelled = True
        async with store.connect() as client:
            q = client.queue(name)
            for job_id in job_ids:
                outcome = await q.cancel(job_id)
                click.echo(f"{job_id}: {outcome}")
                cancelled = cancelled and outcome == "cancelled"
        return 0 if cancelled else FAILURE

    run(main)


@queue.command()
@click.argument("name", callback=NAME)
@click.option("--key", callback=_job_key, help="Unpark the parked jobs of this key.")
@click.option("--no-key", is_flag=True, help="Unpark the parked jobs without a key.")
@store_options
def unpark(store: Store, name: str, key: str | None, no_key: bool) -> None:
    """Let the parked jobs of one key of queue NAME be claimed again (attempt 0), and
    print how many. A job is parked after its last attempt failed (the queue's
    on_exhausted="park", the default), and its key waits behind it: say which key,
    with --key KEY, or --no-key for the jobs put without one."""
    if (key is None) == (not no_key):
        raise OneLineUsageError(
            f"say which parked jobs: coord queue unpark {name} --key KEY, or --no-key for "
            "those without a key"
        )

    async def main(_: object) -> int:
        async with store.connect() as client:
            unparked = await client.queue(name).unpark(key)
        click.echo(f"unparked {count(unparked, 'job')}")
        return 0

    run(main)


@queue.command()
@click.argument("name", callback=NAME)
@click.argument("job_ids", nargs=-1, metavar="[JOB_ID]...", callback=_job_ids)
@store_options
def purge(store: Store, name: str, job_ids: tuple[str, ...]) -> None:
    """Delete dead letters of queue NAME: those with the JOB_IDs given, or all of them;
    print how many were deleted (one already gone is not counted)."""

    async def main(_: object) -> int:
        async with store.connect() as client:
            purged = await client.queue(name).purge(job_ids or None)
        click.echo(f"purged {count(purged, 'dead letter')}")
        return 0

    run(main)


#: Seconds between the SIGTERM that stops a job's command after the grace and SIGKILL.
KILL_AFTER = 10.0


class CommandFailed(Exception):
    """A job's command exited with a non-zero status (the job is released for a retry,
    with this as its error)."""


@queue.command(cls=WrapsCommand)
@click.argument("name", callback=NAME)
@click.argument("command", nargs=-1, required=True, metavar="-- CMD [ARGS]...")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="How many jobs run at once (one CMD each).",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds the running commands have to finish after SIGTERM or Ctrl-C.",
)
@store_options
def work(store: Store, name: str, command: tuple[str, ...], concurrency: int, grace: float) -> None:
    """Work on the jobs of queue NAME: run CMD once per job, until SIGTERM or Ctrl-C.

    CMD gets the job's payload on its stdin, and COORD_QUEUE, COORD_JOB_ID,
    COORD_JOB_KEY (empty for a job without a key), COORD_JOB_FENCE and
    COORD_JOB_ATTEMPT (0 on the first) in its environment. Exit status 0 acks the job;
    any other releases it for a retry after a backoff (after 5 attempts it is
    parked: coord queue ls shows it). If the job's claim
    is lost, CMD and what it started get SIGTERM (SIGKILL 10 s later).

    On SIGTERM or Ctrl-C no job is claimed any more, the running commands have --grace
    seconds to finish (and be acked); those still running then get SIGTERM (SIGKILL
    10 s later, or at a second signal), and their jobs are released as they were, for
    another worker. The exit status is then 143 (130 after Ctrl-C).

    \b
    Example:
        coord queue work thumbnails --concurrency 4 -- ./resize.sh
    """
    if shutil.which(command[0]) is None:
        click.echo(f"coord: cannot run {command[0]!r}: command not found", err=True)
        sys.exit(NOT_FOUND)
    run(lambda interrupt: _work(store, name, command, concurrency, grace, interrupt))


async def _work(
    store: Store,
    name: str,
    command: Sequence[str],
    concurrency: int,
    grace: float,
    interrupt: Interrupt,
) -> int:
    async def handler(job: coord.Job) -> None:
        env = {
            "COORD_QUEUE": name,
            "COORD_JOB_ID": job.id,
            "COORD_JOB_KEY": job.key or "",
            "COORD_JOB_FENCE": str(job.fence),
            "COORD_JOB_ATTEMPT": str(job.attempt),
        }
        status = await run_until(
            command,
            env=env,
            grace=KILL_AFTER,
            interrupt=interrupt,
            until=job.wait_lost,
            stdin=job.payload,
        )
        if status:  # (None: stopped because the claim was lost; the claim says so)
            raise CommandFailed(f"{command[0]!r} exited with status {status}")

    async with store.connect() as client:
        # (SIGINT and SIGTERM cancel this: run() drains, then the cancellation goes on)
        await client.queue(name).run(handler, concurrency=concurrency, grace=grace, signals=())
    return 0
