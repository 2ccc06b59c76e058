"""``coord queue put|ls|cancel|unpark|dlq|requeue|purge|work``."""

from __future__ import annotations

import json
import re
import signal
import time
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import coord

from ._support import Coord, wait_until

# Each test runs up to a dozen or more `coord` processes (each bounded by 15 s of its
# own): at the start of a loaded suite one of them ran past the default 20 s for the
# whole test (test_unpark_one_key_or_the_jobs_without_one, 9.5 s on a quieter run).
pytestmark = pytest.mark.timeout(60)

if TYPE_CHECKING:
    from pathlib import Path

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


def _jobs(cli: Coord, name: str) -> list[dict[str, Any]]:
    done = cli.run("queue", "ls", "--json", name)
    assert done.returncode == 0, done.stderr
    jobs: list[dict[str, Any]] = json.loads(done.stdout)
    return jobs


#: A job's command: its payload and environment, kept in files named for the job.
_RECORD = 'cat > "$COORD_JOB_ID.in"; env | grep ^COORD_ | sort > "$COORD_JOB_ID.env"'


def _works_each_job_once(cli: Coord) -> None:
    ids = [
        cli.run("queue", "put", "--key", "c1", "emails", "hello").stdout.strip(),
        cli.run("queue", "put", "emails", "second").stdout.strip(),
        cli.run("queue", "put", "emails", "").stdout.strip(),
    ]
    worker = cli.start("queue", "work", "emails", "--concurrency", "2", "--", "sh", "-c", _RECORD)
    wait_until(lambda: _jobs(cli, "emails") == [], "the jobs to be acked")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 128 + signal.SIGTERM
    payloads = [(cli.cwd / f"{i}.in").read_text() for i in ids]
    assert payloads == ["hello", "second", ""]
    envs = [
        dict(line.split("=", 1) for line in (cli.cwd / f"{i}.env").read_text().split()) for i in ids
    ]
    assert [(e["COORD_QUEUE"], e["COORD_JOB_ID"], e["COORD_JOB_ATTEMPT"]) for e in envs] == [
        ("emails", i, "0") for i in ids
    ]
    assert [e.get("COORD_JOB_KEY", "") for e in envs] == ["c1", "", ""]
    fences = [int(e["COORD_JOB_FENCE"]) for e in envs]
    assert len(set(fences)) == 3
    assert all(f > 0 for f in fences)


@pytest.mark.etcd
def test_work_runs_the_command_once_per_job_with_its_payload_and_env(coord_cli: Coord) -> None:
    _works_each_job_once(coord_cli)


@pytest.mark.zookeeper
def test_work_on_zookeeper(zookeeper_url: str, tmp_path: Path) -> None:
    cli = Coord(zookeeper_url, tmp_path)
    try:
        _works_each_job_once(cli)
    finally:
        cli.close()


@pytest.mark.etcd
def test_work_a_failing_command_releases_the_job_for_a_retry(coord_cli: Coord) -> None:
    job = coord_cli.run("queue", "put", "emails", "x").stdout.strip()
    script = 'echo "$COORD_JOB_ATTEMPT" >> attempts; [ "$COORD_JOB_ATTEMPT" -gt 0 ] || exit 3'
    worker = coord_cli.start("queue", "work", "emails", "--", "sh", "-c", script)
    attempts = coord_cli.cwd / "attempts"
    wait_until(lambda: attempts.exists() and attempts.read_text() == "0\n", "the first run")
    wait_until(lambda: _jobs(coord_cli, "emails") == [], "the retry to be acked")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 128 + signal.SIGTERM
    assert attempts.read_text() == "0\n1\n"
    assert job not in coord_cli.run("queue", "dlq", "emails").stdout


@pytest.mark.etcd
def test_work_sigterm_lets_the_running_command_finish_and_acks_its_job(coord_cli: Coord) -> None:
    coord_cli.run("queue", "put", "emails", "x")
    script = "touch started; sleep 1; touch finished"
    worker = coord_cli.start("queue", "work", "emails", "--grace", "10", "--", "sh", "-c", script)
    wait_until((coord_cli.cwd / "started").exists, "the command to start")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 128 + signal.SIGTERM
    assert (coord_cli.cwd / "finished").exists(), "the command was stopped before it finished"
    assert _jobs(coord_cli, "emails") == []


@pytest.mark.etcd
def test_work_after_the_grace_the_command_gets_sigterm_and_its_job_is_released(
    coord_cli: Coord,
) -> None:
    job = coord_cli.run("queue", "put", "emails", "x").stdout.strip()
    stopped = coord_cli.cwd / "stopped"
    script = (
        f"trap 'echo TERM > {stopped}; exit 0' TERM; touch started; while :; do sleep 0.05; done"
    )
    worker = coord_cli.start("queue", "work", "emails", "--grace", "0.5", "--", "sh", "-c", script)
    wait_until((coord_cli.cwd / "started").exists, "the command to start")
    signalled = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    wait_until(stopped.exists, "the command to get SIGTERM")
    assert time.monotonic() - signalled >= 0.5, "stopped before the grace was over"
    assert worker.wait(timeout=10) == 128 + signal.SIGTERM
    assert stopped.read_text() == "TERM\n"
    (left,) = _jobs(coord_cli, "emails")
    assert (left["id"], left["attempt"], left["state"]) == (job, 0, "ready")


@pytest.mark.etcd
def test_work_a_command_not_found_exits_127_before_claiming(coord_cli: Coord) -> None:
    coord_cli.run("queue", "put", "emails", "x")
    done = coord_cli.run("queue", "work", "emails", "--", "./no-such-command")
    assert done.returncode == 127
    assert done.stderr == "coord: cannot run './no-such-command': command not found\n"
    (left,) = _jobs(coord_cli, "emails")
    assert left["attempt"] == 0


@pytest.mark.etcd
def test_work_runs_commands_side_by_side_each_acked_when_its_own_ends(coord_cli: Coord) -> None:
    """Each command's processes are its own: a job is acked when its command (and what
    it started) ends, not when every command below coord has."""
    slow = coord_cli.run("queue", "put", "emails", "slow").stdout.strip()
    coord_cli.run("queue", "put", "emails", "fast")
    script = (
        'if [ "$(cat)" = slow ]; then (while [ ! -e go ]; do sleep 0.05; done) & fi; '
        'touch "$COORD_JOB_ID.ran"'
    )
    worker = coord_cli.start(
        "queue", "work", "emails", "--concurrency", "2", "--", "sh", "-c", script
    )
    wait_until(lambda: [j["id"] for j in _jobs(coord_cli, "emails")] == [slow], "the fast ack")
    (left,) = _jobs(coord_cli, "emails")
    assert left["state"] == "claimed", "acked while what its command started still ran"
    (coord_cli.cwd / "go").touch()
    wait_until(lambda: _jobs(coord_cli, "emails") == [], "the slow job's ack")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 128 + signal.SIGTERM


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
