"""coord measures a ZooKeeper request before sending it (the server drops the connection
of a packet over ``jute.maxbuffer``): its sums are the lengths of what kazoo sends."""

from __future__ import annotations

from typing import Any

import pytest
from kazoo.protocol.serialization import (
    CheckVersion,
    Create,
    Delete,
    MultiHeader,
    SetData,
    Transaction,
)
from kazoo.security import OPEN_ACL_UNSAFE, make_digest_acl

import coord
from coord import abc
from coord.backends.zookeeper._paths import Paths
from coord.backends.zookeeper._sizes import RequestSizes

ACLS = {
    "world": list(OPEN_ACL_UNSAFE),
    "digest": [make_digest_acl("app", "secret", all=True), make_digest_acl("ops", "x", read=True)],
}
HEADER = 8  # kazoo's _submit: xid and opcode before the request's own bytes


def packet(request: Any) -> int:
    """The length kazoo writes before the packet: what the server compares with
    jute.maxbuffer."""
    return HEADER + len(request.serialize())


@pytest.mark.parametrize("acl", ACLS.values(), ids=ACLS.keys())
@pytest.mark.parametrize("root", ["", "tenant/é"])
def test_the_sizes_are_kazoos(acl: list[Any], root: str) -> None:
    paths = Paths(root)
    sizes = RequestSizes(paths, acl, limit=10**9)
    path, value = paths.path("orders/42/@wabc"), b"\xab" * 1000
    assert HEADER + sizes.create(path, value) == packet(Create(path, value, acl, 3))
    assert sizes.set_data(path, value) == len(SetData(path, value, 7).serialize())
    assert sizes.guard(path) == len(Delete(path, 7).serialize())
    assert sizes.guard(path) == len(CheckVersion(path, 7).serialize())
    job, claim = abc.Entry("q/_jobs/@ja-0000000001"), abc.Entry("q/_claims/@cb-0000000002")
    ops: list[abc.Op] = [
        abc.Update(job, value),
        abc.Create("q/_dead/", "@dc", value),
        abc.Put("q/state", value),
        abc.Remove(claim),
        abc.Check(claim),
    ]
    sent = Transaction(
        [
            SetData(paths.path(job.key), value, 0),
            Create(paths.path("q/_dead/@dc") + "-", value, acl, 2),
            Create(paths.path("q/state"), value, acl, 0),
            Delete(paths.path(claim.key), 0),
            CheckVersion(paths.path(claim.key), -1),
        ]
    )
    limit = packet(sent)
    RequestSizes(paths, acl, limit).check_multi(ops)  # exactly at the limit: taken
    with pytest.raises(coord.ConfigurationError, match=f"would be {limit:,} bytes"):
        RequestSizes(paths, acl, limit - 1).check_multi(ops)
    assert len(MultiHeader(-1, True, -1).serialize()) == 9
