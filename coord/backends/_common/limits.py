"""What every backend checks before a request, so that a bad one fails the same way
everywhere, before anything is sent: the operations of a transaction
(:meth:`coord.abc.Backend.transact`), a value's size, a key's size, and the size of the
whole request as the store encodes it (each backend measures its own; the memory store
estimates one that is at least ZooKeeper's).

A request over the server's limit is no mere error there: ZooKeeper drops the connection
of a client that sends a packet over its ``jute.maxbuffer``, and with it every hold of
the client (the SUSPENDED policy). So no request is sent that could be.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._core import keys as _keys
from ..._core.exceptions import ConfigurationError
from ...abc import Backend, Check, Create, Put, Remove, Update

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ...abc import Op

__all__ = [
    "MAX_KEY_SIZE",
    "MAX_OPS",
    "check_key",
    "check_ops",
    "check_request",
    "check_value",
    "estimate",
]

#: The longest key a backend takes, in bytes (UTF-8, without the namespace): twice what
#: the longest name (512 characters of up to 4 bytes) with coord's suffixes needs.
MAX_KEY_SIZE = 4096
#: The most operations one transaction may have (:attr:`coord.abc.Backend.max_ops`):
#: etcd refuses more than 128 compares (``--max-txn-ops``), and an Update or a Remove is
#: two of them there.
MAX_OPS = Backend.max_ops
# Per operation, at least what any store's encoding adds to its key and value (ZooKeeper:
# a multi header, lengths, version, flags and the ACL "world anyone").
_OP_OVERHEAD = 64


def check_value(value: object, limit: int, what: str) -> None:
    """Refuse a value that is not bytes (TypeError) or is larger than *limit* bytes."""
    if not isinstance(value, bytes):
        raise TypeError(f"{what}: the value must be bytes, not {type(value).__name__}")
    if len(value) > limit:
        raise ConfigurationError(
            f"{what}: the value is {len(value):,} bytes; this store takes at most {limit:,}"
        )


def check_key(key: str, what: str) -> str:
    """Refuse a key over :data:`MAX_KEY_SIZE` bytes; return it."""
    if len(key) * 4 > MAX_KEY_SIZE and len(key.encode()) > MAX_KEY_SIZE:
        raise ConfigurationError(
            f"{what}: the key {key[:60]!r}... is {len(key.encode()):,} bytes; keys take at "
            f"most {MAX_KEY_SIZE:,}"
        )
    return key


def check_request(size: int, limit: int, what: str) -> None:
    """Refuse a request of *size* bytes (as the store encodes it) over *limit*."""
    if size > limit:
        raise ConfigurationError(
            f"{what}: the request would be {size:,} bytes (keys and values together); "
            f"this store takes at most {limit:,} per request"
        )


def estimate(items: Sequence[tuple[str, bytes]]) -> int:
    """The size of a request writing or guarding each ``(key, value)`` of *items*, at
    least as ZooKeeper encodes it (a root's path aside): for the memory store, so that
    what it takes the real stores take too."""
    return sum(len(key.encode()) + len(value) + _OP_OVERHEAD for key, value in items)


def check_ops(ops: Sequence[Op], limit: int) -> list[tuple[str, bytes]]:
    """Refuse a transaction that the contract does not allow (see ``transact``); return
    the key and the value of each op (``b""`` for a guard)."""
    if not ops:
        raise ConfigurationError("transact: no operations")
    if len(ops) > MAX_OPS:
        raise ConfigurationError(
            f"transact: {len(ops)} operations; a transaction takes at most {MAX_OPS}"
        )
    seen: dict[str, bytes] = {}
    for op in ops:
        if isinstance(op, Create):
            if not op.prefix.endswith("/") or not _keys.is_waiter(op.prefix + op.waiter_id):
                raise ConfigurationError(
                    f"transact: Create needs a prefix ending in '/' and a waiter id starting "
                    f"with '@' without '/', got {op.prefix!r} + {op.waiter_id!r}"
                )
            key, value = op.prefix + op.waiter_id, op.value
        elif isinstance(op, Put):
            _keys.check_plain_key(op.key, "transact: Put")
            key, value = op.key, op.value
        elif isinstance(op, Update | Remove | Check):
            key, value = op.entry.key, op.value if isinstance(op, Update) else b""
            if not _keys.is_waiter(key) or op.entry.provisional:
                raise ConfigurationError(
                    f"transact: {type(op).__name__} needs a registered waiter entry, got {key!r}"
                )
        else:
            raise ConfigurationError(f"transact: not an operation: {op!r}")
        if key in seen:
            raise ConfigurationError(f"transact: {key!r} is used twice")
        check_value(value, limit, f"transact on {key!r}")
        seen[check_key(key, "transact")] = value
    return list(seen.items())
