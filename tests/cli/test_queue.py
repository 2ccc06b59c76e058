"""``coord queue put|ls|dlq|requeue``."""

from __future__ import annotations

import json
import re
import time
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


def test_put_options_delay_priority_timeout(coord_cli: Coord) -> None:
    """``--delay`` shows the job waiting until its time; ``--priority`` and
    ``--timeout`` are stored with the job (and a priority needs no more from the shell:
    the command opens the queue with priorities=True)."""
    later = coord_cli.run("queue", "put", "--delay", "3600", "emails", "a").stdout.strip()
    high = coord_cli.run("queue", "put", "--priority", "7", "emails", "b").stdout.strip()
    timed = coord_cli.run("queue", "put", "--timeout", "2.5", "emails", "c").stdout.strip()
    jobs = json.loads(coord_cli.run("queue", "ls", "--json", "emails").stdout)
    assert [(j["id"], j["priority"], j["timeout"]) for j in jobs] == [
        (later, 0, None),
        (high, 7, None),
        (timed, 0, 2.5),
    ]
    assert jobs[0]["state"].startswith("waiting until ")
    assert jobs[0]["not_before"] > time.time() + 3500
    assert [j["state"] for j in jobs[1:]] == ["ready", "ready"]
    text = coord_cli.run("queue", "ls", "emails").stdout.splitlines()
    until = r"waiting until \d\d:\d\d:\d\d"
    assert re.fullmatch(rf"{later}  key=-  attempt=0  {until}  1 byte", text[0])
    assert text[1] == f"{high}  key=-  attempt=0  priority=7  ready  1 byte"

    async def claim_the_high_one() -> None:
        async with coord.connect(coord_cli.url) as client:
            with anyio.fail_after(10):
                async with client.queue("emails", priorities=True).claim() as job:
                    assert job.id == high

    anyio.run(claim_the_high_one, backend="asyncio")


def test_bad_put_options_are_refused(coord_cli: Coord) -> None:
    for args, message in [
        (("--delay", "-1"), "delay must be a number of seconds >= 0"),
        (("--timeout", "0"), "timeout must be a number of seconds > 0"),
        (("--priority", str(2**31)), "priority must be an int from"),
    ]:
        refused = coord_cli.run("queue", "put", *args, "emails", "x")
        assert refused.returncode != 0
        assert message in refused.stderr
    assert coord_cli.run("queue", "ls", "emails").stdout == "no jobs in queue emails\n"
