"""``coord status``: every kind of lock, election and queue, as JSON and as text."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import anyio
import pytest

import coord
from coord.cli.status import RESCAN
from coord.testing import wait_for_waiters

pytestmark = pytest.mark.etcd


async def status(url: str, *args: str) -> str:
    argv = [sys.executable, "-m", "coord.cli", "status", "--url", url, *args]
    done = await anyio.run_process(argv, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


async def hold_until(event: anyio.Event, lock: coord.Mutex | coord.Semaphore) -> None:
    async with lock:
        await event.wait()


@pytest.mark.timeout(30)
async def test_status_shows_every_kind(etcd_url: str) -> None:
    me = {"host": os.uname().nodename, "pid": os.getpid(), "name": "tester"}
    async with (
        coord.connect(etcd_url, identity="tester") as client,
        anyio.create_task_group() as tg,
    ):
        done = anyio.Event()
        for _ in range(3):
            tg.start_soon(hold_until, done, client.semaphore("gpu", 2))
        await wait_for_waiters(client, "gpu", 3)
        queue = client.queue("emails")
        await queue.put(b"one", key="k")
        await queue.put(b"two")
        async with queue.claim() as job, client.election("pool").campaign(b"node-1"):
            text = await status(etcd_url)
            found = json.loads(await status(etcd_url, "--json"))
        done.set()

    assert found["version"] == 2
    assert found["prefix"] == ""
    emails, gpu, pool = found["objects"]  # sorted by name
    assert (gpu["name"], gpu["kind"], gpu["limit"]) == ("gpu", "semaphore", 2)
    assert [e["holding"] for e in gpu["entries"]] == [True, True, False]
    assert all(e["identity"] == me for e in gpu["entries"])
    fences = [e["fence"] for e in gpu["entries"]]
    assert fences == sorted(fences)
    assert (emails["kind"], emails["depth"], emails["in_flight"], emails["dead"]) == (
        "queue",
        2,
        1,
        0,
    )
    assert emails["claims"] == [{"job": job.id, "fence": job.fence, "identity": me}]
    assert (pool["kind"], pool["entries"][0]["value"]) == ("election", "node-1")
    assert "semaphore gpu (limit 2)" in text
    assert f"holds   fence {fences[0]}  pid {me['pid']} on {me['host']} (tester)" in text
    assert "queue emails: 2 jobs, 1 in flight, 0 parked, 0 dead, 0 idle clients" in text


async def test_status_of_a_prefix_and_a_read_write_lock(etcd_url: str) -> None:
    async with coord.connect(etcd_url) as client:
        rw = client.rwlock("cfg/main")
        async with rw.read, client.mutex("other"):
            found = json.loads(await status(etcd_url, "--json", "cfg"))
    (cfg,) = found["objects"]
    assert (cfg["name"], cfg["kind"]) == ("cfg/main", "rwlock")
    assert [(e["mode"], e["holding"]) for e in cfg["entries"]] == [("read", True)]
    assert await status(etcd_url, "nothing/here") == "nothing under nothing/here/\n"


async def test_watch_shows_each_change(etcd_url: str) -> None:
    argv = [sys.executable, "-m", "coord.cli", "status", "--watch", "--url", etcd_url]
    process = await anyio.open_process(argv, stderr=subprocess.DEVNULL)
    try:
        stdout = process.stdout
        assert stdout is not None
        output = b""

        async def read_until(end: bytes) -> None:
            nonlocal output
            with anyio.fail_after(10):
                async for chunk in stdout:
                    output += chunk
                    if output.endswith(end):
                        return

        await read_until(b"nothing in the store\n")
        async with coord.connect(etcd_url) as client:
            async with client.mutex("job"):
                while b"mutex job" not in output:
                    await read_until(b"\n")
            released = anyio.current_time()
        # Released: the empty state again, woken by the watch on "job", well before the
        # re-read of the names (every RESCAN seconds) could have noticed.
        while not output.endswith(b"nothing in the store\n"):
            await read_until(b"\n")
        assert anyio.current_time() - released < RESCAN / 2
    finally:
        process.terminate()
        await process.aclose()
    blocks = output.decode().split("--- ")[1:]
    assert "nothing in the store" in blocks[0]
    assert any("mutex job" in block for block in blocks)
    assert "nothing in the store" in blocks[-1]


@pytest.mark.timeout(30)
async def test_status_shows_groups_and_partitioners(etcd_url: str) -> None:
    me = {"host": os.uname().nodename, "pid": os.getpid(), "name": "tester"}
    async with coord.connect(etcd_url, identity="tester") as client:
        async with (
            client.group("pool").join(b"10.0.0.7"),
            client.partitioner("orders", partitions=3).join(b"w1") as owner,
        ):
            with anyio.fail_after(10):
                async for assignment in owner.assignments():
                    if len(assignment.owned) == 3:
                        break
            text = await status(etcd_url)
            found = json.loads(await status(etcd_url, "--json"))
    orders, pool = found["objects"]  # sorted by name; nothing of the partitioner's parts
    assert (pool["kind"], [e["value"] for e in pool["entries"]]) == ("group", ["10.0.0.7"])
    assert [e["holding"] for e in pool["entries"]] == [True]
    assert (orders["kind"], orders["partitions"]) == ("partitioner", 3)
    assert orders["generation"] == assignment.generation
    assert [(m["id"], m["value"], m["identity"]) for m in orders["members"]] == [
        (owner.id, "w1", me)
    ]
    assert orders["owners"] == [
        {"partition": p, "fence": assignment.fence(p), "identity": me} for p in range(3)
    ]
    assert "group pool" in text
    assert "  member  fence" in text
    assert "partitioner orders (3 partitions, 1 member, 3 owned partitions)" in text
    assert f"  owns 2     fence {assignment.fence(2)}  pid {me['pid']}" in text
