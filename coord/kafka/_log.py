"""aiokafka's own line about coord's transactions probe, kept out of the user's log.

A :class:`coord.kafka.Dispatcher` with ``transactions=None`` finds out whether the broker
has transactions by starting a transactional producer. A broker without them answers
its InitProducerId request with an error, and coord logs one WARNING: it publishes
without transactions, consumers must use the FenceFilter. aiokafka logs that answer
too, first, as an ERROR of its own ("Unexpected error during InitProducerIdRequest"): a
second, alarming line for an answer that coord expected and handles.

:func:`probing` marks the producer starts of a probe (a context variable: aiokafka asks
for the producer id in the task that calls ``start()``, and any task it starts there
inherits the mark). A filter on aiokafka's sender logger drops that one message, for
the answers that mean "no transactions", while a probe is under way in that context.
Other producers in the process, and every other message, are logged as before.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from aiokafka.errors import UnknownError, UnsupportedVersionError

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["NO_TRANSACTIONS", "probing"]

#: How brokers without transactions answer InitProducerId (Tansu: UnknownError).
NO_TRANSACTIONS = (UnsupportedVersionError, UnknownError)

#: aiokafka's format string (aiokafka/producer/sender.py, InitPIDHandler).
_MESSAGE = "Unexpected error during InitProducerIdRequest: %s"


class _Probe:
    """One probe: under way until its producer has started (or failed to)."""

    active = True


_probe: ContextVar[_Probe | None] = ContextVar("coord_kafka_probe", default=None)


class _QuietProbe(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        probe = _probe.get()
        if probe is None or not probe.active or record.msg != _MESSAGE:
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        return not (args and args[0] in NO_TRANSACTIONS)


logging.getLogger("aiokafka.producer.sender").addFilter(_QuietProbe())


@contextmanager
def probing() -> Iterator[None]:
    """Around the ``start()`` of a producer that probes for transactions."""
    probe = _Probe()
    token = _probe.set(probe)
    try:
        yield
    finally:
        probe.active = False
        _probe.reset(token)
