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
means "create it" (and then "node exists" means "set it").

A multi that creates ephemeral nodes is sent only on the lease's own session (an expired
one may have been replaced under us: then nothing is sent and SessionExpiredError is
raised), so its nodes are the lease's. Their czxid is the multi's zxid, which the
answer's header tells (and the stat of a set in the same multi); only an answer without
one reads its new nodes back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kazoo import exceptions as kz

from ..._core.exceptions import BackendError, SessionExpiredError
from ...abc import Check, Create, Entry, Put, Update
from ._paths import fence_of_name
from ._waitqueue import committing, entry_of
from ._wire import check_op, create_op, delete_op, set_data_op

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from ...abc import Lease, Op
    from ._connection import Connection
    from ._nodes import Nodes
    from ._paths import Paths
    from ._waitqueue import WaitQueues
    from ._wire import WireClient

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
            sent_on: list[int] = []
            request = _on_session(committing(self._build(ops, creating)), owners, sent_on)
            results = await self._conn.call("transact", request)
            if results is None:
                raise SessionExpiredError(
                    "ZooKeeper transaction: not sent, the lease's session is over"
                )
            failed = [(i, r) for i, r in enumerate(results) if isinstance(r, Exception)]
            if not failed:
                return await self._results(ops, results, owners, sent_on[-1])
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
        self, ops: Sequence[Op], results: list[Any], owners: dict[int, int], session: int
    ) -> tuple[Entry | None, ...]:
        known = self._known(ops, results, owners, session)
        if known is not None:
            return known
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

    def _known(
        self, ops: Sequence[Op], results: list[Any], owners: dict[int, int], session: int
    ) -> tuple[Entry | None, ...] | None:
        """The entries of a committed multi without reading its new nodes back: every
        operation of a multi is one transaction with one zxid, which the answer's header
        carries (:class:`~._wire.MultiResults`), as does a set's stat (its ``mzxid``); it
        is the czxid of the nodes the multi created, and an ephemeral one belongs to the
        session the multi was sent on (:func:`_on_session`). None when the answer told no
        zxid: the caller reads.

        Reading back is not only a request more: a worker may claim and ack a new job
        before the read, and a put that was done would be told "unknown"."""
        zxid = getattr(results, "zxid", 0) or next(
            (r.mzxid for op, r in zip(ops, results, strict=True) if isinstance(op, Update)), 0
        )
        if not zxid:
            return None
        out: list[Entry | None] = []
        for i, (op, result) in enumerate(zip(ops, results, strict=True)):
            if isinstance(op, Create):
                key = self._paths.key(result[0])
                revision = fence_of_name(key.rpartition("/")[2]) or zxid
                lease = session if i in owners else 0
                out.append(Entry(key, op.value, revision, 0, lease))
            elif isinstance(op, Update):
                out.append(entry_of(op.entry.key, op.value, result))
            else:
                out.append(None)
        return tuple(out)


def _on_session(
    commit: Callable[[WireClient], Awaitable[list[Any]]],
    owners: dict[int, int],
    sent_on: list[int],
) -> Callable[[WireClient], Awaitable[list[Any] | None]]:
    """*commit*, sent only on the session that must own its ephemeral nodes; the session
    it was sent on is appended to *sent_on*.

    A client's session never changes (a new session is a new client), and ZooKeeper
    makes an ephemeral node the node of the session whose connection created it: a multi
    answered on the owners' session made its nodes theirs. On another session (the
    lease's expired and the connection has a new one) nothing is sent, and the request
    returns None: it would create nodes nobody's lease stands for.
    """

    async def request(client: WireClient) -> list[Any] | None:
        session = client.session_id
        if any(owner != session for owner in owners.values()):
            return None
        sent_on.append(session)
        return await commit(client)

    return request
