from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from blockbuster import blockbuster_ctx

if TYPE_CHECKING:
    from collections.abc import Iterator

    from blockbuster import BlockBuster

# Unit tests run on both event loops (anyio's own conftest does the same).
# Trio without an explicit clock; TTL tests ask for trio's MockClock themselves.


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def blockbuster() -> Iterator[BlockBuster]:
    """Fail any test that makes a blocking call on the event loop."""
    with blockbuster_ctx("coord") as bb:
        # connect() checks that TLS files exist, at the call (one stat of a local file).
        bb.functions["os.stat"].can_block_in(
            "coord/backends/etcd/_connection.py", "_check_readable"
        )
        yield bb
