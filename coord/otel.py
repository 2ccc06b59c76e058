"""OpenTelemetry metrics and spans for coord clients (extra: ``pip install coord[otel]``).

Example::

    import coord.otel

    async with coord.connect(url) as client:
        telemetry = coord.otel.instrument(client)   # the global meter and tracer providers
        ...
        telemetry.close()                           # or: with coord.otel.instrument(...)

**Metrics** (attributes: ``coord.store``, the store's URL without secrets, and
``coord.client``, the client's identity name when it has one):

==============================  ==========================  ==============================
``coord.lock.acquires``         counter (observable)        holds granted
``coord.lock.waits``            counter (observable)        acquires that had to wait
``coord.lock.losses``           counter (observable)        holds that ended lost
``coord.sessions.opened``       counter (observable)        sessions opened
``coord.sessions.lost``         counter (observable)        sessions lost
``coord.lock.wait.duration``    histogram, s, + lock kind   from the call to the grant
``coord.lock.hold.duration``    histogram, s, + lock kind   from the grant to the release
==============================  ==========================  ==============================

The counters are *observable*: the SDK reads :meth:`coord.Client.statistics` when it
collects, so they cost nothing between collections and always agree with it. OpenTelemetry
has no observable histogram, so the two histograms are recorded as each acquire and release
happens, through an observer that coord calls only while instrumented (otherwise the cost
is a loop over an empty tuple). The lock's name is not a metric attribute (names such as
``orders/42`` are unbounded); it is on the spans.

**Spans** (``spans=True``, the default): ``coord.acquire <kind>`` from the call to the
grant and ``coord.hold <kind>`` from the grant to the release, with the attributes
``coord.lock.kind``, ``coord.lock.name``, ``coord.fence`` and ``coord.waited`` /
``coord.lost`` (a lost hold's span has an ERROR status). Both are made when the
interval ends, with its real start time, as children of the span current in the task
that acquired or released.
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, Any

from ._core.extras import missing_extra
from ._core.stats import TIME_BUCKETS

try:
    from opentelemetry import metrics, trace
    from opentelemetry.trace import Status, StatusCode
except ModuleNotFoundError as _missing:
    raise missing_extra("coord.otel", "otel", _missing) from _missing

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from types import TracebackType

    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
    from opentelemetry.trace import TracerProvider
    from opentelemetry.util.types import AttributeValue

    from ._client import Client, ClientStatistics

__all__ = ["Telemetry", "instrument"]

_SCOPE = "coord"

#: The observable counters: metric name, ClientStatistics field, unit, description.
_COUNTERS = (
    ("coord.lock.acquires", "acquires", "{acquire}", "Holds granted"),
    ("coord.lock.waits", "waits", "{acquire}", "Acquires that had to wait"),
    ("coord.lock.losses", "losses", "{hold}", "Holds that ended lost"),
    ("coord.sessions.opened", "sessions_opened", "{session}", "Sessions opened"),
    ("coord.sessions.lost", "sessions_lost", "{session}", "Sessions lost"),
)


def instrument(
    *clients: Client,
    meter_provider: MeterProvider | None = None,
    tracer_provider: TracerProvider | None = None,
    spans: bool = True,
) -> Telemetry:
    """Export the metrics (and spans) of *clients*; see the module docstring.

    :param meter_provider: default: OpenTelemetry's global one
    :param tracer_provider: default: OpenTelemetry's global one
    :param spans: make the acquire and hold spans
    """
    telemetry = Telemetry(
        meter_provider=meter_provider, tracer_provider=tracer_provider, spans=spans
    )
    for client in clients:
        telemetry.add(client)
    return telemetry


class Telemetry:
    """The instruments of one meter provider, reading any number of clients.

    Make one per meter provider (instruments are created once) and :meth:`add` clients
    to it; :meth:`close` stops reporting them. Usable as a context manager.
    """

    def __init__(
        self,
        *,
        meter_provider: MeterProvider | None = None,
        tracer_provider: TracerProvider | None = None,
        spans: bool = True,
    ) -> None:
        meter = metrics.get_meter(_SCOPE, meter_provider=meter_provider)
        self._tracer = trace.get_tracer(_SCOPE, tracer_provider=tracer_provider) if spans else None
        self._clients: weakref.WeakKeyDictionary[Client, _ClientObserver] = (
            weakref.WeakKeyDictionary()
        )
        for name, field, unit, description in _COUNTERS:
            meter.create_observable_counter(
                name, callbacks=[self._reader(field)], unit=unit, description=description
            )
        self._wait = meter.create_histogram(
            "coord.lock.wait.duration",
            unit="s",
            description="Time from an acquire call to the grant",
            explicit_bucket_boundaries_advisory=TIME_BUCKETS,
        )
        self._hold = meter.create_histogram(
            "coord.lock.hold.duration",
            unit="s",
            description="Time from a grant to the release",
            explicit_bucket_boundaries_advisory=TIME_BUCKETS,
        )

    def __repr__(self) -> str:
        return f"<coord.otel.Telemetry clients={len(self._clients)} spans={bool(self._tracer)}>"

    def add(self, client: Client) -> None:
        """Report *client* too (idempotent). Not a checkpoint."""
        if client in self._clients:
            return
        observer = _ClientObserver(self, _attributes(client))
        self._clients[client] = observer
        counters = client._keeper.counters
        counters.observers = (*counters.observers, observer)

    def remove(self, client: Client) -> None:
        """Stop reporting *client*. Not a checkpoint."""
        observer = self._clients.pop(client, None)
        if observer is not None:
            counters = client._keeper.counters
            counters.observers = tuple(o for o in counters.observers if o is not observer)

    def close(self) -> None:
        """Stop reporting every client."""
        for client in list(self._clients):
            self.remove(client)

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.close()

    def _reader(self, field: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def read(options: CallbackOptions) -> Iterable[Observation]:
            for client, observer in list(self._clients.items()):
                stats: ClientStatistics = client.statistics()
                yield metrics.Observation(getattr(stats, field), observer.attributes)

        return read


class _ClientObserver:
    """Records one client's acquires and releases (a
    :class:`coord._core.stats.StatisticsObserver`)."""

    def __init__(self, telemetry: Telemetry, attributes: dict[str, AttributeValue]) -> None:
        self._telemetry = telemetry
        self.attributes = attributes

    def acquired(self, what: str, name: str, fence: int, wait: float, waited: bool) -> None:
        telemetry = self._telemetry
        telemetry._wait.record(wait, {**self.attributes, "coord.lock.kind": what})
        if telemetry._tracer is not None:
            extra = {"coord.waited": waited}
            self._span(telemetry._tracer, "acquire", what, name, fence, wait, extra, None)

    def released(self, what: str, name: str, fence: int, held: float, lost: bool) -> None:
        telemetry = self._telemetry
        telemetry._hold.record(held, {**self.attributes, "coord.lock.kind": what})
        if telemetry._tracer is not None:
            status = Status(StatusCode.ERROR, "the hold was lost") if lost else None
            extra = {"coord.lost": lost}
            self._span(telemetry._tracer, "hold", what, name, fence, held, extra, status)

    def _span(
        self,
        tracer: trace.Tracer,
        phase: str,
        what: str,
        name: str,
        fence: int,
        seconds: float,
        extra: dict[str, Any],
        status: Status | None,
    ) -> None:
        end = time.time_ns()
        span = tracer.start_span(
            f"coord.{phase} {what}",
            start_time=end - int(seconds * 1e9),
            attributes={
                **self.attributes,
                "coord.lock.kind": what,
                "coord.lock.name": name,
                "coord.fence": fence,
                **extra,
            },
        )
        if status is not None:
            span.set_status(status)
        span.end(end_time=end)


def _attributes(client: Client) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {"coord.store": client.backend.url}
    name = client.identity.get("name")
    if name:
        attributes["coord.client"] = str(name)
    return attributes
