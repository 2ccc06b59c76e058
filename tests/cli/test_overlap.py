"""``coord lock`` and ``coord elect`` stopped by a signal release only after CMD and all
its children have exited: the next command of the same name never overlaps it.

SIGINT or SIGTERM cancels coord's work; CMD gets the signal and may take its time to
exit (or ignore it until ``--grace`` ends with SIGKILL). All that while CMD still works
under the lock, so coord's session must live on until CMD is gone (the session's tasks
do not belong to the cancelled work).
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import pytest

from ._support import Coord, wait_until

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

STORES = [
    pytest.param("etcd", marks=pytest.mark.etcd),
    pytest.param("zookeeper", marks=pytest.mark.zookeeper),
]


def _first(log: Path, pid: Path, *, deaf: bool) -> str:
    """CMD of the first: it logs its start, then either takes 3 s to exit on SIGTERM
    (logging when it ends) or ignores SIGTERM."""
    on_term = "''" if deaf else f"'echo term >> {log}; sleep 3; echo exit >> {log}; exit 0'"
    return (
        f"trap {on_term} TERM; echo $$ > {pid}; echo start >> {log}; while :; do sleep 0.05; done"
    )


def _second(log: Path, pid: Path) -> str:
    """CMD of the second: it logs whether the first's CMD still runs."""
    overlap = f'if kill -0 "$(cat {pid})" 2>/dev/null; then echo OVERLAP >> {log}; fi'
    return f"{overlap}; echo second >> {log}"


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("verb", ["lock", "elect"])
@pytest.mark.parametrize("deaf", [False, True], ids=["slow-exit", "deaf"])
def test_the_next_command_starts_only_after_the_first_has_exited(
    store: str, verb: str, deaf: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    cli = Coord(str(request.getfixturevalue(f"{store}_url")), tmp_path)
    log, pid = tmp_path / "log", tmp_path / "pid"
    try:
        grace = "2" if deaf else "10"  # the slow one exits in 3 s, within its grace
        first = cli.start(
            verb, "--grace", grace, "job", "--", "sh", "-c", _first(log, pid, deaf=deaf)
        )
        wait_until(lambda: log.exists() and pid.exists() and pid.read_text().strip(), "CMD")
        second = cli.start(verb, "job", "--", "sh", "-c", _second(log, pid))
        wait_until(lambda: len(cli.entries("job")) == 2, "the second to queue")
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=20) == 128 + signal.SIGTERM
        assert second.wait(timeout=20) == 0, second.communicate()[1]
        expected = ["start", "second"] if deaf else ["start", "term", "exit", "second"]
        assert log.read_text().splitlines() == expected
    finally:
        cli.close()
