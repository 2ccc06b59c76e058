"""coord.kafka.Dispatcher against real brokers: the elected leader publishes queue jobs
in order with coord's headers and acks each only after the broker acknowledged it;
transactions where the broker has them; a leader whose producer is fenced ends its term."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

import coord
import coord.kafka

from .test_brokers import make_topic, read

pytestmark = [pytest.mark.anyio, pytest.mark.kafka, pytest.mark.etcd]


async def wait_until_empty(queue: coord.Queue) -> None:
    with anyio.fail_after(15):
        while (await queue.stats()).depth:  # noqa: ASYNC110  (a test watching progress)
            await anyio.sleep(0.05)


async def publish_and_read(
    etcd_url: str, bootstrap: str, *, transactions: bool | None, jobs: int = 12
) -> tuple[list[Any], list[coord.kafka.Dispatcher]]:
    topic = await make_topic(bootstrap)
    async with (
        coord.connect(etcd_url, ttl=3, identity="w0") as a,
        coord.connect(etcd_url, ttl=3, identity="w1") as b,
    ):
        queue = a.queue("dispatch")
        for n in range(jobs):
            await queue.put(b"job %d" % n, key=f"k{n % 3}")
        dispatchers = [
            coord.kafka.Dispatcher(
                client,
                "dispatch",
                queue=client.queue("dispatch"),
                topic=topic,
                bootstrap_servers=bootstrap,
                transactions=transactions,
            )
            for client in (a, b)
        ]
        async with anyio.create_task_group() as tg:
            for dispatcher in dispatchers:
                tg.start_soon(dispatcher.run)
            await wait_until_empty(queue)
            tg.cancel_scope.cancel()
    options = {"isolation_level": "read_committed"} if transactions else {}
    return await read(bootstrap, topic, jobs, **options), dispatchers


def check_records(records: list[Any], jobs: int) -> None:
    assert len(records) == jobs
    fences = set()
    for record in records:
        headers = dict(record.headers)
        assert set(headers) == set(coord.kafka.HEADERS)
        fences.add(int(headers["coord-fence"]))
        assert headers["coord-leader"].endswith((b"/w0", b"/w1"))
    assert len(fences) == 1, "one leader published everything"
    by_key: dict[bytes, list[int]] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        by_key.setdefault(record.key, []).append(int(record.value.split()[1]))
    for key, numbers in by_key.items():
        assert numbers == sorted(numbers), f"{key!r} out of order: {numbers}"


async def test_leader_publishes_in_order_without_transactions(
    etcd_url: str, kafka_broker: Any
) -> None:
    records, dispatchers = await publish_and_read(
        etcd_url, kafka_broker.bootstrap, transactions=None
    )
    check_records(records, 12)
    assert sorted(d.published for d in dispatchers) == [0, 12]


async def test_a_broker_without_transactions_gives_one_line_coords(
    etcd_url: str, kafka_broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The probe's answer is said once, by coord: aiokafka's own ERROR line about it is
    dropped, for coord's probe only (another producer's start still logs it)."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    caplog.set_level(logging.INFO)
    records, _ = await publish_and_read(etcd_url, kafka_broker.bootstrap, transactions=None)
    check_records(records, 12)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [m for m in said if "InitProducerId" in m] == []
    assert len([m for m in said if "the broker cannot do transactions" in m]) == 1, said
    caplog.clear()
    other = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, transactional_id="x")
    with pytest.raises(KafkaError):
        await other.start()
    await other.stop()
    assert "Unexpected error during InitProducerIdRequest" in caplog.text


async def test_leader_publishes_transactionally(etcd_url: str, kafka_txn_broker: Any) -> None:
    records, dispatchers = await publish_and_read(
        etcd_url, kafka_txn_broker.bootstrap, transactions=True
    )
    check_records(records, 12)
    assert sorted(d.published for d in dispatchers) == [0, 12]


async def test_a_fenced_producer_ends_the_term_and_is_never_reused(
    etcd_url: str, kafka_txn_broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Another producer starts with the leader's transactional_id (as a new leader's
    would): the leader's next send fails with ProducerFenced, its term ends with
    LeadershipLost, and it leads again with a new producer; the fenced producer's
    record is never visible."""
    from aiokafka import AIOKafkaProducer

    bootstrap = kafka_txn_broker.bootstrap
    topic = await make_topic(bootstrap, 1)
    go = anyio.Event()
    sent: list[int] = []

    async def source() -> Any:
        for n in range(4):
            if n == 2:
                await go.wait()  # the rogue producer has started: we are fenced now
            sent.append(n)
            yield coord.kafka.Message(b"m%d" % n, "k", f"id{n}")

    async with coord.connect(etcd_url, ttl=3) as client:
        dispatcher = coord.kafka.Dispatcher(
            client,
            "fenced",
            source=source,
            topic=topic,
            bootstrap_servers=bootstrap,
            transactions=True,
            cooldown=0.1,
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.run)
            with anyio.fail_after(15):
                while dispatcher.published < 2:  # noqa: ASYNC110  (a test watching)
                    await anyio.sleep(0.05)
                rogue = AIOKafkaProducer(
                    bootstrap_servers=bootstrap, transactional_id="coord-fenced"
                )
                await rogue.start()  # bumps the epoch: the dispatcher's producer is fenced
                await rogue.stop()
                go.set()
                # The next term starts over (the source is called again) with a new producer.
                while dispatcher.published < 6:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
    assert "another producer took over" in caplog.text
    records = await read(bootstrap, topic, 6, isolation_level="read_committed")
    values = [r.value for r in records]
    assert values == [b"m0", b"m1", b"m0", b"m1", b"m2", b"m3"], values
    fence = coord.kafka.FenceFilter()
    assert [r.value for r in records if fence.accept(r)] == [b"m0", b"m1", b"m2", b"m3"]


async def test_a_broker_error_costs_the_job_no_attempt(
    etcd_url: str, kafka_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send that fails for the broker's sake (here: the connection) gives the job back
    as it was: with max_attempts=1 it would otherwise be parked at once."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaConnectionError

    topic = await make_topic(kafka_broker.bootstrap, 1)
    real = AIOKafkaProducer.send_and_wait
    failures = [KafkaConnectionError("the broker went away")] * 2

    async def flaky(self: AIOKafkaProducer, *args: Any, **options: Any) -> Any:
        if failures:
            raise failures.pop()
        return await real(self, *args, **options)

    monkeypatch.setattr(AIOKafkaProducer, "send_and_wait", flaky)
    async with coord.connect(etcd_url, ttl=3) as client:
        queue = client.queue("flaky", max_attempts=1)
        await queue.put(b"job", key="k")
        dispatcher = coord.kafka.Dispatcher(
            client,
            "flaky",
            queue=queue,
            topic=topic,
            bootstrap_servers=kafka_broker.bootstrap,
            transactions=False,
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.run)
            await wait_until_empty(queue)
            tg.cancel_scope.cancel()
        assert (await queue.stats()).parked == 0
    assert [r.value for r in await read(kafka_broker.bootstrap, topic, 1)] == [b"job"]
