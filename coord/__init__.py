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
from ._election import Campaign as Campaign
from ._election import Election as Election
from ._election import Term as Term
from ._exceptions import BackendError as BackendError
from ._exceptions import BackendUnavailable as BackendUnavailable
from ._exceptions import ClaimLost as ClaimLost
from ._exceptions import ClosedError as ClosedError
from ._exceptions import ConfigurationError as ConfigurationError
from ._exceptions import CoordError as CoordError
from ._exceptions import EntryGoneError as EntryGoneError
from ._exceptions import JobNotFound as JobNotFound
from ._exceptions import LeadershipLost as LeadershipLost
from ._exceptions import LockedError as LockedError
from ._exceptions import LockLost as LockLost
from ._exceptions import MembershipLost as MembershipLost
from ._exceptions import NoLeaderError as NoLeaderError
from ._exceptions import NotLeaderError as NotLeaderError
from ._exceptions import NotOwnerError as NotOwnerError
from ._exceptions import OutcomeUnknown as OutcomeUnknown
from ._exceptions import PartitionLost as PartitionLost
from ._exceptions import ResyncNeeded as ResyncNeeded
from ._exceptions import SessionExpiredError as SessionExpiredError
from ._fencing import fenced_put as fenced_put
from ._fencing import fenced_update as fenced_update
from ._fencing import fenced_update_sql as fenced_update_sql
from ._group import Group as Group
from ._group import Joining as Joining
from ._group import Member as Member
from ._group import Membership as Membership
from ._hold import Hold as Hold
from ._jobs import DeadLetter as DeadLetter
from ._jobs import Job as Job
from ._jobs import JobRef as JobRef
from ._leader import Leader as Leader
from ._mutex import Mutex as Mutex
from ._mutex import MutexStatistics as MutexStatistics
from ._owner import Assignment as Assignment
from ._owner import Owner as Owner
from ._owner import OwnerStatistics as OwnerStatistics
from ._owning import Owning as Owning
from ._partition import PartitionHold as PartitionHold
from ._partitioner import Partitioner as Partitioner
from ._queue import Claiming as Claiming
from ._queue import KeyStats as KeyStats
from ._queue import Queue as Queue
from ._queue import QueueStats as QueueStats
from ._rwlock import RWLock as RWLock
from ._rwlock import RWLockSide as RWLockSide
from ._semaphore import Semaphore as Semaphore
from ._session import Session as Session
from ._stats import Histogram as Histogram
from ._waiters import Waiter as Waiter

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
