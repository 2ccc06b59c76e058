"""client.statistics(): the counters and histograms after a scripted sequence, on the
memory store (asyncio and trio) and on etcd."""

from __future__ import annotations

import anyio
import pytest

import coord
from coord.testing import drop_key, wait_for_waiters

from .conftest import STORES


@pytest.fixture(params=[p for p in STORES if p.id in ("memory-asyncio", "memory-trio", "etcd")])
def store(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


@pytest.mark.real_clock
async def test_counters_and_histograms_after_a_scripted_sequence(
    clients: list[coord.Client],
) -> None:
    a, b = clients[:2]
    before = a.statistics()
    assert (before.acquires, before.waits, before.losses) == (0, 0, 0)
    assert before.wait_time.count == before.hold_time.count == 0
    assert before.sessions_opened == 1
    assert before.sessions_lost == 0

    # 1. a takes it at once; b waits behind a for a while.
    async with anyio.create_task_group() as tg:
        async with a.mutex("stats") as hold:
            tg.start_soon(_hold_briefly, b, "stats")
            await wait_for_waiters(a, "stats", 2)
            await anyio.sleep(0.3)
            assert not hold.lost

    # 2. refused (not counted), re-entered (counted once), a semaphore and a read lock.
    async with a.mutex("stats"):
        with pytest.raises(coord.LockedError):
            await b.mutex("stats").try_acquire()
    reentrant = a.mutex("again", reentrant=True)
    async with reentrant, reentrant:
        pass
    async with a.semaphore("sem", 2), a.rwlock("rw").read:
        pass

    # 3. a queue's own turns are not counted.
    queue = a.queue("q")
    await queue.put(b"job")
    async with queue.claim():
        pass

    # 4. a loss: someone deletes the holder's key.
    with pytest.raises(coord.LockLost):
        async with a.mutex("lost") as lost:
            await drop_key(a, lost.key)
            await anyio.sleep_forever()

    sa, sb = a.statistics(), b.statistics()
    assert (sa.acquires, sa.waits, sa.losses) == (6, 0, 1), sa
    assert (sb.acquires, sb.waits, sb.losses) == (1, 1, 0), sb
    assert sa.wait_time.count == sa.hold_time.count == 6
    assert sum(sa.hold_time.counts) == 6
    assert sa.hold_time.sum >= 0.3  # the first hold
    assert sa.hold_time.quantile(1.0) >= 0.25
    assert sb.wait_time.count == sb.hold_time.count == 1
    assert 0.3 <= sb.wait_time.sum < 10
    assert sb.wait_time.quantile(0.5) >= 0.25  # the bucket's upper bound
    assert sa.sessions_opened == 1
    assert sa.session_id == a.session.id
    assert isinstance(sa, coord.ClientStatistics)
    assert isinstance(sa.wait_time, coord.Histogram)


async def _hold_briefly(client: coord.Client, name: str) -> None:
    async with client.mutex(name):
        await anyio.sleep(0.01)


async def test_session_counters_follow_a_lost_session(clients: list[coord.Client]) -> None:
    a = clients[0]
    first = a.session
    await coord.testing.expire_session(a)
    async for session in a.sessions():
        if session is not first:
            break
    stats = a.statistics()
    assert (stats.sessions_opened, stats.sessions_lost) == (2, 1)
    assert stats.session_id == a.session.id != first.id


def test_histogram_buckets_and_quantiles() -> None:
    from coord._core.stats import TIME_BUCKETS, _Recorder

    recorder = _Recorder()
    for seconds in (0.0005, 0.001, 0.002, 0.7, 1000.0):
        recorder.add(seconds)
    hist = recorder.snapshot()
    assert hist.bounds == TIME_BUCKETS
    assert hist.counts[0] == 2  # at most 1 ms: the bound is included
    assert hist.counts[1] == 1
    assert hist.counts[-1] == 1
    assert hist.count == 5
    assert hist.sum == pytest.approx(1000.7035)
    assert hist.quantile(0.4) == 0.001
    assert hist.quantile(0.8) == 1.0
    assert hist.quantile(1.0) == float("inf")
    assert coord.Histogram(TIME_BUCKETS, (0,) * 17, 0, 0.0).quantile(0.5) == 0.0
    with pytest.raises(ValueError, match="q must be"):
        hist.quantile(2)


class _Broken:
    """An observer (an exporter) that fails on every event."""

    def acquired(self, what: str, name: str, fence: int, wait: float, waited: bool) -> None:
        raise ConnectionError("exporter down")

    def released(self, what: str, name: str, fence: int, held: float, lost: bool) -> None:
        raise ConnectionError("exporter down")


async def test_a_failing_observer_never_fails_an_acquire_or_a_release(
    clients: list[coord.Client], caplog: pytest.LogCaptureFixture
) -> None:
    """Found by review: an observer that raised in acquire left the key held (and the
    task's claim in place) until the session ended; in release it replaced the body's
    exception."""
    a, b = clients[:2]
    a._keeper.counters.observers = (_Broken(),)
    with pytest.raises(KeyError, match="the body's"):
        async with a.mutex("observed") as hold:
            raise KeyError("the body's")
    assert hold.released
    assert not hold.lost
    with anyio.fail_after(5):
        async with b.mutex("observed"):  # nothing left behind
            pass
        async with a.mutex("observed"):  # and no claim left: no "would wait on itself"
            pass
    assert a.statistics().acquires == 2
    assert sum("observer failed" in r.getMessage() for r in caplog.records) == 4
