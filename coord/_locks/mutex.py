"""Mutex: a fair-queue distributed lock with fencing tokens.

The algorithm of etcd's ``concurrency.Mutex`` and Curator's ``InterProcessMutex`` (see
:mod:`coord._locks.wait_queue`): one waiter key per acquire, each waiter watching only its immediate
predecessor, so a release wakes exactly one waiter; the key's creation revision is the
fencing token; the release deletes the key only if it is still mine (etcd #22082), in a
task of the session, retried in the background if it fails (CURATOR-678); a delete that
finds nothing means the lock had been lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from .._core.checks import check_int
from .._core.exceptions import ConfigurationError
from .cohort import MAX_HANDOFFS, cohort_of
from .task_lock import TaskLock

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from .._sessions.session import SessionSource
    from .hold import Hold

__all__ = ["Mutex", "MutexStatistics"]


@dataclass(frozen=True)
class MutexStatistics:
    """Local state of one :class:`Mutex` object (this process only).

    :ivar name: the mutex name
    :ivar locked: whether a task of this process holds it through this object
    :ivar fence: the holder's fencing token, or None
    :ivar tasks_waiting: tasks of this process waiting in ``acquire``
    """

    name: str
    locked: bool
    fence: int | None
    tasks_waiting: int


class Mutex(TaskLock):
    """A distributed mutex: strict FIFO, no herd, fenced, and loud when lost.

    Example::

        async with coord.connect("etcd://127.0.0.1:2379") as client:
            async with client.mutex("orders/42") as hold:
                await write_order(fence=hold.fence)

    Every acquire registers its own waiter key, so any number of tasks may share one
    Mutex object (and one session). A task that asks again for a mutex it holds (through
    this object or another of the same client) gets :exc:`coord.LockedError` instead of
    a deadlock; with ``reentrant=True`` it enters again, and the mutex is released when
    its outermost block exits (other tasks of the client still queue normally).
    Timeouts are cancel scopes::

        with anyio.fail_after(5):
            async with mutex: ...

    **Cohort mode** (``local_handoff=k``): the tasks of this client queue locally behind
    one waiter key in the store's queue, and a releasing task hands the lock straight to
    the next local waiter, with no round trip, at most *k* times in a row before the key
    goes back to the tail of the queue. Every holder still gets its own strictly
    increasing fence, is cancelled and gets :exc:`coord.LockLost` if the key or session
    is lost, and a key known to be lost is never handed on (see :mod:`coord._locks.cohort` for
    a key deleted by another client). FIFO holds within a client, and across
    clients per key: another client waits for at most k + 1 holds of each client ahead
    of it. For many tasks of few processes on one lock, it removes most of the round
    trips (see docs/benchmarks.md).

    **The etcd layout** (``layout="etcd"``, on etcd only): the keys, order and protocol of
    etcd's Go ``client/v3/concurrency`` ``Mutex`` (``mutex.go``, ``key.go``), so that
    ``etcdctl lock NAME`` and Go services share the lock, in both directions: one key
    ``NAME/<lease id in hex>`` per *session*, the oldest key under ``NAME/`` holds, each
    waiter waits for the deletion of the newest key created before its own. One key per
    session means that two tasks of this client on one name queue *locally*, FIFO, in
    front of that key; across clients the order is etcd's create-revision order. The
    fence is the key's create revision (a Go holder's ``Header().Revision`` at the
    grant is at least as large); its value is this client's identity (Go writes and
    reads none). A loss still cancels the body; a cancelled wait leaves no key; cohort
    mode is refused (see :mod:`coord._locks.etcd_layout`).

    **The kazoo and Curator layouts** (``layout="kazoo"`` or ``"curator"``, on ZooKeeper
    only): the nodes of kazoo's ``Lock`` (``kazoo/recipe/lock.py``:
    ``NAME/<uuid hex>__lock__<seq>``) or of Curator's ``InterProcessMutex``
    (``LockInternals.java``, ``StandardLockInternalsDriver.java``:
    ``NAME/_c_<uuid>-lock-<seq>``, protected mode), ordered and waited for by the peer's
    own rule, so that kazoo or Java services and coord's clients queue for one lock, in
    the peer's FIFO order. One node per acquire, so tasks of one client queue in the
    store as peers do. The fence is the node's czxid; the node holds this client's
    identity. A loss cancels the body; a cancelled wait leaves no node; a waiter whose
    session is lost waits again on the next; cohort mode is refused (see
    :mod:`coord._locks.node_layouts`).

    :param session: where the waiter keys' lease comes from: a client's sessions (which
        renew) or one :class:`coord.Session`
    :param name: slash-separated name, e.g. ``"orders/42"``
    :param reentrant: let the holding task enter again
    :param local_handoff: cohort mode's limit of local handoffs in a row (None: strict)
    :param layout: ``"coord"`` (the default), ``"etcd"``, ``"kazoo"`` or ``"curator"``
    :raises ConfigurationError: for an unknown layout, one the store does not speak, or
        another layout than ``"coord"`` with *local_handoff*
    """

    _what = "mutex"

    def __init__(
        self,
        session: SessionSource,
        name: str,
        *,
        reentrant: bool = False,
        local_handoff: int | None = None,
        layout: str = "coord",
    ) -> None:
        if local_handoff is not None and layout != "coord":
            raise ConfigurationError(
                f"local_handoff (cohort mode) is coord's layout only: in the {layout!r} "
                "layout a peer waits for the holder's own key, which cannot be handed on"
            )
        if local_handoff is not None and not (
            1 <= check_int(local_handoff, "local_handoff") <= MAX_HANDOFFS
        ):
            raise ConfigurationError(
                f"local_handoff must be None or an int from 1 to {MAX_HANDOFFS}, "
                f"not {local_handoff!r}"
            )
        super().__init__(session, name, reentrant=reentrant, layout=layout)
        self._local_handoff = local_handoff

    @property
    def local_handoff(self) -> int | None:
        """Cohort mode's limit of local handoffs in a row; None in strict mode."""
        return self._local_handoff

    def __repr__(self) -> str:
        flags = " reentrant" if self._reentrant else ""
        if self._local_handoff is not None:
            flags += f" local_handoff={self._local_handoff}"
        if self._layout != "coord":
            flags += f" layout={self._layout!r}"
        return f"<coord.Mutex {self._name!r}{flags} locked={self.locked()}>"

    def _turn(self, *, wait: bool) -> Awaitable[Hold]:
        if self._local_handoff is None:
            return super()._turn(wait=wait)  # its coroutine: no frame of this call's
        cohort = cohort_of(self._source, self._prefix)
        return cohort.acquire(
            partial(super()._turn, wait=wait),
            wait=wait,
            name=self._name,
            handoffs=self._local_handoff,
        )

    def statistics(self) -> MutexStatistics:
        """Return the local state of this object. Not a checkpoint."""
        hold = next(iter(self._held()), None)
        return MutexStatistics(
            self._name, hold is not None, hold.fence if hold else None, self._waiting
        )
