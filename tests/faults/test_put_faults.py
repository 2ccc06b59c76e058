"""Cancelled puts through a slow connection, repeated from elsewhere (issue 36, item 1):
real processes, a real server, and a TcpProxy that delays every reply 0.3 s.

A producer process puts each id with a ``job_id`` through the proxy and cancels the put
0.1 s after its transaction was sent (``anyio.fail_after``, or ``asyncio.timeout``),
before the reply comes. 50 ms later the same id is put again — by this test's client
(another process, straight to the server), or by the producer itself through a second
``client.queue()`` object — and that put returns the job. When the delayed reply comes,
the cancelled put's withdrawal must be refused: the job that the repeat said was queued
stays queued (it used to be deleted: the job was lost). An id that nobody repeats is
withdrawn, as a cancelled put's job is.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

import coord
from coord._jobs.records import decode
from coord.testing import EtcdServer, TcpProxy, ZooKeeperServer
from coord.testing.pytest_plugin import fresh_namespace

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_put_worker.py")
NAME = "putfaults"
REPEATED = ["r0", "r1", "r2"]
KINDS = [
    pytest.param("etcd", marks=pytest.mark.etcd),
    pytest.param("zookeeper", marks=pytest.mark.zookeeper),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=KINDS)
def server(request: pytest.FixtureRequest) -> EtcdServer | ZooKeeperServer:
    fixture = "etcd_server" if request.param == "etcd" else "zookeeper_server"
    return request.getfixturevalue(fixture)  # type: ignore[no-any-return]


@pytest.fixture
def proxy(server: EtcdServer | ZooKeeperServer) -> Iterator[TcpProxy]:
    port = server.client_port if isinstance(server, EtcdServer) else server.port
    with TcpProxy(port) as proxy:
        yield proxy


async def _queued(client: coord.Client) -> list[str]:
    listing = await client.backend.entries(f"{NAME}/_jobs/")
    return sorted(decode(entry)[0].id for entry in listing.entries)


@pytest.mark.parametrize("cancel", ["anyio", "native"])
@pytest.mark.parametrize("repeater", ["another client", "same client"])
async def test_a_repeat_keeps_the_job_of_a_put_cancelled_in_flight(
    server: EtcdServer | ZooKeeperServer, proxy: TcpProxy, cancel: str, repeater: str
) -> None:
    namespace = fresh_namespace()
    scheme = "etcd" if isinstance(server, EtcdServer) else "zk"
    ids = ["r0", "w0", "r1", "r2"]
    command = [
        sys.executable,
        str(WORKER),
        f"--url={scheme}://{proxy.endpoint}/{namespace}",
        f"--ids={','.join(ids)}",
        f"--cancel={cancel}",
        f"--repeat={','.join(REPEATED) if repeater == 'same client' else ''}",
    ]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    async with coord.connect(f"{server.url}/{namespace}") as client:
        queue = client.queue(NAME)
        # The queue's nodes exist before the producer's first put (on ZooKeeper, a
        # create that first makes them would still be under way when the repeat reads:
        # that is two puts at the same moment, not this scenario).
        await queue.put(b"x", job_id="warm")
        proxy.delay(0.3)
        producer = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, env=env
        )
        assert producer.stdout is not None
        lines: list[str] = []
        try:
            with anyio.fail_after(40):
                while not lines or lines[-1] != "DONE":
                    line = (await producer.stdout.readline()).decode().strip()
                    assert line, f"the producer ended early: {lines}"
                    lines.append(line)
                    kind, _, job_id = line.partition(" ")
                    if kind == "CANCELLED" and job_id in REPEATED and repeater == "another client":
                        await anyio.sleep(0.05)
                        assert (await queue.put(b"x", job_id=job_id)).id == job_id
            assert [f"CANCELLED {i}" for i in ids] == [x for x in lines if x.startswith("C")]
            # Every withdrawal has ended (the producer waited for each cancelled put's to
            # run to its end): the repeated jobs stay, the job of the put nobody repeated
            # was withdrawn.
            assert f"WITHDRAWN {len(ids)}" in lines, lines
            assert await _queued(client) == [*REPEATED, "warm"], lines
        finally:
            if producer.returncode is None:
                producer.kill()
            await producer.wait()
