"""An etcd lease kept alive on a LeaseKeepAlive stream (clientv3's model)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
from aetcd import rpc

from ..._core.exceptions import BackendUnavailable, SessionExpiredError
from .._common.keepalive import KeptAliveLease
from ._connection import finish, stream_read, stream_write, translate
from ._grpc import RpcError

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ["EtcdLease", "grant"]

_log = logging.getLogger("coord.backends.etcd")


async def grant(conn: Connection, ttl: float) -> EtcdLease:
    """Grant a lease of *ttl* seconds (rounded up; etcd may raise it to its minimum).

    The deadline runs from the send time of the attempt that was answered: a grant
    retried while the store was down must not start out (nearly) expired.
    """
    request = rpc.LeaseGrantRequest(TTL=max(1, int(-(-ttl // 1))), ID=0)
    answer = await conn.call_answer("lease grant", lambda c: c.lease.LeaseGrant, request)
    reply = answer.reply
    if reply.error:
        raise SessionExpiredError(f"etcd lease grant: {reply.error}")
    return EtcdLease(conn, reply.ID, float(reply.TTL), sent_at=answer.sent)


class EtcdLease(KeptAliveLease):
    """A lease whose keepalives go out on one bidirectional stream, replies in order."""

    def __init__(self, conn: Connection, lease_id: int, ttl: float, *, sent_at: float) -> None:
        super().__init__(lease_id, ttl, sent_at=sent_at)
        self._conn = conn
        self._call: Any = None
        self._generation = conn.generation

    async def _refresh(self) -> float:
        self._generation = generation = self._conn.generation
        token = self._conn.token
        try:
            if self._call is None:
                metadata = self._conn.metadata(require_leader=True)
                self._call = self._conn.lease.LeaseKeepAlive(metadata=metadata)
            await stream_write(self._call, rpc.LeaseKeepAliveRequest(ID=self.id))
            reply = await stream_read(self._call)
            # Only a reply for our lease says whether it lives (etcd answers a lease it
            # no longer has with its id and TTL 0); any other, such as an empty message
            # (ID 0, TTL 0), is not about it. clientv3 drops those too (recvKeepAlive).
            while reply.ID != self.id:
                _log.debug("lease %#x: a keepalive reply for lease %#x ignored", self.id, reply.ID)
                reply = await stream_read(self._call)
        except BackendUnavailable:
            await self._drop_call()
            raise
        except RpcError as exc:
            await self._drop_call()
            await self._conn.recover(exc, generation, token)
            raise translate(exc, "lease keepalive") from exc
        except BaseException:
            # Cancelled mid-exchange (the local deadline passed): the stream may hold a
            # reply we will never read, so it cannot be reused.
            with anyio.CancelScope(shield=True):
                await self._drop_call()
            raise
        return float(reply.TTL)

    async def _unanswered(self) -> None:
        # No reply within ttl / 3: this member hangs (SIGSTOPped, partitioned without a
        # reset). Another member may answer: move there while the lease still lives.
        await self._drop_call()
        await self._conn.failover(self._generation)

    async def _stopped(self) -> None:
        await self._drop_call()

    async def _drop_call(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            finish(call)

    async def _revoke(self) -> None:
        await self._drop_call()
        request = rpc.LeaseRevokeRequest(ID=self.id)
        try:
            await self._conn.call("lease revoke", lambda c: c.lease.LeaseRevoke, request)
        except SessionExpiredError:
            pass  # already gone
