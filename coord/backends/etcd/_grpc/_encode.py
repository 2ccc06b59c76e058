"""What the client sends, encoded: HPACK string literals and header fields (RFC 7541,
requests as literals without indexing, so the encoder keeps no state) and gRPC's
length-prefixed messages."""

from __future__ import annotations

import struct

__all__ = ["grpc_message", "literal", "literal_named", "string"]


def string(value: bytes) -> bytes:
    """An HPACK string literal, not Huffman-coded (RFC 7541, 5.2)."""
    n = len(value)
    if n < 127:
        return bytes((n,)) + value
    out = bytearray((127,))
    n -= 127
    while n >= 128:
        out.append((n & 127) | 128)
        n >>= 7
    out.append(n)
    return bytes(out) + value


def literal(name_index: int, value: bytes) -> bytes:
    """A header field without indexing, its name from the static table (index < 15)."""
    return bytes((name_index,)) + string(value)


def literal_named(name: bytes, value: bytes) -> bytes:
    """A header field without indexing, with a new name."""
    return b"\x00" + string(name) + string(value)


def grpc_message(data: bytes) -> bytes:
    """One message as gRPC frames it: uncompressed, its length, itself."""
    return struct.pack(">BI", 0, len(data)) + data
