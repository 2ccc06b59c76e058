"""coord's gRPC transport for etcd: gRPC over HTTP/2 on a connection of its own, the part
of ``grpc.aio`` that the etcd backend uses (unary calls and bidirectional streams), on
anyio streams (so on asyncio and trio alike), under aetcd's generated stubs.

One concern per module: ``_frames`` cuts and checks the server's frames (no I/O);
``_link`` is what one HTTP/2 connection sends (streams, flow control both ways,
keepalive, the stall clock) and ``_connection`` what it receives (frames checked against
its state, HPACK, gRPC messages);
``_calls`` the unary and stream calls; ``_channel`` connects and reconnects;
``_encode`` and ``_status`` are what is sent and how calls end. Under the connection, a
pipe of bytes (``_pipe``): ``_stream``'s on an anyio stream (a reader and a writer task),
or on asyncio its own transport (``_asyncio``, the faster path there; ``_runtime``
chooses); ``_timers`` runs a channel's deadlines, pings and stall clocks in one task.

Why not grpc.aio: a call there costs a task, gRPC's C core with its threads and
completion queue, and a poller thread waking the event loop, several times this
transport's client CPU per call; a contended acquisition makes about three unary calls
and two stream writes (``docs/design/etcd-transport.md``, ``docs/benchmarks.md``).

What it speaks: the HTTP/2 framing of RFC 9113 that a gRPC client needs (HEADERS and
CONTINUATION, DATA, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, with flow control
both ways), HPACK (RFC 7541: requests as literals without indexing, so the encoder keeps
no state; responses decoded with the ``hpack`` package) and gRPC's length-prefixed
messages and status trailers. TLS (ALPN ``h2``) comes from anyio's TLS stream (asyncio's
own on its fast path). The server's
bytes are cut into frames and checked by :mod:`._frames` (no I/O); what needs the
connection's state (stream ids, windows, the PING in flight) by ``_connection``. Any break of
the rules is a connection error: the connection is dropped, its calls fail as UNAVAILABLE.

Its calls look like grpc.aio's to their users (aetcd's generated stubs make them through
:meth:`Channel.unary_unary` and :meth:`Channel.stream_stream`): a unary call is awaited
for its reply; a stream is written, read (:data:`EOF` at its end) and cancelled; a
failure raises :class:`RpcError`, a ``grpc.aio.AioRpcError`` with the status code.

A channel connects on its first call and again after the connection is lost; calls made
while it connects wait for it (a failed attempt fails them as UNAVAILABLE, and calls in
the next moment fail at once, as gRPC's do in its transient failure). While streams are
open it pings the server every *keepalive* seconds and drops a connection whose ping is
not answered in time: a paused or partitioned member fails its calls instead of hanging.
Writes wait while the pipe is paused (its buffer full: the server does not read);
answers to a flood of PING or SETTINGS frames are refused (``_link._MAX_ANSWERS``), and a
connection on which nothing can be sent for *stall_timeout* is dropped (see
``_link._Link._hold``). Each stream's receive window is given back as its reader takes
the replies (``_link._Link.credit``): a reader that stops holds at most a window.
"""

from __future__ import annotations

from ._calls import StreamCall, UnaryCall
from ._channel import Channel
from ._status import EOF, CallEnded, RpcError

__all__ = ["EOF", "CallEnded", "Channel", "RpcError", "StreamCall", "UnaryCall"]
