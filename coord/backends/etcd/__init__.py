"""The etcd backend (``etcd://``): :class:`EtcdBackend` (``_backend.py``) on coord's own
gRPC transport (``_grpc/``) under aetcd's generated messages. See ``_backend.py`` for the
lock algorithm, ``_waitqueue.py`` for the waiter keys' layout."""

from __future__ import annotations

from ._backend import EtcdBackend
from ._watch import WatchCompacted

__all__ = ["EtcdBackend", "WatchCompacted"]
