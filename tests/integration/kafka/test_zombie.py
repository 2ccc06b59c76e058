"""A leader-dispatcher paused (SIGSTOP) mid-publish past its TTL resumes after a new
leader took over: every record it publishes late is dropped by coord.kafka.FenceFilter
(a broker without transactions), or never visible to read_committed consumers (a broker
with transactions: the new leader's producer fenced it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

import coord
import coord.kafka

from .test_brokers import make_topic, read

pytestmark = [pytest.mark.anyio, pytest.mark.kafka, pytest.mark.etcd, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).with_name("_dispatcher.py")
JOBS = 10


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(SCRIPT), *args], stdout=out, stderr=subprocess.STDOUT, env=env
        )


async def text(path: Path) -> str:
    file = anyio.Path(path)
    return await file.read_text() if await file.exists() else ""


async def until(what: str, log: Path, line: str, within: float, logs: list[Path]) -> None:
    """Until *line* appears in *log* (polled: a test watching other processes)."""
    with anyio.move_on_after(within):
        while line not in await text(log):  # noqa: ASYNC110
            await anyio.sleep(0.05)
        return
    tails = "\n".join([f"--- {p.name}\n{(await text(p))[-3000:]}" for p in logs])
    raise AssertionError(f"not within {within}s: {what}\n{tails}")


@pytest.fixture(params=[False, True], ids=["filter", "transactions"])
def transactions(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def broker(transactions: bool, request: pytest.FixtureRequest) -> Any:
    """Resolved before the event loop runs (starting a broker blocks)."""
    return request.getfixturevalue("kafka_txn_broker" if transactions else "kafka_broker")


async def test_paused_leader_publishes_late_and_is_fenced(
    etcd_url: str, broker: Any, tmp_path: Path, transactions: bool
) -> None:
    topic = await make_topic(broker.bootstrap, 1)
    async with coord.connect(etcd_url, ttl=2) as client:
        for n in range(JOBS):
            await client.queue("zombie").put(b"job-%d" % n, key="k")
    common = [etcd_url, broker.bootstrap, topic]
    flags = ["--transactions"] if transactions else []
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    first = await anyio.to_thread.run_sync(
        spawn, [*common, "first", *flags, "--stop-before", "job-4"], logs[0]
    )
    second: subprocess.Popen[bytes] | None = None
    try:
        # The first leads (the second is not started yet) and stops itself before job-4.
        await until("the leader stops itself", logs[0], "stopping", 20, logs)
        second = await anyio.to_thread.run_sync(spawn, [*common, "second", *flags], logs[1])
        # It takes over once the first's lease expires, and publishes everything.
        await until("the second leader sends job-9", logs[1], "sending job-9", 25, logs)
        await anyio.sleep(0.5)
        os.kill(first.pid, signal.SIGCONT)  # the zombie resumes and sends job-4, late
        await until("the zombie resumes", logs[0], "resumed", 10, logs)
        await anyio.sleep(2)  # time for its record to land (or its commit to fail)
    finally:
        for process in (first, second):
            if process is not None:
                os.kill(process.pid, signal.SIGCONT)
                process.terminate()
                await anyio.to_thread.run_sync(process.wait, 10)
    options = {"isolation_level": "read_committed"} if transactions else {}
    records = await read(broker.bootstrap, topic, JOBS + 1, **options)
    zombie_fence = int((await text(logs[0])).split("stopping before job-4 ")[1].split()[0])
    fences = [int(dict(r.headers)["coord-fence"]) for r in records]
    # The zombie's records that came after a record of a newer leader.
    late = [r for i, r in enumerate(records) if max(fences[: i + 1]) > fences[i] == zombie_fence]
    fence = coord.kafka.FenceFilter()
    accepted = [r.value for r in records if fence.accept(r)]
    assert accepted == [b"job-%d" % n for n in range(JOBS)], (accepted, fences)
    if transactions:
        assert late == [], "a fenced producer's record became visible"
    else:
        assert late, f"the zombie did not publish late (fences {fences}): the test proved nothing"
        dropped = [(d.record.value, d.reason) for d in fence.dropped]
        assert (b"job-4", "stale fence") in dropped
        assert all(d.fence == zombie_fence for d in fence.dropped if d.reason == "stale fence")
