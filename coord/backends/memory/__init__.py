"""The in-process store (``memory://``): etcd's semantics in pure anyio, for tests and
examples. :class:`MemoryBackend` (``_backend.py``) on a shared :class:`MemoryStore`
(``_store.py``)."""

from __future__ import annotations

from ._backend import MemoryBackend
from ._store import MemoryStore

__all__ = ["MemoryBackend", "MemoryStore"]
