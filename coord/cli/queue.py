"""``coord queue put|ls|dlq|requeue NAME``: a thin shell over :class:`coord.Queue`."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from coord._jobs import records as _records
from coord._sessions.identity import parse_identity

from ._common import NAME, count, identity_in, run, show_identity
from ._store import OneLineUsageError, Store, read_options, store_options

if TYPE_CHECKING:
    import coord

__all__ = ["queue"]

_JSON = click.option("--json", "as_json", is_flag=True, help="A JSON list, for scripts.")


@click.group()
def queue() -> None:
    """Put jobs on a queue, list them, and handle its dead letters.

    The queue NAME is the one workers use through client.queue(NAME); jobs are claimed
    by workers only (async with queue.claim()), not from the shell.
    """


@queue.command()
@click.argument("name", callback=NAME)
@click.argument("payload", required=False)
@click.option("--key", help="Ordering key: jobs with one key run one at a time, in order.")
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
            ref = await queue.put(data, key=key, delay=delay, priority=priority, timeout=timeout)
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
