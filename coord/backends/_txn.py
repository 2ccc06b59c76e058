"""What every backend checks before a transaction (:meth:`coord.abc.Backend.transact`),
so that a bad one fails the same way everywhere, before anything is sent."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _keys
from .._exceptions import ConfigurationError
from ..abc import Check, Create, Put, Remove, Update

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..abc import Op

__all__ = ["check_ops", "check_value"]


def check_value(value: object, limit: int, what: str) -> None:
    """Refuse a value that is not bytes (TypeError) or is larger than *limit* bytes."""
    if not isinstance(value, bytes):
        raise TypeError(f"{what}: the value must be bytes, not {type(value).__name__}")
    if len(value) > limit:
        raise ConfigurationError(
            f"{what}: the value is {len(value):,} bytes; this store takes at most {limit:,}"
        )


def check_ops(ops: Sequence[Op], limit: int) -> None:
    """Refuse a transaction that the contract does not allow (see ``transact``)."""
    if not ops:
        raise ConfigurationError("transact: no operations")
    seen: set[str] = set()
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
        seen.add(key)
        check_value(value, limit, f"transact on {key!r}")
