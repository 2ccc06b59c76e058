"""Fenced writes: make a write conditional on still holding the lock.

A lock alone cannot stop a holder that was paused past its TTL from writing after its
successor (Kleppmann 2016). The resource must refuse it. Two ways, by where the data is:

* in the same store as the lock: :func:`fenced_put`, one transaction guarded by the
  holder's own key (etcd's ``IsOwner()`` compare; a ZooKeeper ``multi`` with ``check``).
  It succeeds only while that key exists, and the key is gone before anyone else can
  hold the lock;
* anywhere else, e.g. a SQL database: :func:`fenced_update`, an ``UPDATE`` that also
  requires the row's fence column to be at most ``hold.fence`` and stores it. Fences
  strictly increase from holder to holder, so once a newer holder has written, every
  write of an older one is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .._core.checks import check_int, check_size, check_str, check_type
from .._core.exceptions import ConfigurationError
from .._core.keys import check_name
from ..abc import Check, Put
from .hold import Hold

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Cursor", "fenced_put", "fenced_update", "fenced_update_sql"]

#: PEP 249 ``paramstyle`` values.
ParamStyle = Literal["qmark", "numeric", "named", "format", "pyformat"]

# Identifiers are written into the statement: allow only plain (optionally dotted) names.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?\Z")


async def fenced_put(hold: Hold, key: str, value: bytes) -> None:
    """Write *key* in the lock's own store, only while *hold* still holds the lock.

    One transaction: "if the holder's key still exists (same creation revision), set
    *key* to *value*". The store checks it when it applies the write, so a holder that
    was paused, cut off or expired can never overwrite what its successor wrote: its key
    was deleted before the successor was granted the lock. This holds only for keys in
    the same store (the same etcd cluster or ZooKeeper ensemble, under the client's
    namespace) as the lock; for anything else send ``hold.fence`` (see
    :func:`fenced_update`). On ZooKeeper, never write to a key that is also the name (or
    a parent of the name) of another lock, election or queue: those nodes are containers
    that the server deletes once they are empty, and the value with them.

    Works with any hold: a mutex's, a semaphore slot, a side of a read-write lock, an
    election's term. A checkpoint. Not repeated after a lost reply: if it raises
    :exc:`coord.BackendUnavailable` (or is cancelled while in flight), the write may or
    may not have happened.

    :param hold: the hold that must still be held
    :param key: a plain key (no segment starting with ``@``), relative to the namespace
    :param value: the value to write
    :raises LockLost: if the hold was released or lost (nothing was sent), or the store
        refused the write because the holder's key is gone (nothing was written); for an
        election's term, :exc:`coord.LeadershipLost`
    :raises TypeError: if *hold* is not a :class:`coord.Hold`, *key* not a str or
        *value* not bytes
    :raises ConfigurationError: for a key that is not a valid name, is the lock's own
        name or one of its parents, or a waiter key, or a value larger than the store
        takes (``backend.max_value_size``): nothing is sent
    """
    check_type(hold, Hold, "fenced_put: hold", "a coord.Hold")
    check_name(key, what="fenced_put key")
    value = check_size(value, hold.session.backend.max_value_size, "fenced_put value")
    if hold.name == key or hold.name.startswith(key + "/"):
        # On ZooKeeper that node is a container the server deletes once the lock is
        # idle: the write would be lost. Refused on every store, so code stays portable.
        raise ConfigurationError(
            f"fenced_put key {key!r} is the lock {hold.name!r} or a parent of it: write "
            f"under a key of its own, e.g. {hold.name + '/state'!r}"
        )
    if hold.released or hold.lost:
        raise hold._lost_error(
            f"{hold.name!r} (fence {hold.fence}) is no longer held: not writing {key!r}"
        )
    backend = hold.session.backend
    if await backend.transact([Check(hold.entry), Put(key, value)]) is None:
        raise hold._lost_error(
            f"{hold.name!r} (fence {hold.fence}) was lost: the store refused the write of "
            f"{key!r} (the holder's key is gone)"
        )


class Cursor(Protocol):
    """The part of a PEP 249 (DB-API 2.0) cursor that :func:`fenced_update` uses."""

    @property
    def rowcount(self) -> int: ...

    def execute(self, operation: Any, parameters: Any = ..., /) -> Any: ...


def fenced_update_sql(
    table: str,
    values: Mapping[str, object],
    *,
    where: Mapping[str, object],
    fence: int,
    fence_column: str = "fence",
    paramstyle: ParamStyle = "qmark",
) -> tuple[str, Sequence[object] | dict[str, object]]:
    """Build the fenced ``UPDATE``: ``UPDATE table SET col = ?, ..., fence = ? WHERE
    key = ? AND ... AND fence <= ?``, and its parameters.

    It changes the row only if no holder with a higher fence has written it, and records
    *fence* in it, so that from then on every older holder's write is refused. ``<=`` (not
    ``<``) lets one holder write the same row more than once. The fence column must be
    ``NOT NULL`` (start it at 0) and 64 bits wide (``BIGINT``; SQLite's ``INTEGER``).

    Identifiers (*table*, column names) are written into the statement and must be plain
    names (``[A-Za-z_][A-Za-z0-9_]*``, one dot allowed); values are always parameters.

    :param table: the table to update
    :param values: the columns to set and their values
    :param where: the columns that identify the row(s), compared with ``=``
    :param fence: the holder's fence, ``hold.fence``
    :param fence_column: the column that keeps the highest fence written
    :param paramstyle: the driver's PEP 249 ``paramstyle`` (``sqlite3.paramstyle`` is
        ``"qmark"``, psycopg's ``"pyformat"``)
    :returns: ``(sql, parameters)``, for ``cursor.execute(sql, parameters)``
    :raises TypeError: for an identifier that is not a str, *values* or *where* that is
        not a mapping, or a *fence* that is not an int
    :raises ConfigurationError: for a bad identifier, an empty *where*, a column named
        twice, or an unknown *paramstyle*
    """
    _check_types(values, where, fence)
    if not where:
        raise ConfigurationError("fenced_update: 'where' must name the row")
    if fence_column in values or fence_column in where:
        raise ConfigurationError(f"fenced_update: {fence_column!r} is set by the fence")
    for name in (table, fence_column, *values, *where):
        if not _IDENTIFIER.match(check_str(name, "fenced_update: a SQL name")):
            raise ConfigurationError(f"fenced_update: not a plain SQL name: {name!r}")
    ordered = [*values.values(), fence, *where.values(), fence]
    # Parameter names by position (p1, p2...): a column name may hold a dot.
    params = [(f"p{i}", value) for i, value in enumerate(ordered, 1)]
    marks = [_marker(paramstyle, name, i) for i, (name, _) in enumerate(params, 1)]
    sets = [f"{c} = {m}" for c, m in zip([*values, fence_column], marks, strict=False)]
    tests = [f"{c} = {m}" for c, m in zip(where, marks[len(values) + 1 :], strict=False)]
    tests.append(f"{fence_column} <= {marks[-1]}")
    sql = f"UPDATE {table} SET {', '.join(sets)} WHERE {' AND '.join(tests)}"
    if paramstyle in ("named", "pyformat"):
        return sql, dict(params)
    return sql, [value for _, value in params]


def _check_types(values: object, where: object, fence: object) -> None:
    check_type(values, Mapping, "fenced_update: values", "a mapping of columns to values")
    check_type(where, Mapping, "fenced_update: where", "a mapping of columns to values")
    check_int(fence, "fenced_update: fence")


def _marker(paramstyle: str, name: str, position: int) -> str:
    markers = {
        "qmark": "?",
        "numeric": f":{position}",
        "named": f":{name}",
        "format": "%s",
        "pyformat": f"%({name})s",
    }
    try:
        return markers[paramstyle]
    except KeyError:
        raise ConfigurationError(f"fenced_update: unknown paramstyle {paramstyle!r}") from None


def fenced_update(
    cursor: Cursor,
    table: str,
    values: Mapping[str, object],
    *,
    where: Mapping[str, object],
    fence: int,
    fence_column: str = "fence",
    paramstyle: ParamStyle = "qmark",
) -> int:
    """Run the fenced ``UPDATE`` of :func:`fenced_update_sql` on a DB-API *cursor*.

    Returns the number of rows changed: 0 means that a holder with a higher fence has
    written the row (or that no row matches *where*); the caller's lock is then stale.
    Synchronous, as DB-API cursors are (run it with ``anyio.to_thread.run_sync`` if the
    driver blocks); the caller commits.

    Example, with the standard library's sqlite3::

        changed = coord.fenced_update(
            db.cursor(), "orders", {"status": "paid"}, where={"id": 42}, fence=hold.fence
        )
        if not changed:
            raise RuntimeError("a newer holder wrote order 42")

    Parameters as for :func:`fenced_update_sql`.
    """
    sql, params = fenced_update_sql(
        table,
        values,
        where=where,
        fence=fence,
        fence_column=fence_column,
        paramstyle=paramstyle,
    )
    cursor.execute(sql, params)
    return cursor.rowcount
