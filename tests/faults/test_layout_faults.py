"""The fault suite's mutex and election cases in the interoperable layouts
(docs/interop.md): ``layout="etcd"`` (Go's ``client/v3/concurrency``) on etcd,
``layout="kazoo"`` and ``layout="curator"`` on ZooKeeper.

The cases are test_faults.py's own, with the same checks (no two holders overlap by
fence and history, the paused holder is told, everyone acquires again, nothing is left
behind); only the workers' client default layout changes. The etcd layout's one key per
session (a client's tasks queue locally in front of it) and the fence from the store
(the key's create revision, the node's czxid) need no change to the checks: fences
still increase in acquisition order and a hold is still one fence. Only "nothing is
left behind" looks elsewhere: at the peer's keys (``NAME/<lease>``) or nodes (the
children of ``/NAME``), not at coord's entries (_harness.check_no_keys_left).

Every mutex and election case of test_faults.py runs in each layout: a holder SIGKILLed
(its key or node goes with its lease or session), a holder SIGSTOPped past its TTL (it
must be told, and its late write is rejected by the fence), a worker cut off from the
store past its TTL by a proxy (a partition) and healed, the server SIGKILLed and
restarted, and the leader of a 3-member cluster or ensemble killed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from ._harness import FaultRun
from .test_faults import (
    TTL,
    cluster,
    others,
    proxy,
    test_client_cut_off_past_its_ttl,
    test_cluster_leader_killed,
    test_holder_killed,
    test_holder_paused_past_its_ttl,
    test_server_killed_and_restarted,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(120)]

__all__ = [
    "cluster",
    "others",
    "proxy",
    "test_client_cut_off_past_its_ttl",
    "test_cluster_leader_killed",
    "test_holder_killed",
    "test_holder_paused_past_its_ttl",
    "test_server_killed_and_restarted",
]

STORE_OF = {"etcd": "etcd", "kazoo": "zookeeper", "curator": "zookeeper"}
CASES = [
    pytest.param(
        (layout, recipe),
        marks=getattr(pytest.mark, STORE_OF[layout]),
        id=f"{layout}-{recipe}-{STORE_OF[layout]}",
    )
    for layout in STORE_OF
    for recipe in ("mutex", "election")
]


@pytest.fixture(params=CASES)
def case(request: pytest.FixtureRequest) -> tuple[str, str]:
    layout, recipe = request.param
    return str(layout), str(recipe)


@pytest.fixture
def kind(case: tuple[str, str]) -> str:
    """The layout's own store (overrides conftest's: each layout runs on one store)."""
    return STORE_OF[case[0]]


@pytest.fixture
def run(tmp_path: Path, case: tuple[str, str]) -> Iterator[FaultRun]:
    """Workers whose client's default layout is the case's (``connect(url, layout=)``)."""
    layout, recipe = case
    run = FaultRun(tmp_path, ttl=TTL, recipe=recipe, options={"layout": layout})
    try:
        yield run
    finally:
        run.close()
