"""Neither store's backend starts a thread (issue 18): a whole client's life leaves
``threading.enumerate()`` as it was, on asyncio and trio. ZooKeeper's speaks its protocol
on anyio; etcd's speaks gRPC itself (``backends/etcd/_grpc/``: on anyio streams, and on
asyncio's own transport on asyncio; grpc.aio ran a poller thread and four
``event_engine`` threads). Endpoints are addresses: a host name would be
resolved by the event loop's executor, a thread of the loop's."""

from __future__ import annotations

import threading

import anyio
import pytest

import coord
from coord.testing import wait_for_waiters

pytestmark = pytest.mark.anyio


@pytest.fixture(
    params=[
        pytest.param(("etcd", "asyncio"), marks=pytest.mark.etcd, id="etcd"),
        pytest.param(("etcd", "trio"), marks=pytest.mark.etcd, id="etcd-trio"),
        pytest.param(("zookeeper", "asyncio"), marks=pytest.mark.zookeeper, id="zk-asyncio"),
        pytest.param(("zookeeper", "trio"), marks=pytest.mark.zookeeper, id="zk-trio"),
    ]
)
def case(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def anyio_backend(case: tuple[str, str]) -> str:
    return case[1]


@pytest.fixture
def url(request: pytest.FixtureRequest, case: tuple[str, str]) -> str:
    return str(request.getfixturevalue(f"{case[0]}_url"))


def _threads() -> set[threading.Thread]:
    # anyio's pytest plugin runs trio in guest mode, whose I/O waits run on threads of
    # trio's cache ("Trio thread N"): the runner's, not the client's.
    return {t for t in threading.enumerate() if not t.name.startswith("Trio thread")}


async def test_a_clients_life_starts_no_thread(url: str) -> None:
    before = _threads()
    with anyio.fail_after(30):
        async with coord.connect(url, ttl=5) as a, coord.connect(url) as b:
            mutex = a.mutex("threads")
            hold = await mutex.acquire()
            async with anyio.create_task_group() as tg:

                async def wait_for_it() -> None:
                    async with b.mutex("threads") as second:
                        assert second.fence > hold.fence

                tg.start_soon(wait_for_it)
                await wait_for_waiters(a, "threads", 2)  # (entries, then a watch)
                await mutex.release()
            async with a.election("threads").campaign(b"a") as term:
                leader = await b.election("threads").leader()
                assert leader is not None
                assert leader.value == term.value == b"a"
            await a.queue("threads").put(b"job")
            async with b.queue("threads").claim() as job:
                assert job.payload == b"job"
    assert _threads() - before == set()
