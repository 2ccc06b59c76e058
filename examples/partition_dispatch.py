"""Ordered dispatch at volume: a partitioner shares a Kafka topic's partitions among
workers, and each owner writes to a sink fenced per partition.

Jobs keyed by customer are produced to the Kafka partition ``partition_of(key)``, so
the jobs of one customer stay in order in one partition. Three workers join one
partitioner of 8 partitions. The owner of a partition consumes it in order, starting
from the offset its sink recorded. It commits each batch to a SQLite sink in one
transaction: the results, and the partition's next offset, written only if the row's
fence is not higher than this owner's and its offset is where the batch starts
(``coord.fenced_update_sql``). A former owner's late batch is refused, so nothing is
written twice.

Halfway, one worker leaves. Its partitions move, and their new owners resume from the
sink's offsets. At the end the script checks that every job is in the sink exactly once,
in per-customer order, and prints the throughput.

    python examples/partition_dispatch.py          # throwaway etcd + Kafka-protocol broker
    python examples/partition_dispatch.py etcd://127.0.0.1:2379/demo 127.0.0.1:9092
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

import coord

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from aiokafka.structs import ConsumerRecord

JOBS = 20_000
CUSTOMERS = 64
PARTITIONS = 8
WORKERS = 3
BATCH = 500


class Refused(Exception):
    """The sink refused a batch: another owner has taken the partition over."""


class Sink:
    """The SQLite sink: each job's result, and each partition's next offset and fence."""

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE offsets (partition INTEGER PRIMARY KEY, next INTEGER NOT NULL,"
            " fence INTEGER NOT NULL)"
        )
        self._db.execute("CREATE TABLE done (customer TEXT, seq INTEGER, fence INTEGER)")
        self._db.executemany(
            "INSERT INTO offsets VALUES (?, 0, 0)", [(p,) for p in range(PARTITIONS)]
        )

    def next_offset(self, partition: int) -> int:
        row = self._db.execute("SELECT next FROM offsets WHERE partition = ?", (partition,))
        return int(row.fetchone()[0])

    def commit(self, partition: int, fence: int, batch: Sequence[ConsumerRecord]) -> None:
        """Write *batch*'s results and move the partition's offset past it, in one
        transaction, only if no higher fence wrote the row and the offset is where the
        batch starts."""
        sql, parameters = coord.fenced_update_sql(
            "offsets",
            {"next": batch[-1].offset + 1},
            where={"partition": partition, "next": batch[0].offset},
            fence=fence,
        )
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if self._db.execute(sql, parameters).rowcount != 1:
                raise Refused(f"partition {partition}: fence {fence} at {batch[0].offset}")
            self._db.executemany(
                "INSERT INTO done VALUES (?, ?, ?)",
                [(r.key.decode(), int(r.value), fence) for r in batch],
            )
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def done(self) -> list[tuple[str, int, int]]:
        return self._db.execute("SELECT customer, seq, fence FROM done ORDER BY rowid").fetchall()

    def count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM done").fetchone()[0])


async def work(hold: coord.PartitionHold, sink: Sink, bootstrap: str, topic: str) -> None:
    """Consume one owned partition in order, from the sink's offset, until it goes."""
    partition = TopicPartition(topic, hold.partition)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        with anyio.CancelScope(shield=True):  # (aiokafka leaks a connection if cancelled)
            await consumer.start()
        consumer.assign([partition])
        consumer.seek(partition, sink.next_offset(hold.partition))
        while True:
            got = await consumer.getmany(partition, timeout_ms=200, max_records=BATCH)
            if batch := got.get(partition):
                sink.commit(hold.partition, hold.fence, batch)
    finally:
        with anyio.CancelScope(shield=True):
            await consumer.stop()


async def worker(
    url: str, bootstrap: str, topic: str, sink: Sink, owned: set[int], stop: anyio.Event
) -> None:
    """Work the partitions this worker owns until *stop* is set; then leave the group
    (its partitions move) and close the client."""

    async def one(hold: coord.PartitionHold) -> None:
        owned.add(hold.partition)
        try:
            await work(hold, sink, bootstrap, topic)
        finally:
            owned.discard(hold.partition)

    async with coord.connect(url, ttl=2) as client:
        partitioner = client.partitioner("demo/dispatch", partitions=PARTITIONS)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: partitioner.run(one, cooldown=0.2))
            await stop.wait()
            tg.cancel_scope.cancel()


async def produce(bootstrap: str, topic: str, seqs: range) -> None:
    partitioner = coord.connect("memory://").partitioner("demo/dispatch", partitions=PARTITIONS)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for seq in seqs:
            customer = f"customer-{seq % CUSTOMERS}"
            await producer.send(
                topic,
                str(seq).encode(),
                key=customer.encode(),
                partition=partitioner.partition_of(customer),
            )
        await producer.flush()
    finally:
        await producer.stop()


async def main(url: str, bootstrap: str, directory: Path, jobs: int = JOBS) -> float:
    """Run it with *jobs* jobs; return the jobs per second."""
    topic = f"demo-{uuid.uuid4().hex[:6]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()
    sink = Sink(directory / "sink.db")
    owned: list[set[int]] = [set() for _ in range(WORKERS)]
    stops = [anyio.Event() for _ in range(WORKERS)]

    async def until(done: Callable[[], bool]) -> None:
        while not done():  # noqa: ASYNC110  (an example may poll its own sink)
            await anyio.sleep(0.01)

    def balanced(members: list[set[int]]) -> bool:
        share = PARTITIONS // len(members)
        every = sorted(p for mine in members for p in mine)
        return every == list(range(PARTITIONS)) and all(
            share <= len(mine) <= share + 1 for mine in members
        )

    async with anyio.create_task_group() as tg:
        for number in range(WORKERS):
            tg.start_soon(worker, url, bootstrap, topic, sink, owned[number], stops[number])
        with anyio.fail_after(60):
            await until(lambda: balanced(owned))
            before = [sorted(mine) for mine in owned]
            print("shares:", before)
            started = time.monotonic()
            await produce(bootstrap, topic, range(jobs // 2))
            await until(lambda: sink.count() == jobs // 2)
            stops[0].set()  # worker-0 leaves: its partitions move
            print(f"-- worker-0 leaves at {sink.count()} jobs done, owner of {before[0]}")
            await produce(bootstrap, topic, range(jobs // 2, jobs))
            await until(lambda: balanced(owned[1:]) and sink.count() == jobs)
        took = time.monotonic() - started
        after = [sorted(mine) for mine in owned[1:]]
        for stop in stops:
            stop.set()
    rows = sink.done()
    seqs = [seq for _, seq, _ in rows]
    if sorted(seqs) != list(range(jobs)):
        raise SystemExit(f"not exactly once: {len(seqs)} rows, {len(set(seqs))} distinct jobs")
    by_customer: dict[str, list[int]] = {}
    for customer, seq, _ in rows:
        by_customer.setdefault(customer, []).append(seq)
    if any(s != sorted(s) for s in by_customer.values()):
        raise SystemExit("per-customer order broken")
    moved = sorted(
        p for was, now in zip(before[1:], after, strict=True) for p in set(now) - set(was)
    )
    print(f"shares: {after}; moved: {moved}")
    if moved != before[0]:
        raise SystemExit("partitions other than the leaver's moved")
    print(
        f"{jobs} jobs of {CUSTOMERS} customers over {PARTITIONS} partitions, each exactly "
        f"once, per-customer order kept, {len({fence for _, _, fence in rows})} owners' "
        f"fences: {jobs / took:.0f} jobs/s from the first put to the last commit"
    )
    return jobs / took


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    from kafka_dispatch import servers

    with servers(sys.argv) as (store, brokers), tempfile.TemporaryDirectory() as tmp:
        anyio.run(main, store, brokers, Path(tmp), backend="asyncio")
