"""Fail fast when no member of the store accepts connections.

Client libraries retry a refused connection until their whole timeout has passed, so a
typo in a port, or a store that is not running, would be reported only after seconds of
silence. One TCP connection attempt per endpoint tells "refused everywhere" (an error now,
naming every endpoint) from "slow or hung" (left to the client library's own timeout).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from .._exceptions import BackendUnavailable

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["fail_if_all_refuse"]

# A refused connection on loopback or a LAN answers in microseconds; a member that does
# not answer within this is treated as slow, not refused.
_PROBE_TIMEOUT = 1.0


def _endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def fail_if_all_refuse(what: str, endpoints: Sequence[tuple[str, int]]) -> None:
    """Raise BackendUnavailable if every endpoint refuses a TCP connection (or cannot be
    resolved or routed to). Returns as soon as one accepts or does not answer in time.
    A checkpoint."""
    errors: list[str] = []
    for host, port in endpoints:
        try:
            with anyio.fail_after(_PROBE_TIMEOUT):
                stream = await anyio.connect_tcp(host, port)
        except TimeoutError:
            return  # hung or slow, not refused: the client library's timeout decides
        except OSError as exc:
            errors.append(f"{_endpoint(host, port)}: {exc.strerror or exc}")
            continue
        await stream.aclose()
        return
    raise BackendUnavailable(f"cannot connect to {what}: " + "; ".join(errors))
