"""The shell walkthroughs of the README ("Command line") and of docs/index.md, run as
copied: ``coord dev`` in one terminal, the ``export`` lines it printed in the others,
then the commands of each terminal, in the order the block gives them.

(The ```console blocks, which show output, are tests/cli/test_docs_output.py's.)
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .test_dev import Dev, _need_servers, _start_dev, _stop

ROOT = Path(__file__).parent.parent.parent
_STORES = {"etcd://": "etcd", "zk://": "zookeeper"}
_SH = re.compile(r"^```sh\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)

pytestmark = [
    pytest.mark.etcd,
    pytest.mark.zookeeper,
    pytest.mark.timeout(90),
]


def _walkthrough(page: str) -> list[str]:
    """The commands (comments dropped) of *page*'s sh block that starts ``coord dev``."""
    for match in _SH.finditer((ROOT / page).read_text()):
        lines = [line.partition("#")[0].strip() for line in match["body"].splitlines()]
        if lines and lines[0] == "coord dev":
            return [line for line in lines if line]
    raise AssertionError(f"{page} has no sh block that starts with coord dev")


def _exports(commands: list[str], dev: Dev) -> dict[str, str]:
    """The block's ``export`` lines, as copied: each names what ``coord dev`` printed for
    its variable (plus, maybe, a namespace). Where this machine's standard port was taken
    (coord dev said so), the printed address stands in for the copied one."""
    return {
        variable: _as_started(value, dev.exports[variable], dev)
        for variable, _, value in (
            c.removeprefix("export ").partition("=") for c in commands if c.startswith("export ")
        )
    }


def _as_started(copied: str, printed: str, dev: Dev) -> str:
    """*copied* (a URL from the docs), checked against *printed* (what coord dev said)."""
    if any("standard port" in note for note in dev.notes):
        return printed + copied.removeprefix(_host_part(copied))
    assert _host_part(copied) == printed, (copied, printed)
    return copied


def _scheme(url: str) -> str:
    return url.partition("://")[0] + "://"


def _host_part(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.partition('/')[0]}"


def _coord(command: str) -> list[str]:
    argv = shlex.split(command)
    assert argv[0] == "coord", command
    return [sys.executable, "-m", "coord.cli", *argv[1:]]


def test_the_readme_walkthrough_runs_as_copied(tmp_path: Path) -> None:
    """``coord lock demo -- sleep 10``, then ``coord lock demo -- echo "my turn"`` (which
    waits), then ``coord status`` (the holder, then the waiter); the waiter runs once the
    holder is done."""
    _need_servers()
    commands = _walkthrough("README.md")
    dev = _start_dev("--no-kafka")
    started: list[subprocess.Popen[str]] = []
    try:
        env = {**os.environ, **_exports(commands, dev)}
        env.pop("COLUMNS", None)
        holder, waiter, status = (c for c in commands[1:] if not c.startswith("export "))
        started.append(_popen(holder, env, tmp_path))
        _until_status_shows(["holds"], env, tmp_path)
        started.append(_popen(waiter, env, tmp_path))
        # The README's status command as copied, until it shows both (one more call after
        # that could come after the holder's 10 s on a loaded machine).
        shown = _until_status_shows(["holds", "waits"], env, tmp_path, status)
        assert shown.startswith("mutex demo"), shown
        first, second = (p.communicate(timeout=30) for p in started)
        assert [p.returncode for p in started] == [0, 0], (first, second)
        assert second[0] == "my turn\n"
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
        _stop(dev)


def test_the_guides_exports_reach_the_stores_coord_dev_started(tmp_path: Path) -> None:
    """docs/index.md: ``coord dev``, then ``export COORD_URL=...`` with a namespace of
    one's own, for etcd and for ZooKeeper; a lock on each URL is taken in that store."""
    _need_servers()
    commands = _walkthrough("docs/index.md")
    dev = _start_dev("--no-kafka")
    try:
        for command in (c for c in commands if c.startswith("export ")):
            copied = command.partition("=")[2]
            url = _as_started(copied, dev.servers[_STORES[_scheme(copied)]], dev)
            env = {**os.environ, "COORD_URL": url}
            said = subprocess.run(
                _coord("coord lock demo -- echo locked"),
                env=env,
                capture_output=True,
                text=True,
                timeout=20,
            )
            assert (said.returncode, said.stdout) == (0, "locked\n"), (url, said.stderr)
    finally:
        _stop(dev)


def _popen(command: str, env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        _coord(command), env=env, cwd=cwd, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip


def _until_status_shows(
    kinds: list[str], env: dict[str, str], cwd: Path, command: str = "coord status"
) -> str:
    """*command* (``coord status``) until it lists exactly these entries (holds, waits) in
    order, exiting 0."""
    deadline = time.monotonic() + 20
    while True:
        said = subprocess.run(
            _coord(command), env=env, cwd=cwd, capture_output=True, text=True, timeout=20
        )
        if (
            said.returncode == 0
            and re.findall(r"^\s+(holds|waits)\b", said.stdout, re.MULTILINE) == kinds
        ):
            return said.stdout
        assert time.monotonic() < deadline, (kinds, said.stdout, said.stderr)
        time.sleep(0.2)
