"""The store's limits, run on every backend: one task's bad input fails that call only.

Every value that can reach the store is checked at the call, in bytes as stored, and
refused with ConfigurationError with nothing written; a job's failure message is cut to
fit, so that no ending of a claim is refused on size (issue 17, items 3 and 4).
"""

from __future__ import annotations

from typing import Literal

import anyio
import pytest

import coord

pytestmark = pytest.mark.anyio

#: A job key whose every character JSON escapes as 12 bytes (a surrogate pair).
WIDEST_KEY = "\U0001f600" * 256
#: A failure message whose every character JSON escapes as 6 bytes.
WIDE_MESSAGE = "错" * 1000


async def claims_of(client: coord.Client, name: str) -> list[str]:
    return [e.key for e in (await client.backend.entries(f"{name}/_claims/")).entries]


@pytest.mark.parametrize("on_exhausted", ["park", "dead_letter"])
async def test_a_failure_message_never_wedges_its_key(
    clients: list[coord.Client], on_exhausted: Literal["park", "dead_letter"]
) -> None:
    """The largest job put takes, with the widest key, fails twice with a message that
    grows sixfold in JSON: the retry, then the park or dead letter, are written (the
    message cut to fit) and the claim goes; the key is not blocked."""
    a, b, _, _ = clients
    queue = a.queue("wedge", max_attempts=2, on_exhausted=on_exhausted, retry_delay=0)
    size = queue.max_payload_size
    await queue.put(b"\xab" * size, key=WIDEST_KEY)
    await queue.put(b"next", key=WIDEST_KEY)
    worker = b.queue("wedge", max_attempts=2, on_exhausted=on_exhausted, retry_delay=0)
    with anyio.fail_after(20):
        for attempt in (0, 1):  # a retry in place, then the last attempt
            with pytest.raises(ValueError, match="错"):
                async with worker.claim() as job:
                    assert (job.attempt, len(job.payload)) == (attempt, size)
                    raise ValueError(WIDE_MESSAGE)
        assert await claims_of(a, "wedge") == []
        if on_exhausted == "park":
            assert (await queue.stats()).parked == 1
            assert await queue.unpark(WIDEST_KEY) == 1
            async with worker.claim() as job:
                assert (job.attempt, len(job.payload)) == (0, size)
        else:
            (letter,) = await queue.dead_letters()
            assert (letter.attempts, len(letter.payload)) == (2, size)
            assert letter.error is not None
            assert letter.error.startswith("ValueError: 错错")
            assert letter.error.endswith("...")
        async with worker.claim() as job:  # the next job of the key
            assert job.payload == b"next"


async def test_put_takes_max_payload_size_and_not_a_byte_more(
    clients: list[coord.Client],
) -> None:
    """The README's figure: 994,688 bytes on every store, with the widest key."""
    queue = clients[0].queue("largest")
    assert queue.max_payload_size == 994_688
    await queue.put(b"\xab" * queue.max_payload_size, key=WIDEST_KEY)
    with pytest.raises(coord.ConfigurationError, match="at most 994,688"):
        await queue.put(b"\xab" * (queue.max_payload_size + 1))
    assert (await queue.stats()).depth == 1
