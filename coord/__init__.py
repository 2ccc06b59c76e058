"""coord: async coordination on etcd and ZooKeeper watches.

A fair-queue distributed mutex with fencing tokens (``async with client.mutex(name)``),
leader election, group membership, a semaphore and a read-write lock, a job queue, fenced writes
(:func:`fenced_put`, :func:`fenced_update`), written once against a small backend
contract (:mod:`coord.abc`) that the memory, etcd and ZooKeeper backends implement.
"""

from __future__ import annotations

from ._client import Client as Client
from ._client import ClientStatistics as ClientStatistics
from ._client import connect as connect
from ._core.exceptions import (
    BackendError,
    BackendUnavailable,
    ClaimLost,
    ClosedError,
    ConfigurationError,
    CoordError,
    EntryGoneError,
    JobNotFound,
    JobTimeout,
    LeadershipLost,
    LockedError,
    LockLost,
    MembershipLost,
    NoLeaderError,
    NotLeaderError,
    NotOwnerError,
    OutcomeUnknown,
    PartitionLost,
    ResyncNeeded,
    SessionExpiredError,
)
from ._core.stats import Histogram
from ._election.election import Campaign, Election, Term
from ._election.leader import Leader
from ._jobs.queue import Claiming, KeyStats, Queue, QueueStats
from ._jobs.records import DeadLetter, Job, JobRef, NewJob
from ._jobs.worker import RunStats
from ._locks.fencing import fenced_put, fenced_update, fenced_update_sql
from ._locks.hold import Hold
from ._locks.mutex import Mutex, MutexStatistics
from ._locks.rwlock import RWLock, RWLockSide
from ._locks.semaphore import Semaphore
from ._membership.group import Group, Joining, Member, Membership
from ._membership.member import Owning
from ._membership.owner import Assignment, Owner, OwnerStatistics
from ._membership.partition import PartitionHold
from ._membership.partitioner import Partitioner
from ._sessions.identity import Waiter
from ._sessions.session import Session

__all__ = [
    "Assignment",
    "BackendError",
    "BackendUnavailable",
    "Campaign",
    "ClaimLost",
    "Claiming",
    "Client",
    "ClientStatistics",
    "ClosedError",
    "ConfigurationError",
    "CoordError",
    "DeadLetter",
    "Election",
    "EntryGoneError",
    "Group",
    "Histogram",
    "Hold",
    "Job",
    "JobNotFound",
    "JobRef",
    "JobTimeout",
    "Joining",
    "KeyStats",
    "Leader",
    "LeadershipLost",
    "LockLost",
    "LockedError",
    "Member",
    "Membership",
    "MembershipLost",
    "Mutex",
    "MutexStatistics",
    "NewJob",
    "NoLeaderError",
    "NotLeaderError",
    "NotOwnerError",
    "OutcomeUnknown",
    "Owner",
    "OwnerStatistics",
    "Owning",
    "PartitionHold",
    "PartitionLost",
    "Partitioner",
    "Queue",
    "QueueStats",
    "RWLock",
    "RWLockSide",
    "ResyncNeeded",
    "RunStats",
    "Semaphore",
    "Session",
    "SessionExpiredError",
    "Term",
    "Waiter",
    "connect",
    "fenced_put",
    "fenced_update",
    "fenced_update_sql",
]

__version__ = "0.1.0"

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "coord").startswith("coord."):
        _obj.__module__ = "coord"
del _name, _obj
