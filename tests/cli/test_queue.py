"""``coord queue put|ls|dlq|requeue``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import anyio
import pytest

import coord

if TYPE_CHECKING:
    from ._support import Coord

pytestmark = pytest.mark.etcd


def test_put_ls_dead_letters_requeue(coord_cli: Coord) -> None:
    first = coord_cli.run("queue", "put", "--key", "c1", "emails", "hello").stdout.strip()
    second = coord_cli.run("queue", "put", "emails", input="from stdin").stdout.strip()
    jobs = json.loads(coord_cli.run("queue", "ls", "--json", "emails").stdout)
    assert [(j["id"], j["key"], j["size"], j["state"]) for j in jobs] == [
        (first, "c1", 5, "ready"),
        (second, None, 10, "ready"),
    ]

    async def fail_the_first_job() -> None:
        async with coord.connect(coord_cli.url) as client:
            queue = client.queue("emails", max_attempts=1, on_exhausted="dead_letter")
            with pytest.raises(RuntimeError):
                async with queue.claim():
                    raise RuntimeError("boom")

    anyio.run(fail_the_first_job, backend="asyncio")
    (dead,) = json.loads(coord_cli.run("queue", "dlq", "--json", "emails").stdout)
    assert (dead["id"], dead["attempts"], dead["error"]) == (first, 1, "RuntimeError: boom")
    assert coord_cli.run("queue", "dlq", "emails").stdout.startswith(f"{first}  key=c1  ")

    assert coord_cli.run("queue", "requeue", "emails", first).returncode == 0
    jobs = json.loads(coord_cli.run("queue", "ls", "--json", "emails").stdout)
    assert [j["id"] for j in jobs] == [second, first]  # back at the end
    assert json.loads(coord_cli.run("queue", "dlq", "--json", "emails").stdout) == []

    missing = coord_cli.run("queue", "requeue", "emails", "nope")
    assert missing.returncode == 1
    assert missing.stderr == "coord: queue 'emails' has no dead letter 'nope'\n"
