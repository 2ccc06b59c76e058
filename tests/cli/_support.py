"""Helpers of the CLI tests: run ``python -m coord.cli`` as a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

__all__ = ["Coord", "wait_until"]


class Coord:
    """Runs the ``coord`` command with ``COORD_URL`` set, in a scratch directory."""

    def __init__(self, url: str, cwd: Path) -> None:
        self.url = url
        self.cwd = cwd
        self.env = {**os.environ, "COORD_URL": url}
        self.env.pop("COLUMNS", None)
        self._started: list[subprocess.Popen[str]] = []

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "coord.cli", *args]

    def run(
        self, *args: str, timeout: float = 15, **options: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run to completion; stdout and stderr captured (so not a terminal)."""
        options.setdefault("env", self.env)
        return subprocess.run(
            self.argv(*args),
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            **options,
        )

    def start(self, *args: str, **options: Any) -> subprocess.Popen[str]:
        """Start in the background, stdout and stderr piped; killed at the test's end."""
        options.setdefault("env", self.env)
        options.setdefault("stdout", subprocess.PIPE)
        options.setdefault("stderr", subprocess.PIPE)
        process = subprocess.Popen(self.argv(*args), cwd=self.cwd, text=True, **options)
        self._started.append(process)
        return process

    def status(self, prefix: str = "", *, layout: str = "coord") -> list[dict[str, Any]]:
        done = self.run("status", "--layout", layout, "--json", prefix)
        assert done.returncode == 0, done.stderr
        objects: list[dict[str, Any]] = json.loads(done.stdout)["objects"]
        return objects

    def entries(self, name: str, *, layout: str = "coord") -> list[dict[str, Any]]:
        """The entries of lock *name* as ``coord status --json`` shows them (in *layout*:
        a peer layout's objects are all of its kind)."""
        objects = self.status(layout=layout)
        if layout != "coord":
            assert all(o["kind"] == layout for o in objects), objects
        found = [o for o in objects if o["name"] == name]
        return found[0]["entries"] if found else []

    def close(self) -> None:
        """Stop what was started: SIGTERM first, so that a ``coord lock`` stops its
        command too (a SIGKILL would leave it running, holding the pipes), then SIGKILL."""
        for process in self._started:
            if process.poll() is None:
                process.terminate()
        for process in self._started:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.communicate(timeout=5)  # a grandchild may hold the pipes


def wait_until(check: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    """Poll *check* (a file, a listing) until it is true: the processes under test
    report progress through files, so the tests never guess with sleeps."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
