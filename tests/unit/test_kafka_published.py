"""``Dispatcher.published`` counts what the broker has, also when the leader is stopped
while a record is on its way: the example printed "stopped after publishing 8 records"
when 9 were delivered (the 9th was acknowledged after its sender was cancelled).

A fake producer stands in for aiokafka's, with its semantics: a delivery future per
record, which ``stop()`` settles (it flushes what is pending); a commit that goes on
once asked (aiokafka shields it), whoever stops waiting for it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
import pytest

pytest.importorskip("aiokafka")

import coord
import coord.kafka
from coord.testing.pytest_plugin import fresh_namespace

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # (aiokafka is asyncio code)


class FakeProducer:
    """The part of AIOKafkaProducer the Dispatcher uses."""

    made: ClassVar[list[FakeProducer]] = []

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.pending: list[asyncio.Future[None]] = []  # one per record not acknowledged
        self.delivered = 0
        self.committed = 0
        self.commit: asyncio.Future[None] | None = None  # the commit under way
        FakeProducer.made.append(self)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.deliver()

    def deliver(self) -> None:
        """The broker acknowledges every pending record (whoever still waits for it)."""
        for future in self.pending:
            if not future.done():  # (cancelled if its sender was)
                future.set_result(None)
        self.delivered += len(self.pending)
        self.pending = []

    async def send(self, topic: str, value: bytes, **kwargs: Any) -> asyncio.Future[None]:
        future = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        if "transactional_id" in self.options:
            self.deliver()  # (not what the test is about: acknowledged at once)
        return future

    async def send_and_wait(self, topic: str, value: bytes, **kwargs: Any) -> None:
        await (await self.send(topic, value, **kwargs))

    def transaction(self) -> FakeTransaction:
        return FakeTransaction(self)


class FakeTransaction:
    def __init__(self, producer: FakeProducer) -> None:
        self.producer = producer

    async def __aenter__(self) -> FakeTransaction:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is not None:
            return  # aborted
        producer = self.producer
        producer.commit = asyncio.get_running_loop().create_future()
        producer.commit.add_done_callback(lambda _: setattr(producer, "committed", 1))
        await asyncio.shield(producer.commit)  # as aiokafka: it goes on if we stop waiting


@pytest.fixture
def fake_producer(monkeypatch: pytest.MonkeyPatch) -> type[FakeProducer]:
    FakeProducer.made = []
    monkeypatch.setattr(coord.kafka, "AIOKafkaProducer", FakeProducer)
    return FakeProducer


async def _one_message() -> AsyncIterator[coord.kafka.Message]:
    yield coord.kafka.Message(b"order-9", "alice", "9")
    await anyio.sleep_forever()


async def _stop_while(transactions: bool, waiting: Any) -> tuple[FakeProducer, int]:
    """Run a dispatcher until *waiting(producer)*, stop it, then let the broker answer."""
    async with coord.connect(f"memory://{fresh_namespace()}") as client:
        dispatcher = coord.kafka.Dispatcher(
            client, "d", source=_one_message, topic="t", bootstrap_servers="x:9092",
            transactions=transactions,
        )  # fmt: skip
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.run)
            with anyio.fail_after(5):
                while not (FakeProducer.made and waiting(FakeProducer.made[-1])):  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            producer = FakeProducer.made[-1]
            tg.cancel_scope.cancel()  # the leader is stopped here...
            producer.deliver()  # ... and the broker acknowledges the record
            if producer.commit is not None:
                producer.commit.set_result(None)
    return producer, dispatcher.published


async def test_a_record_delivered_after_its_sender_was_stopped_is_counted(
    fake_producer: type[FakeProducer],
) -> None:
    producer, published = await _stop_while(False, lambda p: p.pending)
    assert producer.delivered == 1
    assert published == 1


async def test_a_transaction_committed_after_its_sender_was_stopped_is_counted(
    fake_producer: type[FakeProducer],
) -> None:
    producer, published = await _stop_while(True, lambda p: p.commit is not None)
    assert producer.committed == 1
    assert published == 1
