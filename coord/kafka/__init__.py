"""Fenced publishing to Kafka: one elected dispatcher, and consumers that drop zombies.

Install with the ``kafka`` extra (``pip install coord[kafka]``); built on aiokafka.

* :class:`Dispatcher` runs on every worker of a pool. Only the leader of its election
  publishes: it takes jobs in order from a :class:`coord.Queue` (or messages from any
  async iterator), sends each to the topic keyed by the job's key, and acks the job only
  after the broker acknowledged the record. Every record carries the headers
  ``coord-fence`` (the leader's term fence), ``coord-dispatcher`` (its name),
  ``coord-leader`` and ``coord-job-id``.
* Where the broker supports transactions, the producer has a stable
  ``transactional_id`` per dispatcher and publishes each record in a transaction:
  starting a new leader's producer fences the previous one (KIP-98), whose writes then
  fail with ``ProducerFenced`` and are never visible to ``read_committed`` consumers.
  That ends the term (:exc:`coord.LeadershipLost`) and the producer is never reused.
  After its producer starts, a new leader checks once more that it still leads before
  its first send.
* :class:`FenceFilter` is the consumer side, for every broker (with or without
  transactions): it drops records whose ``coord-fence`` is lower than the highest seen on
  their partition by the same dispatcher — a deposed leader that was paused and
  published late — and records whose ``coord-job-id`` was already accepted, and reports
  what it dropped.

What is guaranteed: per-key order (records are keyed by the job's key, so one key's
records land on one partition, in queue order); at-least-once (a job is acked only after
its record was acknowledged, so a crash in between publishes it again: give the sink an
idempotent write, or let :class:`FenceFilter` drop the duplicate); zombie leaders fenced
(by the broker with transactions, and by :class:`FenceFilter` on any broker). What is
not: exactly-once across a crash without the filter or an idempotent sink; order across
keys; protection for consumers that ignore the headers.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from .._core import retry as _retry
from .._core.checks import check_str
from .._core.exceptions import ClaimLost, ConfigurationError, LeadershipLost
from .._core.extras import missing_extra

try:
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError, KafkaTimeoutError, ProducerFenced
except ModuleNotFoundError as _missing:
    raise missing_extra("coord.kafka", "kafka", _missing) from _missing

from ._filter import Dropped, FenceFilter
from ._log import NO_TRANSACTIONS, probing

if TYPE_CHECKING:
    from collections.abc import AsyncIterable, Callable, Mapping

    from .._client import Client
    from .._election.election import Term
    from .._jobs.queue import Queue

__all__ = ["HEADERS", "Dispatcher", "Dropped", "FenceFilter", "Message"]

_log = logging.getLogger("coord.kafka")

#: The headers every record carries.
HEADERS = ("coord-fence", "coord-dispatcher", "coord-leader", "coord-job-id")

# How long a commit's answer is waited for, also by a leader being stopped.
_COMMIT_WAIT = 30.0


@dataclass(frozen=True)
class Message:
    """A message for :class:`Dispatcher` from a source other than a coord queue.

    :ivar value: the record's value
    :ivar key: the record's key (its partition), or None
    :ivar id: an id for ``coord-job-id`` (for consumers' de-duplication)
    """

    value: bytes
    key: str | None = None
    id: str = ""


class Dispatcher:
    """Publish jobs to a Kafka topic from whichever worker leads, fenced.

    Example (every worker runs the same code)::

        dispatcher = coord.kafka.Dispatcher(
            client, "orders", queue=client.queue("orders"),
            topic="orders", bootstrap_servers="kafka:9092",
        )
        await dispatcher.run()   # campaigns, publishes while leading, forever

    :param client: the worker's coord client
    :param name: the dispatcher's name: its election is ``<name>/leader`` and its
        ``transactional_id`` is ``coord-<name>``
    :param topic: the topic to publish to
    :param bootstrap_servers: the Kafka brokers (``"host:port,..."``)
    :param queue: take jobs from this coord queue (acked once published), or
    :param source: call this at the start of each term for the messages to publish
    :param transactions: publish in transactions with a stable ``transactional_id``;
        None (the default) tries, and falls back with a warning to plain sends only if the
        broker answers that it has no transactions (a transient error is retried)
    :param producer_options: more keyword arguments for ``AIOKafkaProducer``
    :param cooldown: seconds a deposed leader waits before campaigning again
    """

    def __init__(
        self,
        client: Client,
        name: str,
        *,
        topic: str,
        bootstrap_servers: str,
        queue: Queue | None = None,
        source: Callable[[], AsyncIterable[Message]] | None = None,
        transactions: bool | None = None,
        producer_options: Mapping[str, Any] | None = None,
        cooldown: float = 1.0,
    ) -> None:
        if (queue is None) == (source is None):
            raise ConfigurationError("give a Dispatcher exactly one of queue= or source=")
        if not check_str(topic, "topic"):
            raise ConfigurationError("topic must not be empty")
        self._client = client
        self._election = client.election(f"{name}/leader")
        self._name = name
        self._topic = topic
        self._servers = bootstrap_servers
        self._queue = queue
        self._source = source
        self._transactions = transactions
        self._options = dict(producer_options or {})
        self._cooldown = cooldown
        who = client.identity
        self._leader = "/".join(str(who[k]) for k in ("host", "pid", "name") if k in who)
        #: Records this dispatcher published: acknowledged by the broker (with
        #: transactions: committed), counted when the broker's answer arrives.
        self.published: int = 0

    def __repr__(self) -> str:
        return f"<coord.kafka.Dispatcher {self._name!r} topic={self._topic!r}>"

    async def run(self) -> None:
        """Campaign, publish while leading, campaign again after a loss; until cancelled."""
        await self._election.run(self._lead, self._leader.encode(), cooldown=self._cooldown)

    async def _lead(self, term: Term) -> None:
        for attempt in _retry.attempts():
            producer = None
            try:
                producer = await self._producer()
                # Started (and, with transactions, the previous leader's producer fenced):
                # make sure we still lead before the first send.
                leader = await self._election.leader()
                if term.lost or leader is None or leader.fence != term.fence:
                    raise LeadershipLost(f"{self._name}: no longer the leader (term {term.fence})")
                await self._publish_all(producer, term)
                return
            except ProducerFenced as exc:
                raise LeadershipLost(
                    f"{self._name}: another producer took over (term {term.fence})"
                ) from exc
            except KafkaError as exc:
                _log.warning("%s: Kafka error while leading: %r; retrying", self._name, exc)
                await _retry.backoff(attempt, cap=5.0)
            except ClaimLost as exc:  # the job is claimable again; we still lead
                _log.warning("%s: %s", self._name, exc)
            finally:
                if producer is not None:
                    with anyio.move_on_after(5, shield=True):
                        await producer.stop()  # never reused: a fenced one is dead anyway

    async def _producer(self) -> AIOKafkaProducer:
        wanted = self._transactions
        if wanted is not False:
            producer = self._make(transactional=True)
            try:
                # Probing (wanted is None): coord's warning below is the one line the
                # user sees on a broker without transactions, not aiokafka's too.
                with probing() if wanted is None else nullcontext():
                    await producer.start()
                return producer
            except ProducerFenced:
                raise
            except KafkaError as exc:
                await producer.stop()
                # Only an answer that says "no transactions here" turns them off; a
                # transient error (connection, coordinator moving) is retried instead.
                if wanted or not isinstance(exc, NO_TRANSACTIONS):
                    raise
                _log.warning(
                    "%s: the broker cannot do transactions (%r): publishing without; "
                    "consumers must use coord.kafka.FenceFilter",
                    self._name,
                    exc,
                )
                self._transactions = False
        producer = self._make(transactional=False)
        await producer.start()
        return producer

    def _make(self, *, transactional: bool) -> AIOKafkaProducer:
        options: dict[str, Any] = {"acks": "all", **self._options}
        if transactional:
            options.update(transactional_id=f"coord-{self._name}", enable_idempotence=True)
        return AIOKafkaProducer(bootstrap_servers=self._servers, **options)

    async def _publish_all(self, producer: AIOKafkaProducer, term: Term) -> None:
        if self._queue is not None:
            while True:
                async with self._queue.claim() as job:
                    try:
                        await self._send(producer, term, Message(job.payload, job.key, job.id))
                    except KafkaError:
                        job.defer()  # the broker's trouble, not the job's: no attempt
                        raise
                # (acked here: only after the broker acknowledged the record)
        assert self._source is not None
        async for message in self._source():
            await self._send(producer, term, message)

    async def _send(self, producer: AIOKafkaProducer, term: Term, message: Message) -> None:
        headers = [
            ("coord-fence", str(term.fence).encode()),
            ("coord-dispatcher", self._name.encode()),
            ("coord-leader", self._leader.encode()),
            ("coord-job-id", message.id.encode()),
        ]
        key = message.key.encode() if message.key is not None else None
        if self._transactions is False:
            delivery = await producer.send(self._topic, message.value, key=key, headers=headers)
            # Counted when the broker acknowledges it, even if we stop waiting first
            # (the leader is stopped): the record is the broker's all the same.
            delivery.add_done_callback(self._count)
            await asyncio.shield(delivery)
            return
        transaction = producer.transaction()
        await transaction.__aenter__()
        try:
            # The record's own delivery, awaited: a record the broker refused must fail
            # the transaction, not be committed without it (and the job acked).
            await (await producer.send(self._topic, message.value, key=key, headers=headers))
        except BaseException as exc:
            await transaction.__aexit__(type(exc), exc, exc.__traceback__)  # aborts
            raise
        await self._commit(transaction)

    async def _commit(self, transaction: Any) -> None:
        """Commit, and count the record. Once asked, aiokafka commits even if its caller
        is cancelled: so a cancellation waits for the answer, bounded, so that a
        committed record is always counted (and its job acked)."""
        try:
            with anyio.fail_after(_COMMIT_WAIT, shield=True):
                await transaction.__aexit__(None, None, None)
        except TimeoutError:
            raise KafkaTimeoutError(
                f"{self._name}: no answer to a commit in {_COMMIT_WAIT:g}s: its outcome is "
                "unknown (the job is published again; FenceFilter drops a duplicate)"
            ) from None
        self.published += 1

    def _count(self, delivery: asyncio.Future[Any]) -> None:
        if not delivery.cancelled() and delivery.exception() is None:
            self.published += 1


for _name in __all__:
    _obj = globals()[_name]
    if hasattr(_obj, "__module__"):
        _obj.__module__ = "coord.kafka"
del _name, _obj
