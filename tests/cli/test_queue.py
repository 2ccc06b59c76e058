"""``coord queue put|ls|cancel|unpark|dlq|requeue|purge``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import anyio
import pytest

import coord

if TYPE_CHECKING:
    from ._support import Coord

pytestmark = pytest.mark.etcd


def test_put_ls_dead_letters_requeue(coord_cli: Coord) -> None:
    first = coord_cli.run("queue", "put", "--key", "c1", "emails", "hello").stdout.strip()
    second = coord_cli.run("queue", "put", "emails", input="from stdin").stdout.strip()
    jobs = json.loads(coord_cli.run("queue", "ls", "--json", "emails").stdout)
    assert [(j["id"], j["key"], j["size"], j["state"]) for j in jobs] == [
        (first, "c1", 5, "ready"),
        (second, None, 10, "ready"),
    ]

    async def fail_the_first_job() -> None:
        async with coord.connect(coord_cli.url) as client:
            queue = client.queue("emails", max_attempts=1, on_exhausted="dead_letter")
            with pytest.raises(RuntimeError):
                async with queue.claim():
                    raise RuntimeError("boom")

    anyio.run(fail_the_first_job, backend="asyncio")
    (dead,) = json.loads(coord_cli.run("queue", "dlq", "--json", "emails").stdout)
    assert (dead["id"], dead["attempts"], dead["error"]) == (first, 1, "RuntimeError: boom")
    assert coord_cli.run("queue", "dlq", "emails").stdout.startswith(f"{first}  key=c1  ")

    assert coord_cli.run("queue", "requeue", "emails", first).returncode == 0
    jobs = json.loads(coord_cli.run("queue", "ls", "--json", "emails").stdout)
    assert [j["id"] for j in jobs] == [second, first]  # back at the end
    assert json.loads(coord_cli.run("queue", "dlq", "--json", "emails").stdout) == []

    missing = coord_cli.run("queue", "requeue", "emails", "nope")
    assert missing.returncode == 1
    assert missing.stderr == "coord: queue 'emails' has no dead letter 'nope'\n"


def test_a_keys_later_job_waits_behind_its_earlier_one(coord_cli: Coord) -> None:
    first = coord_cli.run("queue", "put", "--key", "c1", "emails", "a").stdout.strip()
    other = coord_cli.run("queue", "put", "--key", "c2", "emails", "b").stdout.strip()
    later = coord_cli.run("queue", "put", "--key", "c1", "emails", "c").stdout.strip()
    jobs = json.loads(coord_cli.run("queue", "ls", "--json", "emails").stdout)
    assert [(j["id"], j["state"], j["behind"]) for j in jobs] == [
        (first, "ready", None),
        (other, "ready", None),
        (later, "waiting", first),
    ]
    text = coord_cli.run("queue", "ls", "emails").stdout.splitlines()
    assert text[2] == f"{later}  key=c1  attempt=0  waiting behind {first}  1 byte"


def test_nothing_to_list_is_said(coord_cli: Coord) -> None:
    assert coord_cli.run("queue", "ls", "emails").stdout == "no jobs in queue emails\n"
    assert coord_cli.run("queue", "dlq", "emails").stdout == "no dead letters in queue emails\n"
    assert coord_cli.run("status").stdout == "nothing in the store\n"
    coord_cli.run("queue", "put", "emails", "x")
    assert coord_cli.run("status").stdout.startswith(
        "queue emails: 1 job, 0 in flight, 0 parked, 0 dead, 0 idle clients\n"
    )


def test_an_empty_stdin_queues_nothing_unless_asked(coord_cli: Coord) -> None:
    refused = coord_cli.run("queue", "put", "emails", input="")
    assert refused.returncode == 2
    assert refused.stderr == (
        "coord: nothing on stdin to put: an empty job is queued only when asked for, as an "
        "empty PAYLOAD (coord queue put emails '')\n"
    )
    assert json.loads(coord_cli.run("queue", "ls", "--json", "emails").stdout) == []
    asked = coord_cli.run("queue", "put", "emails", "")
    assert asked.returncode == 0, asked.stderr
    (job,) = json.loads(coord_cli.run("queue", "ls", "--json", "emails").stdout)
    assert (job["id"], job["size"]) == (asked.stdout.strip(), 0)


def test_cancel_says_per_job_what_it_did(coord_cli: Coord) -> None:
    held = coord_cli.run("queue", "put", "emails", "held").stdout.strip()
    ids = coord_cli.run("queue", "put", "--job-id", "order-1", "emails", "x").stdout.strip()
    assert ids == "order-1"
    again = coord_cli.run("queue", "put", "--job-id", "order-1", "emails", "x")
    assert again.stdout == "order-1\n"  # a repeated id queues nothing more
    assert len(json.loads(coord_cli.run("queue", "ls", "--json", "emails").stdout)) == 2

    async def cancel_while_held() -> None:
        async with coord.connect(coord_cli.url) as client:
            async with client.queue("emails").claim() as job:
                assert job.id == held
                done = await anyio.to_thread.run_sync(
                    coord_cli.run, "queue", "cancel", "emails", "order-1", held, "nope"
                )
                assert done.stdout == f"order-1: cancelled\n{held}: claimed\nnope: not found\n"
                assert done.returncode == 1, done.stderr
        # the worker acked it

    anyio.run(cancel_while_held, backend="asyncio")
    assert json.loads(coord_cli.run("queue", "ls", "--json", "emails").stdout) == []
    put = coord_cli.run("queue", "put", "--job-id", "order-1", "emails", "x").stdout.strip()
    done = coord_cli.run("queue", "cancel", "emails", put)
    assert (done.returncode, done.stdout) == (0, "order-1: cancelled\n")
    for bad in ([], [""], ["order-1", "a\nb"]):
        refused = coord_cli.run("queue", "cancel", "emails", *bad)
        assert refused.returncode == 2, bad
    assert coord_cli.run("queue", "put", "--job-id", "", "emails", "x").returncode == 2


def _fail_jobs(url: str, name: str, count: int, **options: object) -> None:
    async def fail() -> None:
        async with coord.connect(url) as client:
            queue = client.queue(name, max_attempts=1, **options)  # type: ignore[arg-type]
            for _ in range(count):
                with pytest.raises(RuntimeError):
                    async with queue.claim():
                        raise RuntimeError("boom")

    anyio.run(fail, backend="asyncio")


def test_purge_all_or_some_dead_letters(coord_cli: Coord) -> None:
    ids = [coord_cli.run("queue", "put", "emails", "x").stdout.strip() for _ in range(3)]
    _fail_jobs(coord_cli.url, "emails", 3, on_exhausted="dead_letter")
    assert len(json.loads(coord_cli.run("queue", "dlq", "--json", "emails").stdout)) == 3
    some = coord_cli.run("queue", "purge", "emails", ids[1], "nope")
    assert (some.returncode, some.stdout) == (0, "purged 1 dead letter\n")
    dead = json.loads(coord_cli.run("queue", "dlq", "--json", "emails").stdout)
    assert [d["id"] for d in dead] == [ids[0], ids[2]]
    assert coord_cli.run("queue", "purge", "emails").stdout == "purged 2 dead letters\n"
    assert coord_cli.run("queue", "purge", "emails").stdout == "purged 0 dead letters\n"
    assert coord_cli.run("queue", "dlq", "emails").stdout == "no dead letters in queue emails\n"


def test_unpark_one_key_or_the_jobs_without_one(coord_cli: Coord) -> None:
    coord_cli.run("queue", "put", "--key", "c1", "emails", "a")
    coord_cli.run("queue", "put", "emails", "b")
    coord_cli.run("queue", "put", "--key", "c1", "emails", "c")
    _fail_jobs(coord_cli.url, "emails", 2)  # parks a, then b

    def states() -> list[str]:
        listed = coord_cli.run("queue", "ls", "--json", "emails").stdout
        return [j["state"] for j in json.loads(listed)]

    assert states() == ["parked", "parked", "waiting"]
    for which in ([], ["--key", "c1", "--no-key"]):
        refused = coord_cli.run("queue", "unpark", "emails", *which)
        assert refused.returncode == 2
        assert refused.stderr == (
            "coord: say which parked jobs: coord queue unpark emails --key KEY, or "
            "--no-key for those without a key\n"
        )
    assert coord_cli.run("queue", "unpark", "emails", "--key", "").returncode == 2
    assert coord_cli.run("queue", "unpark", "emails", "--key", "c2").stdout == "unparked 0 jobs\n"
    assert coord_cli.run("queue", "unpark", "emails", "--key", "c1").stdout == "unparked 1 job\n"
    assert states() == ["ready", "parked", "waiting"]
    assert coord_cli.run("queue", "unpark", "emails", "--no-key").stdout == "unparked 1 job\n"
    assert states() == ["ready", "ready", "waiting"]
