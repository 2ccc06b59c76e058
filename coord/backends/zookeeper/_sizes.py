"""The size of a request in ZooKeeper's wire format (jute), measured before it is sent.

The server reads a packet's length first and drops the connection of a client whose
packet is longer than its ``jute.maxbuffer`` (1 MiB by default): the session is
SUSPENDED, and by coord's default policy every hold of the client is void. So a request
that could be too long is refused here, with ConfigurationError, and never sent.

Jute writes an int as 4 bytes and a string or a buffer as a 4-byte length and its bytes;
a packet is the request header (xid and opcode) and the request (kazoo's
``protocol.serialization``: the unit tests check these sums against it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...abc import Create, Put, Update
from .._common.limits import check_request

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ...abc import Op
    from ._paths import Paths

__all__ = ["RequestSizes"]

_INT = 4
_HEADER = 2 * _INT  # xid, opcode
_MULTI_HEADER = 2 * _INT + 1  # opcode, done, error: before each op, and once at the end


def _string(text: str) -> int:
    return _INT + len(text.encode())


def _buffer(data: bytes) -> int:
    return _INT + len(data)


class RequestSizes:
    """Checks the requests of one backend (its root, its nodes' ACL) against *limit*."""

    def __init__(self, paths: Paths, acl: Sequence[Any], limit: int) -> None:
        self._paths = paths
        self._limit = limit
        # The ACL list: a count, then (perms, scheme, id) per entry.
        self._acl = _INT + sum(_INT + _string(a.id.scheme) + _string(a.id.id) for a in acl)

    def create(self, path: str, value: bytes) -> int:
        """A create (or createContainer) of *path* with *value*, without its header."""
        return _string(path) + _buffer(value) + self._acl + _INT  # + flags

    @staticmethod
    def set_data(path: str, value: bytes) -> int:
        return _string(path) + _buffer(value) + _INT  # + version

    @staticmethod
    def guard(path: str) -> int:
        """A delete or a check: the path and a version."""
        return _string(path) + _INT

    def check_write(self, key: str, value: bytes, what: str, *, suffix: str = "") -> None:
        """Refuse a create or set of *key* (its path plus *suffix*) with *value*."""
        size = _HEADER + self.create(self._paths.path(key) + suffix, value)
        check_request(size, self._limit, f"ZooKeeper {what}")

    def check_multi(self, ops: Sequence[Op]) -> None:
        """Refuse the multi request of *ops* (see :mod:`._multi`); a Put counts as a
        create, the larger of the two requests it may be sent as."""
        size = _HEADER + _MULTI_HEADER
        for op in ops:
            if isinstance(op, Create):
                body = self.create(self._paths.path(op.prefix + op.waiter_id) + "-", op.value)
            elif isinstance(op, Put):
                body = self.create(self._paths.path(op.key), op.value)
            elif isinstance(op, Update):
                body = self.set_data(self._paths.path(op.entry.key), op.value)
            else:  # a Remove or a Check
                body = self.guard(self._paths.path(op.entry.key))
            size += _MULTI_HEADER + body
        check_request(size, self._limit, "ZooKeeper transact")
