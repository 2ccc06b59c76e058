"""``coord group NAME``: the members of a group, now and as they change."""

from __future__ import annotations

import json
import socket
from typing import TYPE_CHECKING

import anyio
import pytest

import coord

if TYPE_CHECKING:
    from ._support import Coord

pytestmark = pytest.mark.etcd


def test_a_group_with_no_member(coord_cli: Coord) -> None:
    done = coord_cli.run("group", "pool")
    assert (done.returncode, done.stdout) == (1, "pool: no members\n")
    done = coord_cli.run("group", "--json", "pool")
    assert json.loads(done.stdout) == {"name": "pool", "members": []}


@pytest.mark.timeout(40)
def test_members_now_and_as_they_change(coord_cli: Coord) -> None:
    watch = coord_cli.start("group", "--watch", "--json", "pool")
    assert watch.stdout is not None
    assert json.loads(watch.stdout.readline())["members"] == []
    shown: list[str] = []

    async def members() -> None:
        async with coord.connect(coord_cli.url) as a, coord.connect(coord_cli.url) as b:
            async with a.group("pool").join(b"10.0.0.1:80") as first:
                joined = json.loads(watch.stdout.readline())["members"]  # type: ignore[union-attr]
                assert [m["id"] for m in joined] == [first.id]
                assert joined[0]["value"] == "10.0.0.1:80"
                assert joined[0]["fence"] == first.fence
                assert joined[0]["identity"]["host"] == socket.gethostname()
                async with b.group("pool").join(b"\xff") as second:
                    both = json.loads(watch.stdout.readline())["members"]  # type: ignore[union-attr]
                    assert [m["id"] for m in both] == [first.id, second.id]
                    assert both[1]["value"] == "\ufffd"
                    done = coord_cli.run("group", "pool")
                    assert done.returncode == 0
                    shown.extend(done.stdout.splitlines())
                after_b = json.loads(watch.stdout.readline())["members"]  # type: ignore[union-attr]
                assert [m["id"] for m in after_b] == [first.id]  # b left, a is still in
        assert json.loads(watch.stdout.readline())["members"] == []  # type: ignore[union-attr]

    anyio.run(members, backend="asyncio")
    watch.terminate()
    assert shown[0] == "pool: 2 members"
    assert "'10.0.0.1:80' (fence" in shown[1]
    assert shown[1].startswith("  pid ")
