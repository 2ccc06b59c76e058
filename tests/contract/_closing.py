"""A call whose transaction is out when its client closes: what it is told.

The close waits for the answers of the endings out (``docs/concepts.md``, "Closing the
client"), so such a call is told its outcome, not OutcomeUnknown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

import coord

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from coord.abc import Op

__all__ = ["told_across_a_close"]


async def told_across_a_close(
    url: str,
    call: Callable[[coord.Client], Awaitable[Any]],
    slowed: Callable[[Sequence[Op]], bool],
) -> Any:
    """Run ``call(client)`` on a fresh client of *url* (TTL 5 s); the first transaction
    for which ``slowed(ops)`` is true is applied and its answer held back 0.3 s, while
    the client closes. Returns what the call returned, or the CoordError it raised."""
    told: list[Any] = []
    sent = anyio.Event()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            async with coord.connect(url, ttl=5.0) as client:
                transact = client.backend.transact

                async def slow(ops: Sequence[Op]) -> Any:
                    result = await transact(ops)
                    if slowed(ops) and not sent.is_set():
                        sent.set()
                        await anyio.sleep(0.3)  # the client is closed meanwhile
                    return result

                client.backend.transact = slow  # type: ignore[method-assign]

                async def run() -> None:
                    try:
                        told.append(await call(client))
                    except coord.CoordError as exc:
                        told.append(exc)

                tg.start_soon(run)
                await sent.wait()
            # the client is closed here, with the transaction out
    assert len(told) == 1, told
    return told[0]
