"""Exit statuses and one-line errors; the spinner on a terminal, and only there."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

import coord
from coord.testing import free_port

from ._support import Coord, wait_until

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture
def offline(tmp_path: Path) -> Coord:
    """The command with no store configured at all."""
    cli = Coord("", tmp_path)
    cli.env.pop("COORD_URL", None)
    return cli


#: A well-formed URL (usage errors are found before anything connects).
_NOWHERE = "etcd://127.0.0.1:1"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["lock", "job", "--", "true"], "no store given: pass --url or set COORD_URL"),
        (["status", "--url", "redis://x"], "unknown URL scheme 'redis'"),
        (["lock", "--url", _NOWHERE, "a//b", "--", "true"], "has an empty segment"),
        # A recipe's own names cannot be spelled: a lock there would stall a queue's
        # claimers or show as one of its jobs.
        (["lock", "--url", _NOWHERE, "emails/_turn", "--", "true"], "segment '_turn' must"),
        (["lock", "--url", _NOWHERE, "emails/_jobs", "--", "true"], "are the recipes' own"),
        (["elect", "--url", _NOWHERE, "p/_assignment", "--", "true"], "'_assignment' must"),
        (["queue", "put", "--url", _NOWHERE, "emails/_claims", "x"], "'_claims' must"),
        (["lock", "--url", _NOWHERE, "job"], "Missing argument '-- CMD [ARGS]...'"),
        (["lock", "--url", _NOWHERE, "--grace", "-1", "job", "--", "true"], "--grace"),
        (["lock", "--url", _NOWHERE, "demo", "ls", "-l"], "put -- before it: coord lock NAME"),
        (["elect", "--url", _NOWHERE, "demo", "ls", "-l"], "put -- before it: coord elect"),
        (["lock", "--url", _NOWHERE, "--", "sleep", "1"], "NAME is missing: it goes before --"),
        (["elect", "--url", _NOWHERE, "--", "sleep", "1"], "NAME is missing"),
        (["lock", "--url", _NOWHERE, "--", "sleep"], "NAME is missing"),
        (["queue", "work", "--url", _NOWHERE, "q"], "Missing argument '-- CMD [ARGS]...'"),
        (["queue", "work", "--url", _NOWHERE, "--", "sleep", "1"], "NAME is missing"),
        (["queue", "work", "--url", _NOWHERE, "q", "ls", "-l"], "coord queue work NAME --"),
        (["queue", "work", "--url", _NOWHERE, "--concurrency", "0", "q", "--", "true"], "0 is not"),
        (["queue", "work", "--url", _NOWHERE, "--grace", "-1", "q", "--", "true"], "--grace"),
        (["frobnicate"], "No such command 'frobnicate'"),
    ],
)
def test_usage_errors_exit_2(offline: Coord, args: list[str], message: str) -> None:
    done = offline.run(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(
    "command",
    [
        ["lock", "job", "--", "touch", "ran"],
        ["elect", "job", "--", "touch", "ran"],
        ["status"],
        ["leader", "job"],
        ["queue", "put", "jobs", "x"],
    ],
)
def test_memory_store_is_refused_in_one_line(offline: Coord, command: list[str]) -> None:
    offline.env["COORD_URL"] = "memory://"
    done = offline.run(*command)
    assert done.returncode == 2
    assert done.stderr.startswith("coord: memory:// ")
    assert "nothing is shared between processes" in done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert done.stdout == ""
    assert not (offline.cwd / "ran").exists()


def test_unreachable_store_is_one_line_and_exit_1(offline: Coord) -> None:
    done = offline.run("status", "--url", f"etcd://127.0.0.1:{free_port()}")
    assert done.returncode == 1
    assert done.stderr.startswith("coord: the store cannot be reached: ")
    assert len(done.stderr.splitlines()) == 1


def test_version_and_help(offline: Coord) -> None:
    assert offline.run("--version").stdout == f"coord, version {coord.__version__}\n"
    for command in ("lock", "elect", "leader", "status", "dev", "queue", "queue put", "queue work"):
        done = offline.run(*command.split(), "--help")
        assert done.returncode == 0
        assert done.stdout.startswith(f"Usage: coord {command} ")


@pytest.mark.etcd
def test_spinner_says_what_it_waits_for_on_a_terminal_only(coord_cli: Coord) -> None:
    ran = coord_cli.cwd / "ran"
    script = f"touch {ran}; while :; do sleep 0.05; done"
    holder = coord_cli.start("lock", "--identity", "busy", "job", "--", "sh", "-c", script)
    wait_until(ran.exists, "the holder")

    piped = coord_cli.start("lock", "job", "--", "true")
    controller, terminal = pty.openpty()
    env = {**coord_cli.env, "TERM": "xterm", "COLUMNS": "120"}
    on_tty = coord_cli.start("lock", "job", "--", "true", stderr=terminal, env=env)
    os.close(terminal)
    wait_until(lambda: len(coord_cli.entries("job")) == 3, "both to queue")
    shown = b""
    expected = f"waiting for lock job (held by pid {holder.pid}".encode()
    while expected not in shown:
        ready, _, _ = select.select([controller], [], [], 10)
        assert ready, f"no spinner on the terminal: {shown!r}"
        shown += os.read(controller, 4096)

    holder.send_signal(signal.SIGTERM)
    assert piped.wait(timeout=10) == 0
    while on_tty.poll() is None:  # keep reading: a full terminal would block the spinner
        if select.select([controller], [], [], 0.1)[0]:
            try:
                os.read(controller, 4096)
            except OSError:  # EIO: the terminal's last user closed it
                break
    assert on_tty.wait(timeout=10) == 0
    os.close(controller)
    assert piped.communicate()[1] == "", "the spinner showed on a pipe"


def test_import_coord_does_not_import_the_cli_libraries() -> None:
    code = "import sys, coord; print(sorted(m for m in ('click', 'rich') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "[]\n"


def test_status_help_points_at_the_json_schema_where_it_is(offline: Coord) -> None:
    text = offline.run("status", "--help").stdout
    description, _, options = text.partition("\nOptions:\n")
    assert '{"version": 2, "prefix": PREFIX, "objects": [...]}' in description
    assert "JSON for scripts (the schema is above)." in options
