"""coord's gRPC transport for etcd: HTTP/2 over an asyncio connection of its own
(``_http2.py``), under aetcd's generated stubs."""
