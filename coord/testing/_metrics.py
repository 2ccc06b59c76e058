"""Reading a server's metrics: etcd's, as its backend reads them for the fault hooks."""

from __future__ import annotations

from ..backends._common.metrics import parse_metric, watch_messages_sent

__all__ = ["parse_metric", "watch_messages_sent"]
