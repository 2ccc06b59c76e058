"""The etcd watch table (coord/backends/etcd/_watch.py) fed etcd's answers by hand, no
server: guards through "no leader" and "invalid auth token" cancels (kept, created again
on the next stream from their start revision), compaction (called back once, nothing
left), refusals answered with watch id -1, and stops racing all of these."""

from __future__ import annotations

from typing import Any

import pytest
from aetcd import rpc

from coord import BackendUnavailable
from coord.backends.etcd._connection import AuthTokenExpired
from coord.backends.etcd._watch import Guard, WatchCompacted, WatchStream

_INVALID = -1  # clientv3.InvalidWatchID


class _Table:
    """A WatchStream with no connection: "send" what its pump would, answer by hand."""

    def __init__(self) -> None:
        self.stream = WatchStream(None)  # type: ignore[arg-type]
        self.calls: list[str] = []

    def new_stream(self) -> None:
        self.stream._reset(object())  # no pump: we send

    def guard(self, name: str, start: int = 5) -> Guard:
        key = name.encode()
        return self.stream.guard(
            key, start_revision=start, on_change=lambda: self.calls.append(name)
        )

    def send(self) -> list[Any]:
        sent = []
        while (request := self.stream._next_request()) is not None:
            sent.append(request)
        return sent

    def answer(self, **fields: Any) -> None:
        self.stream._handle(rpc.WatchResponse(**fields))


def _created(requests: list[Any]) -> list[tuple[bytes, int, int]]:
    return [
        (r.create_request.key, r.create_request.start_revision, r.create_request.watch_id)
        for r in requests
        if r.HasField("create_request")
    ]


@pytest.mark.parametrize(
    ("reason", "raised"),
    [
        ("etcdserver: no leader", BackendUnavailable),
        ("etcdserver: invalid auth token", AuthTokenExpired),
    ],
)
@pytest.mark.parametrize("refused_at_creation", [False, True])
def test_a_guard_survives_a_stream_cancel_and_is_created_again(
    reason: str, raised: type[Exception], refused_at_creation: bool
) -> None:
    """The member lost its leader, or the stream's token is stale: the stream is reopened
    and the guard created again from the same start revision, not called back. Also when
    the cancel is the creation's refusal (etcd 3.5+: created, canceled, id -1)."""
    t = _Table()
    t.new_stream()
    guard = t.guard("a")
    [(_, _, first)] = _created(t.send())
    if refused_at_creation:
        with pytest.raises(raised):
            t.answer(watch_id=_INVALID, created=True, canceled=True, cancel_reason=reason)
    else:
        t.answer(watch_id=first, created=True)
        with pytest.raises(raised):
            t.answer(watch_id=first, canceled=True, cancel_reason=reason)
    assert t.calls == []
    assert not guard.closed
    t.new_stream()
    [(key, start, second)] = _created(t.send())
    assert (key, start) == (b"a", 5)
    assert second != first
    t.answer(watch_id=second, created=True)
    t.answer(watch_id=second, events=[rpc.Event(type=rpc.Event.DELETE, kv=rpc.KeyValue(key=b"a"))])
    assert t.calls == ["a"]
    assert len(t.stream) == 0


def test_a_compacted_guard_is_called_back_once_and_forgotten() -> None:
    """A guard whose start revision was compacted: called back once, with WatchCompacted
    as its error, nothing left in the table, no cancel sent (the server ended it)."""
    t = _Table()
    t.new_stream()
    guard = t.guard("a", start=2)
    [(_, _, wid)] = _created(t.send())
    t.answer(watch_id=wid, created=True)
    t.answer(watch_id=wid, canceled=True, compact_revision=9)
    assert t.calls == ["a"]
    assert isinstance(guard.error, WatchCompacted)
    guard.stop()
    assert t.send() == []
    assert len(t.stream) == 0
    assert not t.stream._by_id


def test_refusals_are_matched_in_the_order_creations_were_sent() -> None:
    """Several creations in flight; the second is refused (id -1): the second guard is
    the one called back, the others are created."""
    t = _Table()
    t.new_stream()
    t.guard("a")
    t.guard("b")
    t.guard("c")
    ids = [wid for _, _, wid in _created(t.send())]
    t.answer(watch_id=ids[0], created=True)
    t.answer(watch_id=_INVALID, created=True, canceled=True, cancel_reason="permission denied")
    t.answer(watch_id=ids[2], created=True)
    assert t.calls == ["b"]
    assert len(t.stream) == 2


def test_a_guard_stopped_before_its_refusal_is_not_called_back() -> None:
    """Stopped while its creation is in flight, then refused: not called back; its
    cancel is sent (harmless: the server knows no such id) and nothing is left."""
    t = _Table()
    t.new_stream()
    guard = t.guard("a")
    t.guard("b")
    ids = [wid for _, _, wid in _created(t.send())]
    guard.stop()
    [cancel] = t.send()
    assert cancel.cancel_request.watch_id == ids[0]
    t.answer(watch_id=_INVALID, created=True, canceled=True, cancel_reason="permission denied")
    t.answer(watch_id=ids[1], created=True)
    assert t.calls == []
    assert len(t.stream) == 1


def test_a_cancel_queued_for_the_old_stream_is_not_sent_on_the_new_one() -> None:
    """A guard stopped after its stream broke, before the new one opened: its cancel
    (for an id of the old stream, where an id of the new one may mean another watch) is
    dropped, and the guard is not created again."""
    t = _Table()
    t.new_stream()
    stopped = t.guard("a")
    t.guard("b")
    ids = [wid for _, _, wid in _created(t.send())]
    for wid in ids:
        t.answer(watch_id=wid, created=True)
    stopped.stop()  # the stream is down: the cancel waits
    t.new_stream()
    requests = t.send()
    assert not [r for r in requests if r.HasField("cancel_request")]
    assert [key for key, _, _ in _created(requests)] == [b"b"]
