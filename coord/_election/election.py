"""Election: leader election for worker pools — campaign, proclaim, observe, run.

Candidates queue exactly like mutex waiters (:mod:`coord._locks.wait_queue`): each registers a key
holding its value, bound to its session, and waits for its predecessor only; the head of
the queue leads. So candidates lead in registration order, the leader's fence is its key's
creation revision (strictly increasing from term to term), and a leader whose session is
lost, whose key is deleted or whose lease deadline passes is cancelled and gets
:exc:`coord.LeadershipLost` — where etcd's ``Campaign`` could report leadership while
holding no key (etcd #19597) and kazoo's ``Election.run`` never interrupts the leader.

Who leads, as read by ``leader`` and ``observe``, is in :mod:`coord._election.leader`.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, NoReturn

import anyio

from .._core import keys as _keys
from .._core import retry as _retry
from .._core.checks import check_bool, check_layout, check_size, check_supervisor
from .._core.exceptions import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    LeadershipLost,
    SessionExpiredError,
)
from .._locks.etcd_layout import EtcdHold
from .._locks.hold import Hold
from .._locks.node_layouts import LAYOUTS as NODE_LAYOUTS
from .._locks.node_layouts import layout_side
from .._locks.node_turn import NodeHold
from .._locks.task_lock import TaskLock
from .leader import (
    EtcdLeaders,
    Leader,
    Leaders,
    NodeLeaders,
    candidate_record,
    candidate_room,
    candidate_value,
    node_head,
    proclaim_room,
    proclaimed,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from .._locks.node_layouts import Side
    from .._sessions.session import SessionSource

__all__ = ["Campaign", "Election", "Term"]

_log = logging.getLogger("coord")


class Term(Hold):
    """One term of leadership: returned by ``async with election.campaign(value)``.

    :ivar fence: strictly increasing from term to term; send it with every write made as
        leader, so that a deposed leader's late writes can be refused
    """

    _lost_error = LeadershipLost

    def __repr__(self) -> str:
        state = "lost" if self.lost else "ended" if self.released else "leading"
        return f"<coord.Term {self.name!r} fence={self.fence} {state}>"

    @property
    def value(self) -> bytes:
        """The leader's current value (as campaigned, or last proclaimed)."""
        return candidate_value(self._entry.value)

    def _record(self, value: bytes) -> bytes:
        """What my key holds once *value* is proclaimed (its header kept)."""
        room = proclaim_room(self._entry.value, self._session.backend.max_value_size)
        return proclaimed(self._entry.value, check_size(value, room, "a leader's value"))

    async def proclaim(self, value: bytes) -> None:
        """Change the leader's value, only while still leading.

        A checkpoint. The write is guarded: it succeeds only if my key is still the one
        that won (same creation revision) and unchanged since my last write. Repeated
        while the store is unreachable and the term lasts. If cancelled, the new value
        may or may not have been written.

        :raises LeadershipLost: if the term is over (the key is gone, the session lost)
        :raises TypeError: if *value* is not bytes
        :raises ConfigurationError: if *value* is larger than the store takes
            (``backend.max_value_size``): nothing is sent, the term goes on
        """
        session = self._session
        backend = session.backend
        record = self._record(value)
        for attempt in _retry.attempts():
            if self.released:
                raise LeadershipLost(f"{self.name!r}: the term (fence {self.fence}) has ended")
            if self.lost:
                raise LeadershipLost(f"{self.name!r}: not leading any more: {self._why()}")
            try:
                entry = await backend.compare_and_set(
                    self.key, record, version=self._entry.version, lease=session.lease
                )
            except BackendUnavailable:
                entry = None
            except SessionExpiredError as exc:  # (ZooKeeper: the session ended under it)
                raise LeadershipLost(f"{self.name!r}: the session was lost") from exc
            if entry is not None and self._fence_of(entry.revision) == self.fence and not self.lost:
                self._entry = entry
                return
            # Refused, or no answer: read what the key holds now.
            try:
                current = await session.retry(partial(backend.get, self.key))
            except SessionExpiredError as exc:
                raise LeadershipLost(f"{self.name!r}: the session was lost") from exc
            except BackendError:
                current = self._entry  # try again (the loop ends if the term does)
            if current is None or self._fence_of(current.revision) != self.fence:
                self._key_gone()  # the body is cancelled, the block raises LeadershipLost
                raise LeadershipLost(f"{self.name!r}: not leading any more: {self._why()}")
            if current.value == record and current.version != self._entry.version:
                self._entry = current  # the write whose reply was lost did land
                return
            self._entry = replace(self._entry, version=current.version)
            await _retry.backoff(attempt)
        raise AssertionError("unreachable")  # pragma: no cover


class _RawTerm(Term):
    """A term of a peer's layout: the key holds the value as given, with nobody's
    record beside it."""

    @property
    def value(self) -> bytes:
        return self._entry.value

    def _record(self, value: bytes) -> bytes:
        return check_size(value, self._session.backend.max_value_size, "a leader's value")


class EtcdTerm(_RawTerm, EtcdHold):
    """A term of the etcd layout: the key holds the value raw (Go's ``Campaign`` and
    ``Proclaim`` write it so; ``etcdctl elect -l`` prints it), and its fence is the
    key's create revision."""


class NodeTerm(_RawTerm, NodeHold):
    """A term of kazoo's or Curator's layout: the node holds the value raw (kazoo's
    identifier, Curator's participant id), and its fence is the node's czxid."""


class Campaign(TaskLock):
    """One candidacy in an election: what :meth:`Election.campaign` returns.

    Use it with ``async with election.campaign(value) as term:``: entering waits until
    this client leads and gives the :class:`coord.Term`; the body runs only while it
    leads; leaving resigns. Made anew for each campaign; one task at a time uses it.
    """

    _what = "election"
    _kind = "election"
    _hold_type = Term
    _etcd_hold_type = EtcdTerm
    _node_hold_type = NodeTerm

    def __init__(
        self,
        source: SessionSource,
        name: str,
        value: bytes,
        *,
        layout: str = "coord",
        selector: bool = False,
    ) -> None:
        self._selector = selector  # (before the side is chosen, in TaskLock's __init__)
        super().__init__(source, name, layout=layout)
        self._campaign_value = value

    def _peer_side(self, layout: str) -> Side:
        # Curator's LeaderSelector is an InterProcessMutex whose node holds the id.
        return layout_side(layout, "mutex" if self._selector else "election")

    def __repr__(self) -> str:
        return f"<coord.Election.campaign {self._name!r} value={self._campaign_value!r}>"

    def _value(self) -> bytes:
        if self._layout != "coord":
            return self._campaign_value  # raw, as election.go, kazoo and Curator write it
        # Made anew at each registration (its time), as a lock's.
        return candidate_record(self._source.identity, self._campaign_value)

    async def __aenter__(self) -> Term:
        term = await super().__aenter__()
        assert isinstance(term, Term)
        return term


class Election:
    """Leader election among the clients that campaign under one name.

    Example::

        election = client.election("workers/leader")
        async with election.campaign(b"host-1") as term:
            await lead(fence=term.fence)   # cancelled if leadership is lost

        await election.run(lead, b"host-1")   # campaign forever

    **The etcd layout** (``layout="etcd"``, on etcd only) is that of etcd's Go
    ``client/v3/concurrency`` ``Election`` (``election.go``): a candidate's key
    ``NAME/<lease id in hex>`` (one per session: two tasks of this client campaign in
    turn, locally) holds its value raw; the oldest key under ``NAME/`` leads; a
    candidate waits for the deletion of the newest key created before its own;
    ``proclaim`` rewrites the value guarded by the key's version; resigning deletes the
    key guarded by its create revision, which is also the term's fence. So ``etcdctl
    elect NAME VALUE`` and Go services campaign with coord's clients, and ``leader()``
    and ``observe()`` read theirs as ``etcdctl elect -l NAME`` reads coord's.

    **The kazoo and Curator layouts** (``layout="kazoo"`` or ``"curator"``, on
    ZooKeeper): a candidate is a node of kazoo's ``Election`` (a ``Lock``:
    ``kazoo/recipe/election.py``, ``NAME/<uuid hex>__lock__<seq>``, the identifier as
    data) or of Curator's ``LeaderLatch`` (``leader/LeaderLatch.java``,
    ``NAME/_c_<uuid>-latch-<seq>``, the participant id as data), holding the value raw;
    the first by the peer's order leads (kazoo's ``contenders()[0]``, Curator's
    ``getLeader()``), and ``leader()`` reads theirs as they read coord's. The fence is
    the node's czxid; ``proclaim`` rewrites the node's data guarded by its version.
    kazoo decodes every contender's data as UTF-8, so its layout takes only UTF-8
    values.

    **Curator's LeaderSelector** (``layout="curator", selector=True``): a candidate is
    a node of the ``InterProcessMutex`` a ``LeaderSelector`` takes
    (``leader/LeaderSelector.java``: ``NAME/_c_<uuid>-lock-<seq>``, the id set with
    ``setId`` as data, raw); the holder of that mutex leads, as
    ``LeaderSelector.getLeader()`` reads it. A Java service's ``LeaderLatch`` and
    ``LeaderSelector`` do not share leadership with each other either: take the one it
    uses.

    :param session: where the candidate keys' lease comes from
    :param name: slash-separated name
    :param layout: ``"coord"`` (the default), ``"etcd"``, ``"kazoo"`` or ``"curator"``
    :param selector: in the ``"curator"`` layout, Curator's ``LeaderSelector`` instead
        of its ``LeaderLatch``
    :raises ConfigurationError: for a bad name, an unknown layout, or one the store
        does not speak; *selector* in another layout than ``"curator"``
    """

    def __init__(
        self, session: SessionSource, name: str, *, layout: str = "coord", selector: bool = False
    ) -> None:
        backend = session.backend
        self._layout = check_layout(layout, backend.layouts, type(backend).__name__)
        if check_bool(selector, "selector") and layout != "curator":
            raise ConfigurationError(
                f"selector=True is Curator's LeaderSelector: layout='curator' only, not {layout!r}"
            )
        self._selector = selector
        kind = "mutex" if selector else "election"
        self._side = layout_side(layout, kind) if layout in NODE_LAYOUTS else None
        self._source = session
        self._name = _keys.check_name(name)
        self._prefix = _keys.prefix_of(name)

    @property
    def name(self) -> str:
        return self._name

    @property
    def layout(self) -> str:
        """``"coord"``, ``"etcd"``, ``"kazoo"`` or ``"curator"`` (see above)."""
        return self._layout

    def __repr__(self) -> str:
        layout = "" if self._layout == "coord" else f" layout={self._layout!r}"
        selector = " selector=True" if self._selector else ""
        return f"<coord.Election {self._name!r}{layout}{selector}>"

    def campaign(self, value: bytes) -> Campaign:
        """Campaign with *value*: ``async with election.campaign(value) as term:``.

        Entering waits (a checkpoint) until this client leads — candidates lead in the
        order they registered — and returns the :class:`Term`; it leads only once its own
        key is confirmed to exist at the head of the queue. The body runs only while
        leading: on a session loss, the key's deletion or the lease deadline passing it
        is cancelled and the block raises :exc:`coord.LeadershipLost`. Leaving resigns:
        the key is deleted (guarded by the fence, in a task of the session, retried).

        A cancelled or failed campaign leaves no key. A task campaigns once at a time in
        one election (asking again raises :exc:`coord.LockedError`).

        :raises TypeError: if *value* is not bytes (at the call)
        :raises ConfigurationError: if *value* is larger than the store takes
            (``backend.max_value_size``), at the call
        """
        return Campaign(
            self._source,
            self._name,
            self._check_value(value),
            layout=self._layout,
            selector=self._selector,
        )

    @property
    def max_value_size(self) -> int:
        """The largest value :meth:`campaign` and :meth:`Term.proclaim` take on this
        store, in bytes: the store's value limit less the candidate's record beside it
        (who campaigns, and when: about a hundred bytes; none in the peers' layouts)."""
        if self._layout != "coord":
            return self._source.backend.max_value_size
        return candidate_room(self._source.identity, self._source.backend.max_value_size)

    def _check_value(self, value: object) -> bytes:
        checked = check_size(value, self.max_value_size, "a leader's value")
        if self._layout == "kazoo":
            try:
                checked.decode()
            except UnicodeDecodeError:
                raise ConfigurationError(
                    "the 'kazoo' layout takes UTF-8 values only: kazoo's contenders() "
                    "decodes every contender's data"
                ) from None
        return checked

    async def leader(self) -> Leader | None:
        """The current leader, or None if nobody leads. A checkpoint; one read.

        :raises BackendUnavailable: if the store cannot be reached
        """
        if self._layout == "etcd":  # election.go's Leader: the first key by creation
            listing = await self._source.read(lambda b: b.keys_by_creation(self._prefix, limit=1))
            return Leader._of(listing.entries[0], raw=True) if listing.entries else None
        if self._side is not None:  # kazoo's contenders()[0], Curator's getLeader()
            listing = await self._source.read(
                partial(node_head, prefix=self._prefix, side=self._side)
            )
            return Leader._of(listing.entries[0], raw=True) if listing.entries else None
        listing = await self._source.read(lambda b: b.entries(self._prefix, limit=1))
        return Leader._of(listing.entries[0]) if listing.entries else None

    def observe(self) -> AsyncIterator[Leader | None]:
        """Follow the leader: ``async for leader in election.observe():``.

        Yields the current leader first (None when nobody leads), then every change:
        a new leader, a proclaimed value, no leader. Level-triggered and de-duplicated:
        each value yielded was read from the store, never a state already yielded.
        Survives store outages, restarts, lost watch history and new sessions (it reads
        again and carries on), and never ends on its own otherwise. Needs no session of
        its own (a client opened with ``sessions=False`` observes until it is closed).
        Each step is a checkpoint.

        :raises ClosedError: when the client closes, also while waiting for a change
        :raises SessionExpiredError: with ``renew=False``, as soon as the client's
            session is lost (none will follow it), on every store alike, also while
            waiting for a change: ZooKeeper can read nothing once its session is over,
            and a client that opens no other is done
        """
        if self._layout == "etcd":
            return EtcdLeaders(self._source, self._prefix)
        if self._side is not None:
            return NodeLeaders(self._source, self._prefix, self._side)
        return Leaders(self._source, self._prefix)

    async def run(
        self,
        fn: Callable[[Term], Awaitable[object]],
        value: bytes,
        *,
        cooldown: float = 1.0,
    ) -> NoReturn:
        """Campaign, run ``fn(term)`` while leading, and campaign again, until cancelled.

        After a loss (``fn`` is cancelled, :exc:`coord.LeadershipLost` is logged) or
        after ``fn`` returns (resigning), wait *cooldown* seconds before campaigning
        again, so that a node that steps down does not win again at once. The default,
        a second, also keeps a leader whose ``fn`` returns at once (nothing to do yet, a
        failed precondition) from campaigning in a tight loop, each term writing to the
        store and logging two lines. 0 campaigns again at once. Logs one
        "leading" line when a term starts and one "stopped leading" line when it ends,
        always in pairs. An exception from *fn* resigns and propagates.

        :raises TypeError: if *fn* is not callable, *value* not bytes or *cooldown* not a
            number (at the call)
        :raises ConfigurationError: for a *cooldown* below 0 or not finite, or a *value*
            larger than the store takes (at the call)
        """
        value = self._check_value(value)
        cooldown = check_supervisor(fn, cooldown)
        while True:
            term: Term | None = None
            try:
                async with self.campaign(value) as term:
                    _log.info("%s: leading (term %d)", self._name, term.fence)
                    try:
                        await fn(term)
                    finally:
                        _log.info("%s: stopped leading (term %d)", self._name, term.fence)
            except LeadershipLost as exc:
                if term is not None and term.lost:
                    # The release logged the loss (its fence and why) as a WARNING.
                    _log.info("%s: campaigning again after the loss", self._name)
                else:  # fn ended the term itself (e.g. a fenced Kafka producer)
                    _log.warning("%s: %s; campaigning again", self._name, exc)
            await anyio.sleep(cooldown)
