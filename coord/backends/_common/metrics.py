"""Reading a server's Prometheus metrics (off the event loop: urllib blocks): etcd's watch
messages, for its backend's fault hooks and the tests. Needs no client library."""

from __future__ import annotations

import urllib.request

import anyio

__all__ = ["parse_metric", "watch_messages_sent"]


def parse_metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of Prometheus metric *name* whose labels include *labels*."""
    total = 0.0
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in "{ ":
            if all(w in line for w in want):
                total += float(line.rsplit(" ", 1)[1])
    return total


def _fetch(endpoint: str) -> str:
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


async def watch_messages_sent(endpoint: str) -> int:
    """etcd's count of messages sent on Watch streams (events, creations, cancels)."""
    text = await anyio.to_thread.run_sync(_fetch, endpoint)
    return int(parse_metric(text, "grpc_server_msg_sent_total", grpc_method="Watch"))
