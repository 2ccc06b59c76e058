"""The brokers the Kafka tests run on do what those tests rely on: keyed records with
headers on a partitioned topic (Tansu), transactions and producer fencing (noida)."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import ProducerFenced

pytestmark = [pytest.mark.anyio, pytest.mark.kafka]


async def make_topic(bootstrap: str, partitions: int = 3) -> str:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()
    return topic


async def read(bootstrap: str, topic: str, count: int, **options: Any) -> list[Any]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", **options
    )
    await consumer.start()
    records: list[Any] = []
    try:
        with anyio.move_on_after(8):
            async for record in consumer:
                records.append(record)
                if len(records) == count:
                    break
    finally:
        await consumer.stop()
    return records


async def test_keyed_records_with_headers(kafka_broker: Any) -> None:
    topic = await make_topic(kafka_broker.bootstrap)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
    await producer.start()
    try:
        for n in range(6):
            await producer.send_and_wait(
                topic, b"v%d" % n, key=b"k%d" % (n % 2), headers=[("coord-fence", b"%d" % n)]
            )
    finally:
        await producer.stop()
    records = await read(kafka_broker.bootstrap, topic, 6)
    assert sorted(r.value for r in records) == [b"v%d" % n for n in range(6)]
    by_key: dict[bytes, set[int]] = {}
    for record in records:
        by_key.setdefault(record.key, set()).add(record.partition)
        assert dict(record.headers)["coord-fence"] == record.value[1:]
    assert all(len(p) == 1 for p in by_key.values()), "one key, one partition"


async def test_transactions_and_fencing(kafka_txn_broker: Any) -> None:
    bootstrap = kafka_txn_broker.bootstrap
    topic = await make_topic(bootstrap, 1)
    txn_id = f"coord-test-{uuid.uuid4().hex[:6]}"
    old = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id)
    await old.start()
    async with old.transaction():
        await old.send(topic, b"committed")
    await old.begin_transaction()
    await old.send(topic, b"aborted")
    await old.abort_transaction()
    new = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id)
    await new.start()  # bumps the epoch: the old producer is fenced
    try:
        with pytest.raises(ProducerFenced):
            async with old.transaction():
                await old.send(topic, b"zombie")
        async with new.transaction():
            await new.send(topic, b"new leader")
    finally:
        await old.stop()
        await new.stop()
    records = await read(bootstrap, topic, 2, isolation_level="read_committed")
    assert [r.value for r in records] == [b"committed", b"new leader"]
