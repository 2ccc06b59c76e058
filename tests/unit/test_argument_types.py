"""The README's rule for bad arguments, at every public entry point: a wrong *type* raises
:exc:`TypeError`, a wrong *value* of the right type :exc:`coord.ConfigurationError` (a
:exc:`ValueError`). Both at the call, with nothing written.

The etcd and ZooKeeper URLs point at nothing: their options are checked before anything
connects. The calls that need an open client run on the memory store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

import coord
from coord.backends.memory import MemoryBackend
from coord.testing.pytest_plugin import fresh_namespace

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeError
V = coord.ConfigurationError
ETCD = "etcd://127.0.0.1:1"
ZK = "zk://127.0.0.1:1"
MEM = "memory://"

Cases = list[tuple[str, "Callable[[], Any]", type[Exception]]]

# mypy would refuse most calls below (that is the point of them): Any lets them through.
_any: Any = coord

#: Calls that need no open client: (what, call, the exception it must raise).
AT_THE_CALL: Cases = [
    ("connect url", lambda: _any.connect(42), T),
    ("connect url value", lambda: _any.connect("nope"), V),
    ("connect ttl", lambda: _any.connect(MEM, ttl="10"), T),
    ("connect ttl bool", lambda: _any.connect(MEM, ttl=True), T),
    ("connect ttl value", lambda: _any.connect(MEM, ttl=0), V),
    ("connect renew", lambda: _any.connect(MEM, renew="no"), T),
    ("connect identity", lambda: _any.connect(MEM, identity=7), T),
    ("connect identity value", lambda: _any.connect(MEM, identity=""), V),
    ("Client backend", lambda: _any.Client(MEM), T),
    ("Client renew", lambda: _any.Client(MemoryBackend(), renew=1), T),
    ("etcd ca_file", lambda: _any.connect(ETCD, ca_file=42), T),
    ("etcd tls", lambda: _any.connect(ETCD, tls="yes"), T),
    ("etcd request_timeout", lambda: _any.connect(ETCD, request_timeout="5"), T),
    ("etcd request_timeout value", lambda: _any.connect(ETCD, request_timeout=0), V),
    ("zk suspended_is_lost", lambda: _any.connect(ZK, suspended_is_lost="yes"), T),
    ("zk connect_timeout", lambda: _any.connect(ZK, connect_timeout="5"), T),
    ("zk connect_timeout value", lambda: _any.connect(ZK, connect_timeout=-1), V),
    ("zk auth", lambda: _any.connect(ZK, auth="alice:secret"), T),
    ("zk auth value", lambda: _any.connect(ZK, auth=("a:b", "pw")), V),
    ("zk acl", lambda: _any.connect(ZK, acl=["world:anyone"]), T),
    ("zk acl value", lambda: _any.connect(ZK, acl=[]), V),
    ("zk ca_file", lambda: _any.connect(ZK, ca_file=42), T),
    ("zk ca_file value", lambda: _any.connect(ZK, ca_file="/nonexistent/ca.pem"), V),
    ("zk tls", lambda: _any.connect(ZK, tls="yes"), T),
    ("sql table", lambda: _any.fenced_update_sql(7, {"a": 1}, where={"i": 1}, fence=1), T),
    ("sql fence", lambda: _any.fenced_update_sql("t", {"a": 1}, where={"i": 1}, fence="1"), T),
    ("sql values", lambda: _any.fenced_update_sql("t", [("a", 1)], where={"i": 1}, fence=1), T),
    ("sql column", lambda: _any.fenced_update_sql("t", {1: 1}, where={"i": 1}, fence=1), T),
    ("sql name value", lambda: _any.fenced_update_sql("t", {"a b": 1}, where={"i": 1}, fence=1), V),
]  # fmt: skip


def _factories(client: Any) -> Cases:
    return [
        ("mutex name", lambda: client.mutex(42), T),
        ("mutex name value", lambda: client.mutex("a//b"), V),
        ("mutex reentrant", lambda: client.mutex("m", reentrant=1), T),
        ("mutex local_handoff", lambda: client.mutex("m", local_handoff=1.5), T),
        ("mutex local_handoff bool", lambda: client.mutex("m", local_handoff=True), T),
        ("mutex local_handoff value", lambda: client.mutex("m", local_handoff=0), V),
        ("semaphore name", lambda: client.semaphore(b"s", 2), T),
        ("semaphore limit", lambda: client.semaphore("s", "2"), T),
        ("semaphore limit bool", lambda: client.semaphore("s", True), T),
        ("semaphore limit value", lambda: client.semaphore("s", 0), V),
        ("rwlock name", lambda: client.rwlock(None), T),
        ("election name", lambda: client.election(42), T),
        ("queue name", lambda: client.queue(42), T),
        ("queue max_attempts", lambda: client.queue("q", max_attempts="5"), T),
        ("queue max_attempts value", lambda: client.queue("q", max_attempts=0), V),
        ("queue on_exhausted", lambda: client.queue("q", on_exhausted=5), T),
        ("queue on_exhausted value", lambda: client.queue("q", on_exhausted="drop"), V),
        ("queue retry_delay", lambda: client.queue("q", retry_delay="1"), T),
        ("queue max_retry_delay", lambda: client.queue("q", max_retry_delay=None), T),
        ("queue retry_delay value", lambda: client.queue("q", retry_delay=-1), V),
        ("campaign value", lambda: client.election("e").campaign("r1"), T),
    ]


async def _work(term: coord.Term) -> None:
    await anyio.lowlevel.checkpoint()


def _calls(client: Any, hold: Any, term: Any) -> Cases:
    election, queue, backend = client.election("e"), client.queue("q"), client.backend
    too_big = b"v" * (backend.max_value_size + 1)
    return [
        ("run value", lambda: election.run(_work, "r1"), T),
        ("run fn", lambda: election.run("fn", b"r1"), T),
        ("run cooldown", lambda: election.run(_work, b"r1", cooldown="1"), T),
        ("run cooldown value", lambda: election.run(_work, b"r1", cooldown=-1), V),
        ("proclaim value", lambda: term.proclaim("leader"), T),
        ("put payload", lambda: queue.put("hello"), T),
        ("put key", lambda: queue.put(b"hello", key=7), T),
        ("put key value", lambda: queue.put(b"hello", key=""), V),
        ("unpark key", lambda: queue.unpark(7), T),
        ("requeue job_id", lambda: queue.requeue(7), T),
        ("fenced_put hold", lambda: _any.fenced_put("hold", "k", b"v"), T),
        ("fenced_put key", lambda: _any.fenced_put(hold, 42, b"v"), T),
        ("fenced_put value", lambda: _any.fenced_put(hold, "k", "v"), T),
        ("fenced_put key value", lambda: _any.fenced_put(hold, "a//b", b"v"), V),
        ("backend put key", lambda: backend.put(42, b"v"), T),
        ("backend put value", lambda: backend.put("k", "v"), T),
        ("compare_and_set value", lambda: backend.compare_and_set("k", "v", version=None), T),
        ("compare_and_set size", lambda: backend.compare_and_set("k", too_big, version=None), V),
    ]


def test_connect_and_options() -> None:
    wrong = [w for what, call, error in AT_THE_CALL for w in _outcome(what, call, error)]
    assert wrong == []


async def test_factories_and_calls() -> None:
    wrong: list[str] = []
    async with coord.connect(f"memory://{fresh_namespace()}") as client:
        for what, call, error in _factories(client):
            wrong += _outcome(what, call, error)
        async with client.mutex("m") as hold, client.election("e").campaign(b"me") as term:
            for what, acall, error in _calls(client, hold, term):
                with anyio.fail_after(5):
                    try:
                        await acall()
                    except Exception as exc:
                        wrong += _verdict(what, exc, error)
                    else:
                        wrong.append(f"{what}: raised nothing")
        assert wrong == []
        # Refused with nothing written.
        assert (await client.queue("q").stats()).depth == 0
        assert await client.backend.get("k") is None


def _outcome(what: str, call: Callable[[], object], error: type[Exception]) -> list[str]:
    try:
        call()
    except Exception as exc:
        return _verdict(what, exc, error)
    return [f"{what}: raised nothing"]


def _verdict(what: str, exc: Exception, error: type[Exception]) -> list[str]:
    """A TypeError is never a ConfigurationError (a ValueError) too, and says what."""
    if not isinstance(exc, error) or (error is TypeError and isinstance(exc, ValueError)):
        return [f"{what}: {type(exc).__name__}: {exc} (expected {error.__name__})"]
    return [] if str(exc) else [f"{what}: {type(exc).__name__} without a message"]
