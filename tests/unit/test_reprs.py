"""Every public object has an informative repr: what it is, its name, its state, and
never a secret (a URL's password is masked)."""

from __future__ import annotations

import inspect
import re

import anyio
import pytest

import coord
from coord.backends.memory import MemoryBackend, MemoryStore
from coord.testing import wait_for_waiters

pytestmark = pytest.mark.anyio


def _informative(obj: object, *expected: str) -> str:
    text = repr(obj)
    assert not re.search(r" object at 0x[0-9a-f]+", text), text
    for part in expected:
        assert part in text, (part, text)
    return text


async def test_every_public_class_has_an_informative_repr() -> None:
    seen: dict[type, str] = {}

    def check(obj: object, *expected: str) -> None:
        seen[type(obj)] = _informative(obj, *expected)

    store = MemoryStore()
    client = coord.Client(MemoryBackend(store), identity="repr-test")
    check(client, "<coord.Client memory://", "not open")
    async with client, coord.Client(MemoryBackend(store)) as other:
        session = client.session
        check(client, f"session={session.id:#x}", "open")
        check(session, f"lease={session.id:#x}", "live")
        check(client.backend, "<coord.MemoryBackend memory://")

        mutex = client.mutex("orders/42", reentrant=True)
        check(mutex, "'orders/42'", "reentrant", "locked=False")
        async with anyio.create_task_group() as tg:
            async with mutex as hold:
                check(hold, "<coord.Hold 'orders/42'", f"fence={hold.fence}", "held")
                check(mutex, "locked=True")
                check(mutex.statistics(), "MutexStatistics(", "'orders/42'")
                tg.start_soon(_acquire, other.mutex("orders/42"))
                await wait_for_waiters(client, "orders/42", 2)
                (holder, waiter) = await mutex.waiters()
                check(holder, "Waiter(", "holding=True", "repr-test")
                assert "holding=False" in repr(waiter)
        check(hold, "released")

        semaphore = client.semaphore("gpu", 4)
        check(semaphore, "<coord.Semaphore 'gpu' limit=4")
        rw = client.rwlock("config")
        check(rw, "<coord.RWLock 'config'>")
        seen[coord.RWLockSide] = _informative(rw.read, "'config'", "read lock")
        _informative(rw.write, "'config'", "write lock")

        election = client.election("workers")
        check(election, "<coord.Election 'workers'>")
        campaign = election.campaign(b"node-1")
        check(campaign, "'workers'", "node-1")
        async with campaign as term:
            check(term, "<coord.Term 'workers'", f"fence={term.fence}", "leading")
            leader = await election.leader()
            check(leader, "Leader(", "node-1")

        group = client.group("pool")
        check(group, "<coord.Group 'pool'>")
        joining = group.join(b"node-1")
        check(joining, "<coord.Joining 'pool'", "node-1")
        async with joining as membership:
            check(membership, "<coord.Membership 'pool'", f"fence={membership.fence}", "member")
            (member,) = await group.members()
            check(member, "Member(", "node-1", "repr-test")
        check(membership, "left")

        partitioner = client.partitioner("shares", partitions=2)
        check(partitioner, "<coord.Partitioner 'shares'", "partitions=2")
        owning = partitioner.join()
        check(owning, "<coord.Owning 'shares'")
        async with owning as owner:
            with anyio.fail_after(5):
                async for assignment in owner.assignments():
                    if assignment.owned == {0, 1}:
                        break
            check(owner, "<coord.Owner 'shares'", "owned=[0, 1]")
            check(owner.statistics(), "OwnerStatistics(", "owned=2", "taken=2")
            check(assignment, "Assignment(", "owned=")
            async with owner.partition(1) as part:
                check(part, "<coord.PartitionHold 'shares/_partitions/1'", "owned")

        queue = client.queue("emails")
        check(queue, "<coord.Queue 'emails'")
        ref = await queue.put(b"hi", key="customer-7")
        check(ref, "JobRef(", "customer-7")
        claiming = queue.claim()
        async with claiming as job:
            check(job, "<coord.Job", "key='customer-7'", f"fence={job.fence}")
            check(claiming, "'emails'", "<coord.Job")
        stats = await queue.stats()
        check(stats, "QueueStats(")
        check(coord.KeyStats(1, 0, 0), "KeyStats(")
        check(coord.DeadLetter("id", None, b"x", 5, "boom", 1), "DeadLetter(")
        check(coord.NewJob(b"x", key="customer-7"), "NewJob(", "customer-7")
        check(coord.RunStats(3, 1, 0, 0, 0.5), "RunStats(", "acked=3")

        statistics = client.statistics()
        check(statistics, "ClientStatistics(", "acquires=", "<coord.Histogram count=")
        check(statistics.wait_time, "count=", "mean=")
    check(client, "closed")
    check(session, "lost")

    classes = {
        obj
        for name in coord.__all__
        if inspect.isclass(obj := getattr(coord, name)) and not issubclass(obj, BaseException)
    }
    missing = {c.__name__ for c in classes} - {t.__name__ for t in seen}
    assert not missing, f"no repr checked for {sorted(missing)}"


async def _acquire(mutex: coord.Mutex) -> None:
    async with mutex:
        pass


def test_backend_urls_mask_passwords() -> None:
    etcd = coord.connect("etcd://alice:s3cret@10.0.0.1:2379,[::1]:2380/app").backend
    assert etcd.url == "etcd://alice:***@10.0.0.1:2379,[::1]:2380/app"
    zk = coord.connect("zk://bob:hunter2@zk1:2181/chroot").backend
    assert zk.url == "zk://bob:***@zk1:2181/chroot"
    text = repr(coord.connect("etcd://alice:s3cret@10.0.0.1"))
    assert text == "<coord.Client etcd://alice:***@10.0.0.1:2379 not open>"
    assert "s3cret" not in text
