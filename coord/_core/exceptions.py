"""Every exception coord raises, as one tree.

::

    CoordError
    ├── ConfigurationError    + ValueError   bad URL, name or option, raised at the call
    ├── BackendError                         the store answered with an error
    │   ├── BackendUnavailable + OSError     no member of the store could be reached
    │   ├── EntryGoneError    + LookupError  (backend contract) a waiter entry no longer exists
    │   └── ResyncNeeded                     (backend contract) a watch lost history: re-read
    ├── SessionExpiredError   + anyio.BrokenResourceError
    │   └── LockLost                         a held lock was lost (``async with`` body cancelled)
    │       ├── LeadershipLost
    │       ├── MembershipLost               a group membership was lost
    │       ├── PartitionLost                a partition went while worked on
    │       └── ClaimLost                    a worker's claim on a queued job was lost
    ├── LockedError                          ``try_acquire`` found the lock taken (etcd ErrLocked)
    ├── NotOwnerError         + RuntimeError release of a lock this task does not hold
    ├── NotLeaderError, NoLeaderError        (election)
    ├── JobNotFound           + LookupError  (queue) no such job or dead letter
    ├── JobTimeout            + TimeoutError (queue) a claimed job's body ran past its timeout
    ├── OutcomeUnknown                       a write was sent and no answer came: it may
    │                                        have been applied (``.operation``, ``.job_id``)
    └── ClosedError           + anyio.ClosedResourceError

Client-library errors (gRPC, kazoo's exception classes) are translated at the backend boundary with
``raise ... from exc``; cancellation is never caught or wrapped. Waiting calls take no
timeout: callers use ``anyio.fail_after``, which raises the builtin :exc:`TimeoutError`.
The one timeout coord keeps itself is a queued job's (``put(..., timeout=)``): it is
stored with the job and outlives the worker, so its end is a failed attempt, which
:exc:`JobTimeout` (a :exc:`TimeoutError`) reports.
"""

from __future__ import annotations

from typing import Any

import anyio

__all__ = [
    "BackendError",
    "BackendUnavailable",
    "ClaimLost",
    "ClosedError",
    "ConfigurationError",
    "CoordError",
    "EntryGoneError",
    "JobNotFound",
    "JobTimeout",
    "LeadershipLost",
    "LockLost",
    "LockedError",
    "MembershipLost",
    "NoLeaderError",
    "NotLeaderError",
    "NotOwnerError",
    "OutcomeUnknown",
    "PartitionLost",
    "ResyncNeeded",
    "SessionExpiredError",
]


class CoordError(Exception):
    """Base class of every error raised by coord."""


class ConfigurationError(CoordError, ValueError):
    """A URL, name or option is invalid. Raised at the call, before anything is written.

    An argument of the wrong *type* raises :exc:`TypeError` instead (as Python's builtins
    do); this is for a value of the right type that is not valid."""


class BackendError(CoordError):
    """The coordination store answered a request with an error."""


class BackendUnavailable(BackendError, OSError):
    """No member of the coordination store could be reached."""


class EntryGoneError(BackendError, LookupError):
    """A waiter entry no longer exists (backend contract: :meth:`coord.abc.Backend.position`)."""


class ResyncNeeded(BackendError):
    """A watch cannot deliver every change after the revision asked for: etcd compacted
    that history, ZooKeeper keeps none, a memory watcher fell behind. Read again, then
    watch from the revision of that read (backend contract: :meth:`coord.abc.Backend.watch`).
    """


class SessionExpiredError(CoordError, anyio.BrokenResourceError):
    """The session (etcd lease, ZooKeeper session) is gone.

    Everything bound to it (waiter keys, held locks) has been or will be deleted by the
    store. A new session is needed to take part again.
    """


class LockLost(SessionExpiredError):
    """A held lock was lost while its holder was still using it.

    Raised when the session expired, was revoked, or the holder's key was deleted by
    someone else. The body of ``async with mutex:`` has been cancelled; another client may
    already hold the lock, so any write made under it must be fenced with ``hold.fence``.
    """


class LeadershipLost(LockLost):
    """Leadership was lost while the leader was still leading."""


class MembershipLost(LockLost):
    """A group membership was lost while the member was still in its block (its session
    was lost, or its entry deleted by someone else)."""


class PartitionLost(LockLost):
    """A partition went while work on it was under way (``async with owner.partition(p)``):
    taken away by a new assignment, or lost with the session. Its block was cancelled;
    another member may own it now, so writes made for it must carry its fence."""


class ClaimLost(LockLost):
    """A worker's claim on a queued job was lost, or its ending (ack, retry, park,
    dead letter, release) was not known to be applied.

    :attr:`outcome` says what became of the ending, as the store answered:

    * ``"not done"``: certainly not applied. The claim was lost while the body ran (the
      body was cancelled and no ending was sent), or the store refused the ending
      because the claim was no longer this worker's. The job is another worker's to do
      (it may already be): make side effects idempotent with ``job.fence``.
    * ``"unknown"``: the ending was sent and no answer came in time (a lost reply, the
      session lost with it, or the store's answer slower than the TTL). It may have been
      applied: the job may be done, or may run again. The client keeps trying to learn
      the answer after this is raised, and logs it (logger ``coord``, WARNING) with the
      job's id.

    :ivar outcome: ``"not done"`` or ``"unknown"``
    :ivar job_id: the id of the job (:attr:`coord.Job.id`), None if raised by a lock
    """

    def __init__(self, *args: object, outcome: str = "not done", job_id: str | None = None):
        super().__init__(*args)
        self.outcome = outcome
        self.job_id = job_id


class JobNotFound(CoordError, LookupError):
    """No queued job or dead letter has the id given."""


class JobTimeout(CoordError, TimeoutError):
    """A claimed job's body ran past the job's timeout (``put(..., timeout=)``, or the
    queue's ``timeout``): it was cancelled, and the attempt counted as failed (retried
    after the backoff, or parked or dead-lettered after its last attempt). Raised by the
    ``async with queue.claim()`` block.

    :ivar job_id: the id of the job
    :ivar timeout: its timeout, in seconds
    """

    def __init__(self, *args: object, job_id: str, timeout: float) -> None:
        super().__init__(*args)
        self.job_id = job_id
        self.timeout = timeout


class OutcomeUnknown(CoordError):
    """A write was sent to the store and no answer came (the store stopped answering, or
    the session was lost while it was in flight): it may have been applied, or not.

    Raised by :meth:`coord.Queue.put`: the job may have been queued. A put with a
    ``job_id`` can be repeated safely: a put repeating a job id queues nothing more and
    returns the job (see :meth:`coord.Queue.put`). Raised by :meth:`coord.Queue.put_many`
    for a batch of jobs: those of :attr:`job_ids` may have been queued, those of
    :attr:`done` were, and the rest of the list was not.

    :ivar operation: what was sent (``"put"``, ``"put_many"``)
    :ivar job_id: the id of the job it concerns (for a batch: its first job's)
    :ivar job_ids: the ids of every job whose outcome is unknown (a put's: its one job)
    :ivar done: the :class:`coord.JobRef` of the jobs certainly queued before (put_many)
    :ivar outcome: always ``"unknown"`` (as :attr:`coord.ClaimLost.outcome` says it)
    """

    outcome = "unknown"

    def __init__(
        self,
        *args: object,
        operation: str,
        job_id: str | None = None,
        job_ids: tuple[str, ...] | None = None,
        done: tuple[Any, ...] = (),
    ) -> None:
        super().__init__(*args)
        self.operation = operation
        self.job_id = job_id
        self.job_ids: tuple[str, ...] = (
            job_ids if job_ids is not None else (job_id,) if job_id is not None else ()
        )
        self.done: tuple[Any, ...] = done


class LockedError(CoordError):
    """``try_acquire`` found the lock held by someone else."""


class NotOwnerError(CoordError, RuntimeError):
    """Release of a lock (or resignation of a leadership) that this task does not hold."""


class NotLeaderError(CoordError):
    """The operation needs leadership that this campaign does not hold."""


class NoLeaderError(CoordError):
    """The election has no leader."""


class ClosedError(CoordError, anyio.ClosedResourceError):
    """The client, session or backend was closed."""
