"""Slow replies: a client whose sessions are lost and replaced while it works is never
told its client is closed.

A worker process (``_slow_worker.py``) reaches the store through a :class:`TcpProxy`
that, in turns, delays every reply by 0.9 s for longer than the TTL of 2 s: keepalives
are answered late, the lease's local deadline passes, and the client's keeper closes the
session and opens the next one while answers for the old session are still on their
way; then replies come on time again for a while. For several seconds it loops on a
mutex (three tasks), or runs ``Group.run`` / ``Partitioner.run`` (three members each,
which join again until cancelled). What must hold, on etcd and ZooKeeper:

* no call raises ``ClosedError`` (nor anything else but ``LockLost`` for a holder): a
  lost session means waiting on the next one, never "the client is closed";
* ``run`` does not end: the process runs to its end and exits 0;
* the work goes on (acquisitions, memberships, owned partitions) across new sessions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from coord.testing import EtcdServer, TcpProxy, ZooKeeperServer
from coord.testing.pytest_plugin import fresh_namespace

if TYPE_CHECKING:
    from collections.abc import Iterator
    from subprocess import CompletedProcess

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(60)]

WORKER = Path(__file__).with_name("_slow_worker.py")
ROOT = Path(__file__).resolve().parents[2]
TTL = 2.0
DELAY = 0.9  # each reply: past a third of the TTL (the keepalive's period)
# The proxy alternates: replies on time for FAST seconds (the client opens its session,
# and work gets done), then delayed for SLOW seconds (longer than the TTL: the session
# is lost, and answers for it are still on their way when its keeper has closed it).
FAST, SLOW = 1.5, 2.5
SECONDS = 9.0  # the worker's run, after its client is open: two slow spells or three


@pytest.fixture
def proxy(server: EtcdServer | ZooKeeperServer) -> Iterator[TcpProxy]:
    port = server.client_port if isinstance(server, EtcdServer) else server.port
    with TcpProxy(port) as proxy:
        yield proxy


@pytest.fixture(params=["mutex", "group", "partitioner"])
def recipe(request: pytest.FixtureRequest) -> str:
    """(A fixture, not a parametrize mark: so the store comes last in the test's id, which
    is how ``tests/conftest.py`` groups the fault suite per store.)"""
    return str(request.param)


async def test_lost_sessions_under_slow_replies_never_raise_closed_error(
    recipe: str, proxy: TcpProxy, kind: str
) -> None:
    scheme = "etcd" if kind == "etcd" else "zk"
    url = f"{scheme}://{proxy.endpoint}/{fresh_namespace()}"
    command = [
        sys.executable,
        str(WORKER),
        f"--url={url}",
        f"--recipe={recipe}",
        f"--seconds={SECONDS}",
        f"--ttl={TTL}",
    ]
    env = {"PYTHONPATH": str(ROOT)}
    finished: list[CompletedProcess[bytes]] = []

    async def run() -> None:
        finished.append(await anyio.run_process(command, check=False, env=env))
        tg.cancel_scope.cancel()

    with anyio.fail_after(45):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            while True:  # until the worker exits
                await anyio.sleep(FAST)
                proxy.delay(DELAY)
                await anyio.sleep(SLOW)
                proxy.delay(0)
    done = finished[0]
    out = done.stdout.decode()
    report = f"exit {done.returncode}\n{out[-3000:]}\n{done.stderr.decode()[-3000:]}"
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    errors = [line for line in lines if "error" in line]
    assert not errors, report
    assert done.returncode == 0, report
    assert {"done": True} in lines, report
    assert any("ok" in line for line in lines), report
    sessions = next(line["sessions"] for line in lines if "sessions" in line)
    assert sessions > 1, f"no session was lost: the scenario did not happen\n{report}"
