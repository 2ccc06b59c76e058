"""coord.otel: the statistics as OpenTelemetry metrics, and acquire/hold spans, read with
the SDK's in-memory reader and exporter."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import coord
import coord.otel
from coord.backends.memory import MemoryBackend, MemoryStore
from coord.testing import drop_key, wait_for_waiters

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.anyio


@pytest.fixture
def providers() -> Iterator[tuple[InMemoryMetricReader, InMemorySpanExporter, dict[str, Any]]]:
    reader = InMemoryMetricReader()
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[reader])
    yield reader, exporter, {"meter_provider": meter_provider, "tracer_provider": tracer_provider}
    meter_provider.shutdown()
    tracer_provider.shutdown()


def _metrics(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


async def test_metrics_and_spans_of_a_scripted_sequence(
    providers: tuple[InMemoryMetricReader, InMemorySpanExporter, dict[str, Any]],
) -> None:
    reader, exporter, options = providers
    store = MemoryStore()
    async with (
        coord.Client(MemoryBackend(store), identity="worker-1") as a,
        coord.Client(MemoryBackend(store)) as b,
    ):
        with coord.otel.instrument(a, b, **options) as telemetry:
            assert "clients=2" in repr(telemetry)
            async with anyio.create_task_group() as tg:
                async with a.mutex("orders/42"):
                    tg.start_soon(_take, b, "orders/42")
                    await wait_for_waiters(a, "orders/42", 2)
                    await anyio.sleep(0.05)
            with pytest.raises(coord.LockLost):
                async with a.semaphore("gpu", 2) as hold:
                    await drop_key(a, hold.key)
                    await anyio.sleep_forever()
            found = _metrics(reader)
            spans = exporter.get_finished_spans()
        async with a.mutex("after-close"):
            pass  # not reported any more

    store_url = a.backend.url
    by_client = {
        (p.attributes.get("coord.client"), name): p.value
        for name in ("coord.lock.acquires", "coord.lock.waits", "coord.lock.losses")
        for p in found[name]
    }
    assert by_client == {
        ("worker-1", "coord.lock.acquires"): 2,
        ("worker-1", "coord.lock.waits"): 0,
        ("worker-1", "coord.lock.losses"): 1,
        (None, "coord.lock.acquires"): 1,
        (None, "coord.lock.waits"): 1,
        (None, "coord.lock.losses"): 0,
    }
    assert {p.value for p in found["coord.sessions.opened"]} == {1}
    assert {p.value for p in found["coord.sessions.lost"]} == {0}
    assert all(p.attributes["coord.store"] == store_url for p in found["coord.sessions.opened"])

    waits = {
        (p.attributes.get("coord.client"), p.attributes["coord.lock.kind"]): p
        for p in found["coord.lock.wait.duration"]
    }
    assert waits.keys() == {("worker-1", "mutex"), ("worker-1", "semaphore"), (None, "mutex")}
    waited = waits[None, "mutex"]
    assert waited.count == 1
    assert waited.sum >= 0.05
    assert tuple(waited.explicit_bounds) == a.statistics().wait_time.bounds
    holds = found["coord.lock.hold.duration"]
    assert sum(p.count for p in holds) == 3

    names = sorted(s.name for s in spans)
    assert names == [
        "coord.acquire mutex",
        "coord.acquire mutex",
        "coord.acquire semaphore",
        "coord.hold mutex",
        "coord.hold mutex",
        "coord.hold semaphore",
    ]
    (lost,) = [s for s in spans if s.name == "coord.hold semaphore"]
    assert lost.status.status_code is StatusCode.ERROR
    assert lost.attributes is not None
    assert lost.attributes["coord.lost"] is True
    assert lost.attributes["coord.lock.name"] == "gpu"
    (wait_span,) = [
        s
        for s in spans
        if s.name == "coord.acquire mutex" and s.attributes and s.attributes["coord.waited"]
    ]
    assert wait_span.start_time is not None
    assert wait_span.end_time is not None
    assert wait_span.end_time - wait_span.start_time >= 50_000_000  # ns


async def _take(client: coord.Client, name: str) -> None:
    async with client.mutex(name):
        pass


async def test_spans_can_be_left_out(
    providers: tuple[InMemoryMetricReader, InMemorySpanExporter, dict[str, Any]],
) -> None:
    reader, exporter, options = providers
    async with coord.Client(MemoryBackend()) as client:
        with coord.otel.instrument(client, spans=False, **options):
            async with client.mutex("quiet"):
                pass
            assert exporter.get_finished_spans() == ()
            assert [p.value for p in _metrics(reader)["coord.lock.acquires"]] == [1]
