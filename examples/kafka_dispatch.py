"""Fenced publishing to Kafka: three dispatchers, one elected leader publishes; consumers
read with coord.kafka.FenceFilter.

Jobs are put on a coord queue with keys; every worker runs a ``coord.kafka.Dispatcher``,
but only the leader of its election takes the jobs, in order, and publishes them to a
topic keyed by job key, with the headers ``coord-fence``, ``coord-leader`` and
``coord-job-id``; each job is acked once the broker acknowledged its record. Once the
first half is published, the leader is stopped (its client closed, as when its process
dies): another dispatcher takes over with a higher fence and publishes the second half.
A consumer reads the topic through a FenceFilter.

    python examples/kafka_dispatch.py          # throwaway etcd + Kafka-protocol broker
    python examples/kafka_dispatch.py etcd://127.0.0.1:2379/demo 127.0.0.1:9092
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from typing import TYPE_CHECKING

import anyio
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

import coord
import coord.kafka

if TYPE_CHECKING:
    from collections.abc import Iterator

JOBS = 12
KEYS = ("alice", "bob", "carol")


async def dispatcher(url: str, bootstrap: str, topic: str, name: str, stop: anyio.Event) -> None:
    async with coord.connect(url, ttl=2, identity=name) as client:
        worker = coord.kafka.Dispatcher(
            client,
            "demo-dispatch",
            queue=client.queue("demo/jobs"),
            topic=topic,
            bootstrap_servers=bootstrap,
            cooldown=0.2,
        )
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                await stop.wait()
                scope.cancel()
        print(f"{name} stopped after publishing {worker.published} records", flush=True)


async def consume(bootstrap: str, topic: str) -> list[str]:
    fence = coord.kafka.FenceFilter()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await consumer.start()
    lines = []
    try:
        with anyio.fail_after(30):
            async for record in fence.filter(consumer):
                headers = dict(record.headers)
                lines.append(
                    f"{record.key.decode():6} {record.value.decode():8} "
                    f"fence={headers['coord-fence'].decode()} "
                    f"leader={headers['coord-leader'].decode()}"
                )
                print("consumed", lines[-1], flush=True)
                if len(lines) == JOBS:
                    break
    finally:
        await consumer.stop()
    for dropped in fence.dropped:  # a job published again after its leader stopped
        print(f"dropped {dropped.record.value.decode()}: {dropped.reason}", flush=True)
    return lines


async def main(url: str, bootstrap: str) -> None:
    topic = f"demo-{uuid.uuid4().hex[:6]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 3, 1)])
    finally:
        await admin.close()
    async with coord.connect(url) as client:
        queue = client.queue("demo/jobs")
        election = client.election("demo-dispatch/leader")

        async def put(numbers: range) -> None:
            for n in numbers:
                await queue.put(f"order-{n}".encode(), key=KEYS[n % len(KEYS)])

        await put(range(JOBS // 2))
        stops = {f"dispatcher-{i}": anyio.Event() for i in range(3)}
        async with anyio.create_task_group() as tg:
            for name, stop in stops.items():
                tg.start_soon(dispatcher, url, bootstrap, topic, name, stop)
            # Once the first half is published, stop whoever leads; the second half is
            # put once another leads (a higher fence), so it is that one's to publish.
            with anyio.fail_after(30):
                while (await queue.stats()).depth > 0:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
            leader = await election.leader()
            assert leader is not None
            victim = leader.value.decode().rpartition("/")[2]
            print(f"-- stopping the leader, {victim} (fence {leader.fence})", flush=True)
            stops[victim].set()
            with anyio.fail_after(30):
                async for now in election.observe():
                    if now is not None and now.fence != leader.fence:
                        break
            await put(range(JOBS // 2, JOBS))
            lines = await consume(bootstrap, topic)
            for stop in stops.values():
                stop.set()
    by_key: dict[str, list[int]] = {}
    for line in lines:
        key, value = line.split()[:2]
        by_key.setdefault(key, []).append(int(value.split("-")[1]))
    for key, numbers in sorted(by_key.items()):
        if numbers != sorted(numbers):
            raise SystemExit(f"{key}: out of order: {numbers}")
    fences = {line.split()[2] for line in lines}
    print(f"{len(lines)} records, per-key order kept, {len(fences)} leaders' fences")


@contextlib.contextmanager
def servers(argv: list[str]) -> Iterator[tuple[str, str]]:
    if len(argv) > 2:
        yield argv[1], argv[2]
        return
    from coord.testing import EtcdServer, TansuBroker

    with EtcdServer() as etcd, TansuBroker() as broker:
        print(f"started a throwaway etcd at {etcd.endpoint} and a broker at {broker.bootstrap}")
        yield etcd.url + "/demo", broker.bootstrap


if __name__ == "__main__":
    with servers(sys.argv) as (store, brokers):
        anyio.run(main, store, brokers, backend="asyncio")
