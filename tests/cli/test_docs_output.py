"""The CLI output shown in docs/cli.md and in the README's "Command line" section is what
the commands print, so that the text cannot drift from the code.

A ```console block is a run of ``$ command`` lines, each followed by the output shown
for it. Each block is run in a namespace of its own on the test session's etcd, in
order: a command shown with output is run (after the setup that :data:`SETUPS` gives it,
such as a holder in the background) and what it prints, stdout then stderr, must be the
text shown, once the parts that change from run to run are normalised on both sides
(:func:`normalise`: pids, fences, ages, job ids, ports, data directories, host names). A
command shown without output is the reader's to run (a long-lived one): not run here.
``127.0.0.1:2379`` in a command stands for the test session's etcd.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

import coord

from ._support import Coord, wait_until

if TYPE_CHECKING:
    from collections.abc import Callable

    from coord.testing import EtcdServer

ROOT = Path(__file__).parent.parent.parent


@dataclass(frozen=True)
class Shown:
    """A command shown in the docs, and the output shown for it ("" for none)."""

    command: str
    output: str


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    shown: tuple[Shown, ...]

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


_CONSOLE = re.compile(r"^```console\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)


def _blocks(page: str, text: str, offset: int = 0) -> list[Block]:
    found = []
    for match in _CONSOLE.finditer(text):
        shown: list[Shown] = []
        command: str | None = None
        output: list[str] = []
        for line in [*match["body"].splitlines(), "$ "]:
            if line.startswith("$ "):
                if command is not None:
                    shown.append(Shown(command, "\n".join(output)))
                command, output = line[2:].split("  #")[0].strip(), []
            else:
                output.append(line)
        line_number = offset + text.count("\n", 0, match.start()) + 1
        found.append(Block(page, line_number, tuple(shown)))
    return found


def blocks() -> list[Block]:
    """The console blocks of docs/cli.md and of the README's "Command line" section."""
    found = _blocks("docs/cli.md", (ROOT / "docs" / "cli.md").read_text())
    readme = (ROOT / "README.md").read_text()
    start = readme.index("\n## Command line\n")
    end = readme.index("\n## ", start + 1)
    found += _blocks("README.md", readme[start:end], readme.count("\n", 0, start))
    return [b for b in found if any(s.output for s in b.shown)]


BLOCKS = blocks()


def normalise(text: str) -> str:
    """*text* with what changes from run to run (or machine to machine) replaced."""
    for pattern, replacement in _VOLATILE:
        text = re.sub(pattern, replacement, text)
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


_VOLATILE = [
    (r"pid \d+ on \S+", "pid N on HOST"),
    (r"fence \d+", "fence N"),
    (r"registered [\dhms.]+ ago", "registered T ago"),
    (r"\b[0-9a-f]{32}\b", "JOB_ID"),
    (r"127\.0\.0\.1:\d+", "127.0.0.1:PORT"),
    (r"\(data: [^)]*\)", "(data: DIR)"),
    (r"until \d\d:\d\d:\d\d", "until HH:MM:SS"),
]


# -- setups: what must exist before a command, for it to print what the docs show ------


def _holder(cli: Coord, *args: str) -> None:
    """Start a ``coord lock demo`` (given *args*), which holds or waits."""
    before = len(cli.entries("demo"))
    cli.start("lock", *args, "demo", "--", "sleep", "600")
    wait_until(lambda: len(cli.entries("demo")) > before, "the lock to be held or waited for")


def _holder_and_waiter(cli: Coord) -> None:
    _holder(cli)
    _holder(cli)


def _leader(cli: Coord) -> None:
    cli.start("elect", "--value", "laptop", "scheduler", "--", "sleep", "600")
    wait_until(lambda: cli.run("leader", "scheduler").returncode == 0, "a leader")


def _everything(cli: Coord) -> None:
    _holder(cli, "--identity", "backup")
    _holder(cli)  # waits
    _leader(cli)
    assert cli.run("queue", "put", "emails", "x").returncode == 0


def _parked_and_dead(cli: Coord) -> None:
    """A parked job of key customer-7 and a dead letter, in queue invoices."""

    async def fail_two() -> None:
        async with coord.connect(cli.url) as client:
            await client.queue("invoices").put(b"invoice 7", key="customer-7")
            await client.queue("invoices").put(b"invoice 8")
            for on_exhausted in ("park", "dead_letter"):
                queue = client.queue("invoices", max_attempts=1, on_exhausted=on_exhausted)
                with pytest.raises(RuntimeError):
                    async with queue.claim():
                        raise RuntimeError("the PDF service said no")

    anyio.run(fail_two, backend="asyncio")


#: What each command needs first, by page and command (none if not listed).
SETUPS: dict[tuple[str, str], Callable[[Coord], None]] = {
    ("docs/cli.md", "coord lock --try demo -- ./nightly-report"): lambda cli: _holder(
        cli, "--identity", "backup"
    ),
    ("docs/cli.md", "coord leader scheduler"): _leader,
    ("docs/cli.md", "coord status"): _everything,
    ("docs/cli.md", "coord queue ls invoices"): _parked_and_dead,
    ("README.md", "coord status"): _holder_and_waiter,
}


def _argv(command: str, etcd: EtcdServer) -> list[str]:
    argv = shlex.split(command.replace("127.0.0.1:2379", etcd.endpoint))
    assert argv[0] == "coord", command
    return argv[1:]


@pytest.mark.etcd
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.shown[0].command != "coord dev"], ids=lambda b: b.id
)
def test_shown_output_is_printed(block: Block, coord_cli: Coord, etcd_server: EtcdServer) -> None:
    for shown in block.shown:
        if not shown.output:
            continue  # the reader's to run
        setup = SETUPS.get((block.page, shown.command))
        if setup is not None:
            setup(coord_cli)
        done = coord_cli.run(*_argv(shown.command, etcd_server))
        assert normalise(done.stdout + done.stderr) == normalise(shown.output), shown.command


def test_every_page_shows_output() -> None:
    pages = {b.page for b in BLOCKS}
    assert pages == {"docs/cli.md", "README.md"}
    commands = {(b.page, s.command) for b in BLOCKS for s in b.shown if s.output}
    assert set(SETUPS) <= commands, "a setup for a command the docs no longer show"


@pytest.mark.etcd
@pytest.mark.zookeeper
@pytest.mark.kafka
@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.shown[0].command == "coord dev"], ids=lambda b: b.id
)
def test_shown_dev_output_is_printed(block: Block) -> None:
    from .test_dev import _need_servers

    _need_servers(kafka=True)
    (shown,) = block.shown
    argv = [sys.executable, "-m", "coord.cli", "dev"]
    dev = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert dev.stdout is not None
        while not lines or not lines[-1].startswith("coord dev: ready"):
            line = dev.stdout.readline()
            assert line, f"coord dev ended: {lines}"
            if "standard port" not in line:  # taken on this machine: said, and not shown
                lines.append(line.rstrip("\n"))
    finally:
        dev.send_signal(signal.SIGTERM)
        dev.communicate(timeout=30)
    assert normalise("\n".join(lines)) == normalise(shown.output)


def test_normalise_keeps_what_does_not_change() -> None:
    shown = "holds   fence 262144  pid 4242 on laptop (backup)  (registered 4.7s ago)"
    printed = f"holds   fence 1  pid {os.getpid()} on vm (backup)  (registered 1m05s ago)"
    assert normalise(shown) == normalise(printed)
    assert normalise(shown) != normalise(printed.replace("holds", "waits"))
