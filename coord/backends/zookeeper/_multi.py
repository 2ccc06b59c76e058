"""``Backend.transact`` on ZooKeeper: one ``multi`` request.

* :class:`~coord.abc.Create` is a SEQUENTIAL create (ephemeral when bound to the lease)
  named ``<waiter id>-`` like a registered waiter, so that listings order it with them;
* :class:`~coord.abc.Update` is ``setData(path, value, version)`` and
  :class:`~coord.abc.Remove` is ``delete(path, version)``: a waiter's path carries a
  one-time GUID, so the node at that path can only be that entry, and its data version
  is the rest of the guard;
* :class:`~coord.abc.Check` is ``check(path, -1)``: the node exists (any version);
* :class:`~coord.abc.Put` is ``setData(path, value, -1)``, or ``create`` when the node is
  missing (a multi cannot "create or set": the first answer says which to send).

A multi fails as a whole, and the answer names the operation that failed: "no node" or "bad
version" on an Update, Remove or Check is a failed guard (None); "no node" on a Create is a
missing parent (a container the server reaped), created before trying again; on a Put it
means "create it" (and then "node exists" means "set it"). The new
nodes are read once after the commit (pipelined): for their czxid, and to check that an
ephemeral one belongs to the lease's session (an expired session may have been replaced
under us: such a node is deleted and SessionExpiredError raised).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kazoo import exceptions as kz

from ..._core.exceptions import BackendError, SessionExpiredError
from ...abc import Check, Create, Entry, Put, Update
from ._waitqueue import committing, entry_of
from ._wire import check_op, create_op, delete_op, set_data_op

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ...abc import Lease, Op
    from ._connection import Connection
    from ._nodes import Nodes
    from ._paths import Paths
    from ._waitqueue import WaitQueues

__all__ = ["Transactions"]

_PARENT_ATTEMPTS = 5


class Transactions:
    """The multi requests of one backend."""

    def __init__(self, conn: Connection, nodes: Nodes, paths: Paths, queues: WaitQueues) -> None:
        self._conn = conn
        self._nodes = nodes
        self._paths = paths
        self._queues = queues

    def _build(self, ops: Sequence[Op], creating: set[int]) -> list[Any]:
        built = []
        for i, op in enumerate(ops):
            if isinstance(op, Create):
                path = self._paths.path(op.prefix + op.waiter_id) + "-"
                ephemeral = op.lease is not None
                built.append(
                    create_op(path, op.value, self._conn.acl, ephemeral=ephemeral, sequence=True)
                )
            elif isinstance(op, Put) and i in creating:
                built.append(create_op(self._paths.path(op.key), op.value, self._conn.acl))
            elif isinstance(op, Put):
                built.append(set_data_op(self._paths.path(op.key), op.value, -1))
            elif isinstance(op, Check):
                built.append(check_op(self._paths.path(op.entry.key), -1))
            elif isinstance(op, Update):
                path = self._paths.path(op.entry.key)
                built.append(set_data_op(path, op.value, op.entry.version))
            else:
                built.append(delete_op(self._paths.path(op.entry.key), op.entry.version))
        return built

    async def transact(
        self, ops: Sequence[Op], session_of: Callable[[Lease], int]
    ) -> tuple[Entry | None, ...] | None:
        owners = {
            i: session_of(op.lease)
            for i, op in enumerate(ops)
            if isinstance(op, Create) and op.lease
        }
        creating: set[int] = set()  # the Puts to send as creates
        for _ in range(_PARENT_ATTEMPTS):
            # Not repeated after a connection loss: BackendUnavailable (outcome unknown).
            results = await self._conn.call("transact", committing(self._build(ops, creating)))
            failed = [(i, r) for i, r in enumerate(results) if isinstance(r, Exception)]
            if not failed:
                return await self._results(ops, results, owners)
            real = [(i, r) for i, r in failed if not isinstance(r, kz.RolledBackError)]
            index, error = real[0] if real else failed[0]
            op = ops[index]
            if isinstance(op, Put) and isinstance(error, kz.NodeExistsError):
                creating.discard(index)  # created in between: set it
                continue
            if isinstance(op, Put) and isinstance(error, kz.NoNodeError):
                if index in creating:
                    await self._nodes.ensure_parents(self._paths.path(op.key))
                creating.add(index)
                continue
            if isinstance(op, Create) and isinstance(error, kz.NoNodeError):
                await self._nodes.ensure_parents(self._paths.path(op.prefix + op.waiter_id))
                continue
            if isinstance(error, kz.NoNodeError | kz.BadVersionError | kz.NotEmptyError):
                return None  # a guard failed
            raise BackendError(f"ZooKeeper transaction: {type(error).__name__} {error}")
        raise BackendError("ZooKeeper transaction: a parent keeps disappearing")

    async def _results(
        self, ops: Sequence[Op], results: list[Any], owners: dict[int, int]
    ) -> tuple[Entry | None, ...]:
        created = {
            i: self._paths.key(result[0])
            for i, result in enumerate(results)
            if isinstance(ops[i], Create)
        }
        keys = list(created.values())
        read = dict(zip(keys, await self._queues.read("", keys), strict=True))
        out: list[Entry | None] = []
        stolen = []
        for i, (op, result) in enumerate(zip(ops, results, strict=True)):
            if isinstance(op, Create):
                entry = read[created[i]]
                if entry is None or entry.lease != owners.get(i, 0):
                    stolen.append(entry)
                    out.append(None)
                else:
                    out.append(
                        Entry(entry.key, op.value, entry.revision, entry.version, entry.lease)
                    )
            elif isinstance(op, Update):
                out.append(entry_of(op.entry.key, op.value, result))
            else:
                out.append(None)
        if stolen:
            for entry in stolen:
                if entry is not None:
                    await self._queues.delete_path(self._paths.path(entry.key))
            raise SessionExpiredError(
                "ZooKeeper transaction: the session expired under it (its new nodes are gone)"
            )
        return tuple(out)
