"""gRPC's outcomes as the calls report them: :class:`RpcError` (grpc.aio's exception,
so aetcd's callers and coord's translation at the boundary read it as they would
grpc.aio's), the end-of-stream marker, and the mappings of HTTP/2 reset codes and HTTP
statuses to gRPC codes."""

from __future__ import annotations

import grpc

__all__ = [
    "CODES",
    "EOF",
    "HTTP_CODES",
    "OK",
    "RESET_CODES",
    "UNAVAILABLE",
    "CallEnded",
    "RpcError",
    "percent_decoded",
]

#: What a stream's read returns at its end (grpc.aio's own marker).
EOF = grpc.aio.EOF

#: RST_STREAM error codes -> gRPC codes (gRPC's HTTP/2 transport mapping).
RESET_CODES = {
    7: grpc.StatusCode.UNAVAILABLE,  # REFUSED_STREAM: not processed, safe to repeat
    8: grpc.StatusCode.CANCELLED,
    11: grpc.StatusCode.RESOURCE_EXHAUSTED,  # ENHANCE_YOUR_CALM
    12: grpc.StatusCode.PERMISSION_DENIED,  # INADEQUATE_SECURITY
}
#: HTTP statuses of a response that is not gRPC's -> gRPC codes (gRPC's mapping).
HTTP_CODES = {
    400: grpc.StatusCode.INTERNAL,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.UNIMPLEMENTED,
    429: grpc.StatusCode.UNAVAILABLE,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.UNAVAILABLE,
}
CODES = {code.value[0]: code for code in grpc.StatusCode}
OK = grpc.StatusCode.OK
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


class CallEnded(Exception):
    """A stream's write or read after the call has ended (grpc.aio raises asyncio's
    InvalidStateError, which is asyncio's own; this transport runs on any event loop)."""


class RpcError(grpc.aio.AioRpcError):  # type: ignore[misc]
    """A call's failure: its gRPC status code and details."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def percent_decoded(value: bytes) -> str:
    """grpc-message is percent-encoded UTF-8."""
    if b"%" not in value:
        return value.decode("utf-8", "replace")
    from urllib.parse import unquote_to_bytes

    return unquote_to_bytes(value).decode("utf-8", "replace")
