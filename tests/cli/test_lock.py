"""``coord lock``: exit status, --try, FIFO order between processes, loss, signals."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import anyio
import pytest

import coord
from coord.testing import drop_key

from ._support import Coord, wait_until

HOST = socket.gethostname()


@pytest.mark.etcd
def test_exit_status_and_fence_pass_through(coord_cli: Coord) -> None:
    done = coord_cli.run("lock", "job", "--", "sh", "-c", 'echo "$COORD_LOCK $COORD_FENCE"; exit 7')
    assert done.returncode == 7, done.stderr
    name, fence = done.stdout.split()
    assert name == "job"
    assert int(fence) > 0
    again = coord_cli.run("lock", "job", "--", "sh", "-c", 'echo "$COORD_FENCE"')
    assert again.returncode == 0
    assert int(again.stdout) > int(fence), "fences must increase from holder to holder"


@pytest.mark.etcd
def test_try_fails_at_once_on_a_held_lock_and_sigterm_is_forwarded(coord_cli: Coord) -> None:
    ran, stopped = coord_cli.cwd / "ran", coord_cli.cwd / "stopped"
    script = f"trap 'echo TERM > {stopped}; exit 0' TERM; touch {ran}; while :; do sleep 0.05; done"
    holder = coord_cli.start("lock", "--name", "holder-1", "job", "--", "sh", "-c", script)
    wait_until(ran.exists, "the holder's command to start")

    refused = coord_cli.run("lock", "--try", "job", "--", "touch", "never")
    assert refused.returncode == 1
    assert refused.stderr.strip() == f"coord: job is held by pid {holder.pid} on {HOST} (holder-1)"
    assert not (coord_cli.cwd / "never").exists()

    holder.send_signal(signal.SIGTERM)
    assert holder.wait(timeout=10) == 128 + signal.SIGTERM
    assert stopped.read_text() == "TERM\n", "the command did not get the SIGTERM"
    assert coord_cli.entries("job") == [], "the lock was not released"
    free = coord_cli.run("lock", "--try", "job", "--", "true")
    assert free.returncode == 0, free.stderr


@pytest.mark.etcd
def test_second_waits_for_first_in_order_and_status_shows_both(coord_cli: Coord) -> None:
    log, go = coord_cli.cwd / "log", coord_cli.cwd / "go"

    def script(who: str) -> str:
        # Each appends when it starts and ends; the first holds until "go" exists.
        return (
            f'echo "{who} start $COORD_FENCE" >> {log}; '
            f"while [ {who} = A ] && [ ! -e {go} ]; do sleep 0.05; done; echo {who} end >> {log}"
        )

    first = coord_cli.start("lock", "--identity", "first", "job", "--", "sh", "-c", script("A"))
    wait_until(log.exists, "A to hold the lock")
    second = coord_cli.start("lock", "job", "--", "sh", "-c", script("B"))
    wait_until(lambda: len(coord_cli.entries("job")) == 2, "B to queue behind A")

    holder, waiter = coord_cli.entries("job")
    assert (holder["holding"], waiter["holding"]) == (True, False)
    assert holder["identity"] == {"host": HOST, "pid": first.pid, "name": "first"}
    assert waiter["identity"] == {"host": HOST, "pid": second.pid}
    assert holder["fence"] < waiter["fence"]
    assert holder["since"] <= waiter["since"] <= time.time() + 0.001  # (rounded to 1 ms)
    assert log.read_text().splitlines() == [f"A start {holder['fence']}"]
    text = coord_cli.run("status", "job").stdout.splitlines()
    assert [line.split()[0] for line in text[1:]] == ["holds", "waits"]
    assert all(re.search(r"\(registered \d+\.\ds ago\)$", line) for line in text[1:]), text

    go.touch()
    assert first.wait(timeout=10) == 0
    assert second.wait(timeout=10) == 0
    assert log.read_text().splitlines() == [
        f"A start {holder['fence']}",
        "A end",
        f"B start {waiter['fence']}",
        "B end",
    ]
    # Piped stderr: no spinner, no escape codes, nothing at all.
    assert second.communicate()[1] == ""


@pytest.mark.etcd
def test_lost_lock_stops_the_command(coord_cli: Coord) -> None:
    ran, stopped = coord_cli.cwd / "ran", coord_cli.cwd / "stopped"
    script = f"trap 'echo TERM > {stopped}; exit 0' TERM; touch {ran}; while :; do sleep 0.05; done"
    holder = coord_cli.start("lock", "job", "--", "sh", "-c", script)
    wait_until(ran.exists, "the command to start")
    _drop_the_holders_key(coord_cli.url, "job")
    assert holder.wait(timeout=10) == 1
    assert stopped.read_text() == "TERM\n"
    # One line of coord's own (the shell may add its "Terminated" for its sleep, which
    # was stopped too).
    ours = [line for line in holder.communicate()[1].splitlines() if line.startswith("coord")]
    assert len(ours) == 1, ours
    assert ours[0].startswith("coord: lock lost, 'sh' stopped: 'job' was lost while held")
    assert "deleted by someone else" in ours[0]


@pytest.mark.etcd
def test_lost_lock_stops_what_the_command_started_too(coord_cli: Coord) -> None:
    """The protected work may run in a child of CMD: a shell that dies of SIGTERM would
    leave it running, still writing after the lock went to someone else."""
    pids = coord_cli.cwd / "pids"
    # An orphan (its parent, a subshell, has exited) and a child of the shell.
    script = (
        f"(sleep 300 & echo $! > {pids}.1); sleep 301 & echo $! > {pids}.2; "
        f"mv {pids}.1 {pids}; wait"
    )
    holder = coord_cli.start("lock", "job", "--", "sh", "-c", script, stderr=subprocess.DEVNULL)
    wait_until(pids.exists, "the command to start its children")
    orphan, child = int(pids.read_text()), int(Path(f"{pids}.2").read_text())
    assert _alive(orphan)
    assert _alive(child)
    _drop_the_holders_key(coord_cli.url, "job")
    assert holder.wait(timeout=10) == 1
    assert not _alive(orphan), "the orphan runs on after the lock was lost"
    assert not _alive(child), "the shell's child runs on after the lock was lost"


@pytest.mark.etcd
def test_the_lock_is_held_until_what_the_command_started_has_exited(coord_cli: Coord) -> None:
    """A command that leaves work running in the background: that work is still under
    the lock, which is released only once it has exited too."""
    log, go = coord_cli.cwd / "log", coord_cli.cwd / "go"
    background = f"(while [ ! -e {go} ]; do sleep 0.02; done; echo background >> {log}) &"
    first = coord_cli.start("lock", "job", "--", "sh", "-c", f"{background} echo main >> {log}")
    wait_until(lambda: log.exists() and log.read_text() == "main\n", "the command to exit")
    second = coord_cli.start("lock", "job", "--", "sh", "-c", f"echo second >> {log}")
    wait_until(lambda: len(coord_cli.entries("job")) == 2, "the second to queue")
    assert first.poll() is None, "released while its background work ran"
    go.touch()
    assert first.wait(timeout=10) == 0
    assert second.wait(timeout=10) == 0
    assert log.read_text().splitlines() == ["main", "background", "second"]


def _drop_the_holders_key(url: str, name: str) -> None:
    """Delete the holder's key of the mutex *name*, as another client (an operator)."""

    async def drop() -> None:
        async with coord.connect(url) as client:
            (entry,) = await client.mutex(name).waiters()
            await drop_key(client, entry.key)

    anyio.run(drop, backend="asyncio")


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_verbose_logs_sessions_then_acquires(coord_cli: Coord) -> None:
    quiet = coord_cli.run("lock", "job", "--", "true")
    assert (quiet.returncode, quiet.stderr) == (0, "")
    info = coord_cli.run("-v", "lock", "job", "--", "true")
    assert info.returncode == 0
    assert "session 0x" in info.stderr
    assert "opened" in info.stderr
    assert "acquired" not in info.stderr
    debug = coord_cli.run("-vv", "lock", "job", "--", "true")
    assert "mutex 'job' acquired (fence" in debug.stderr, debug.stderr
    assert "mutex 'job' released (fence" in debug.stderr


@pytest.mark.etcd
def test_interrupt_is_forwarded_then_a_deaf_command_is_killed(coord_cli: Coord) -> None:
    pid_file = coord_cli.cwd / "pid"
    script = f"trap '' INT TERM; echo $$ > {pid_file}; while :; do sleep 0.05; done"
    holder = coord_cli.start("lock", "--grace", "0.5", "job", "--", "sh", "-c", script)
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), "the command")
    started = time.monotonic()
    holder.send_signal(signal.SIGINT)  # Ctrl-C
    assert holder.wait(timeout=10) == 128 + signal.SIGINT
    assert time.monotonic() - started >= 0.5, "killed before the grace period"
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
    assert coord_cli.entries("job") == [], "the lock was not released"


@pytest.mark.etcd
def test_command_not_found(coord_cli: Coord) -> None:
    done = coord_cli.run("lock", "job", "--", "./no-such-command")
    assert done.returncode == 127
    assert done.stderr.startswith("coord: cannot run './no-such-command'")


@pytest.mark.zookeeper
def test_lock_and_status_on_zookeeper(zookeeper_url: str, tmp_path: Path) -> None:
    cli = Coord(zookeeper_url, tmp_path)
    ran = tmp_path / "ran"
    try:
        holder = cli.start("lock", "a/b/job", "--", "sh", "-c", f"touch {ran}; exec sleep 30")
        wait_until(ran.exists, "the command to start")
        (entry,) = cli.entries("a/b/job")
        assert entry["identity"] == {"host": HOST, "pid": holder.pid}
        assert [o["name"] for o in cli.status("a")] == ["a/b/job"]
        assert cli.run("lock", "--try", "a/b/job", "--", "true").returncode == 1
        holder.send_signal(signal.SIGTERM)
        assert holder.wait(timeout=10) == 128 + signal.SIGTERM
        assert cli.status() == []
    finally:
        cli.close()
