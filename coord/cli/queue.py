"""``coord queue put|ls|dlq|requeue NAME``: a thin shell over :class:`coord.Queue`."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from coord import _jobs
from coord._waiters import parse_identity

from ._common import NAME, identity_in, run, show_identity
from ._store import Store, read_options, store_options

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
@store_options
def put(store: Store, name: str, payload: str | None, key: str | None) -> None:
    """Append a job with PAYLOAD (text; '-' or none: read it from stdin) to queue NAME
    and print its id."""
    data = sys.stdin.buffer.read() if payload in (None, "-") else payload.encode()

    async def main(_: object) -> int:
        async with store.connect() as client:
            ref = await client.queue(name).put(data, key=key)
        click.echo(ref.id)
        return 0

    run(main)


@queue.command(name="ls")
@click.argument("name", callback=NAME)
@_JSON
@read_options
def ls(store: Store, name: str, as_json: bool) -> None:
    """List the jobs of queue NAME in put order: id, key, attempt, state (ready,
    claimed, parked, retry at HH:MM:SS), payload size, and who claims it."""

    async def main(_: object) -> int:
        async with store.connect() as client:
            jobs = await _jobs_of(client, name)
        if as_json:
            click.echo(json.dumps(jobs, indent=2))
        for job in [] if as_json else jobs:
            who = f"  by {show_identity(job['claimed_by'])}" if job["claimed_by"] else ""
            click.echo(
                f"{job['id']}  key={job['key'] or '-'}  attempt={job['attempt']}  {job['state']}"
                f"  {job['size']} bytes{who}"
            )
        return 0

    run(main)


async def _jobs_of(client: coord.Client, name: str) -> list[dict[str, Any]]:
    backend = client.backend
    entries = (await backend.entries(f"{name}/_jobs/")).entries
    claims = {
        _jobs.id_of(e.key): identity_in(parse_identity(e.value))
        for e in (await backend.entries(f"{name}/_claims/")).entries
    }
    jobs = []
    for entry in entries:
        state, payload = _jobs.decode(entry)
        claimed = state.claim is not None and state.claim in claims
        if state.parked:
            what = "parked"
        elif claimed:
            what = "claimed"
        elif state.not_before > time.time():
            what = "retry at " + time.strftime("%H:%M:%S", time.localtime(state.not_before))
        else:
            what = "ready"
        jobs.append(
            {
                "id": state.id,
                "key": state.key,
                "attempt": state.attempt,
                "state": what,
                "error": state.error,
                "size": len(payload),
                "claimed_by": claims.get(state.claim or "", {}) if claimed else {},
            }
        )
    return jobs


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
