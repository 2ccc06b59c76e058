"""pytest plugin: real servers for integration tests, started once per test session.

Loaded automatically (entry point ``pytest11``) when coord is installed. Fixtures:

* ``etcd_server`` (session): an :class:`~coord.testing.EtcdServer` started by the tests.
* ``etcd_url``: an ``etcd://`` URL with a fresh namespace per test, so that tests share
  one server and never see each other's keys. ``$COORD_TEST_ETCD_URL`` points the tests
  at an existing cluster instead (tests that stop or pause the server are then skipped).
* ``zookeeper_server`` (session) and ``zookeeper_url`` (a fresh chroot per test): the
  same for ZooKeeper (:class:`~coord.testing.ZooKeeperServer`);
  ``$COORD_TEST_ZOOKEEPER_URL`` points the tests at an existing ensemble.
* ``kafka_broker`` (session): a Kafka-protocol broker without transactions
  (:class:`~coord.testing.TansuBroker`); ``kafka_txn_broker`` (session): one with
  transactions (:class:`~coord.testing.NoidaBroker`). Each has ``.bootstrap``;
  ``$COORD_TEST_KAFKA_URL`` (``host:port``) points both at a real Apache Kafka instead.

A missing server binary skips the tests that need it, loudly, on a laptop; when the
``CI`` environment variable is set it fails them: CI never passes by skipping.
"""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING, TypeVar

import pytest

from ._kafka import KafkaBroker, NoidaBroker, TansuBroker
from ._servers import EtcdServer, ServerNotFound, _Process
from ._zookeeper import ZooKeeperServer

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Iterator

__all__ = [
    "etcd_server",
    "etcd_url",
    "fresh_namespace",
    "kafka_broker",
    "kafka_txn_broker",
    "zookeeper_server",
    "zookeeper_url",
]

_P = TypeVar("_P", bound=_Process)


def _start_or_skip(factory: Callable[[], _P]) -> _P:
    try:
        return factory().start()
    except ServerNotFound as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc} (CI is set: a missing server fails the run)", pytrace=False)
        pytest.skip(f"SKIPPED LOUDLY: {exc}")


def fresh_namespace() -> str:
    """A namespace no other test uses."""
    return f"t{uuid.uuid4().hex[:12]}"


def _serve(factory: Callable[[], _P], env: str) -> Iterator[_P]:
    if os.environ.get(env):
        pytest.skip(f"{env} is set: not starting a local server")
    server = _start_or_skip(factory)
    try:
        yield server
    finally:
        server.close()


def _url(request: pytest.FixtureRequest, env: str, fixture: str) -> str:
    base = os.environ.get(env)
    if not base:
        server = request.getfixturevalue(fixture)
        if not server.running:  # a previous test left it stopped
            server.start()
        base = server.url
    return f"{base.rstrip('/')}/{fresh_namespace()}"


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """A real etcd started for this test session (stopped at the end)."""
    yield from _serve(EtcdServer, "COORD_TEST_ETCD_URL")


@pytest.fixture
def etcd_url(request: pytest.FixtureRequest) -> str:
    """An ``etcd://`` URL with a namespace of this test's own."""
    return _url(request, "COORD_TEST_ETCD_URL", "etcd_server")


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    """A real ZooKeeper started for this test session (stopped at the end)."""
    yield from _serve(ZooKeeperServer, "COORD_TEST_ZOOKEEPER_URL")


@pytest.fixture
def zookeeper_url(request: pytest.FixtureRequest) -> str:
    """A ``zk://`` URL with a chroot of this test's own."""
    return _url(request, "COORD_TEST_ZOOKEEPER_URL", "zookeeper_server")


class ExternalKafka:
    """A broker given by ``$COORD_TEST_KAFKA_URL``: nothing is started."""

    transactions = True

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap


def _kafka(factory: Callable[[], KafkaBroker]) -> Iterator[KafkaBroker | ExternalKafka]:
    external = os.environ.get("COORD_TEST_KAFKA_URL")
    if external:
        yield ExternalKafka(external)
        return
    broker = _start_or_skip(factory)
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker | ExternalKafka]:
    """A Kafka-protocol broker (Tansu: no transactions) for this test session."""
    yield from _kafka(TansuBroker)


@pytest.fixture(scope="session")
def kafka_txn_broker() -> Iterator[KafkaBroker | ExternalKafka]:
    """A Kafka-protocol broker with transactions (noida-db) for this test session."""
    yield from _kafka(NoidaBroker)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    """On failure, attach the tail of each server's log to the report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        funcargs = getattr(item, "funcargs", {})
        for value in funcargs.values():
            if isinstance(value, _Process):
                report.sections.append((f"{value.name} log (tail)", value.log_tail()))
        for fixture in ("etcd_server", "zookeeper_server", "kafka_broker", "kafka_txn_broker"):
            server = _session_server(item, fixture)
            if server is not None and server not in funcargs.values():
                report.sections.append((f"{server.name} log (tail)", server.log_tail()))


def _session_server(item: pytest.Item, fixture: str) -> _Process | None:
    fixtures = getattr(item, "_fixtureinfo", None)
    if fixtures is None or fixture not in fixtures.names_closure:
        return None
    defs = item.session._fixturemanager.getfixturedefs(fixture, item)
    cached = getattr(defs[-1], "cached_result", None) if defs else None
    return cached[0] if cached and isinstance(cached[0], _Process) else None
