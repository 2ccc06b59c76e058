"""The ZooKeeper backend's pure parts, without a server: error translation, node names,
paths, and ZooKeeperServer's missing-install error."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from kazoo import exceptions as kz

import coord
from coord.backends.zookeeper._errors import translate
from coord.backends.zookeeper._paths import Paths, parse_waiter, waiter_names
from coord.testing import ServerNotFound, ZooKeeperServer

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.zookeeper


@pytest.mark.parametrize(
    ("error", "closed", "ended", "expected"),
    [
        (kz.ConnectionLoss(), False, False, coord.BackendUnavailable),
        (kz.ConnectionLoss(), True, False, coord.ClosedError),
        (kz.ConnectionLoss(), False, True, coord.SessionExpiredError),
        (kz.ConnectionClosedError(), False, False, coord.BackendUnavailable),
        (kz.SessionExpiredError(), False, False, coord.SessionExpiredError),
        (kz.NoAuthError(), False, False, coord.BackendError),
        (kz.InvalidACLError(), False, False, coord.BackendError),
    ],
)
def test_kazoo_errors_are_translated(
    error: Exception, closed: bool, ended: bool, expected: type[Exception]
) -> None:
    translated = translate(error, "get", closed=closed, ended=ended)
    assert type(translated) is expected
    assert not isinstance(translated, kz.KazooException)


def test_only_coord_waiter_nodes_are_queued_in_sequence_order() -> None:
    children = [
        "@bbb-0000000012",
        "sub",  # a nested name: "orders/42/sub"
        "@aaa-0000000003",
        "config",  # a plain key
        "@ccc-12",  # not a sequence suffix
        "@ddd-0000000007",
    ]
    assert [w.name for w in waiter_names(children)] == [
        "@aaa-0000000003",
        "@ddd-0000000007",
        "@bbb-0000000012",
    ]
    waiter = parse_waiter("@1f2e-0000000042")
    assert waiter is not None
    assert (waiter.waiter_id, waiter.sequence) == ("@1f2e", 42)


def test_paths_under_a_root() -> None:
    paths = Paths("app/prod")
    assert paths.path("orders/42/@x-0000000001") == "/app/prod/orders/42/@x-0000000001"
    assert paths.parent("orders/42/") == "/app/prod/orders/42"
    assert paths.split("orders/42/@x-0000000001") == (
        "orders/42/",
        "/app/prod/orders/42",
        "@x-0000000001",
    )
    assert paths.ancestors("/app/prod/orders/42/@x-") == [
        "/app",
        "/app/prod",
        "/app/prod/orders",
        "/app/prod/orders/42",
    ]
    assert Paths("").path("orders") == "/orders"


def test_the_jvm_is_quick_for_tests_and_as_production_for_benchmarks(
    tmp_path: Path,
) -> None:
    """Tests start a small JVM quickly (its first compiler only); benchmarks run the
    JVM's defaults, as production does; anything else is refused at once."""
    quick = ZooKeeperServer(directory=tmp_path)._command()
    production = ZooKeeperServer(directory=tmp_path, jvm="production")._command()
    assert "-XX:TieredStopAtLevel=1" in quick
    assert not [arg for arg in production if arg.startswith(("-XX:", "-Xm"))]
    with pytest.raises(ValueError, match="jvm must be"):
        ZooKeeperServer(jvm="fast")  # type: ignore[arg-type]


def test_a_missing_zookeeper_is_server_not_found() -> None:
    with pytest.raises(ServerNotFound, match="apt-get install zookeeper"):
        ZooKeeperServer(jar="/nonexistent/zookeeper.jar")
    with pytest.raises(ServerNotFound):
        ZooKeeperServer(java="/nonexistent/java")
