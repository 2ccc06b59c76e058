"""The fault suite's mutex and election cases in the layouts coord shares with other
clients (``connect(layout=...)``): the same scenarios as ``test_faults.py`` (a holder
paused past its TTL, a holder killed, a holder cut off from the store), run by the same
functions, with the same checks over the fenced store's history — no two holders
overlap unless one was told (``LockLost``, ``LeadershipLost``) or killed, fences
increase, no update is lost, the paused and cut-off holders are told, every live worker
acquires again within TTL + 5 s, and no key is left once the workers stopped — plus one
of this module's own: every hold's key is in the layout's shape, so that a run that fell
back to coord's layout cannot pass.

The layouts and the scenarios of each: the etcd layout (Go's ``concurrency.Mutex`` and
``Election``: one key per session, its tasks queue locally) on etcd. Cohort mode and the
queue are coord-layout only, and a server restart or a cluster's leader failover tests
the session, which the layout does not change: they stay in ``test_faults.py``.

To add a layout (kazoo's or Curator's, on ZooKeeper): add a ``pytest.param(recipe,
layout, "zookeeper", id=f"{recipe}-{layout}_layout-zookeeper",
marks=pytest.mark.zookeeper)`` to :data:`BOTH` and :data:`MUTEX`, and its key shape to
:data:`KEYS` (e.g. kazoo ``<uuid hex>__lock__<seq>``, Curator ``_c_<uuid>-lock-<seq>``).
The id must end with the store's kind: tests/conftest.py's ``group_of`` runs all fault
runs on one store on one worker, one after another. ``check_no_keys_left`` lists every
entry under the name, which must include the peer-shaped nodes on that store too.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

from . import test_faults as base
from ._harness import FaultRun
from ._worker import NAME

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from coord.testing import EtcdServer, TcpProxy, ZooKeeperServer

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(120)]

ARGS = ("recipe", "layout", "kind")


def _case(recipe: str, layout: str, kind: str) -> object:
    mark = pytest.mark.etcd if kind == "etcd" else pytest.mark.zookeeper
    return pytest.param(recipe, layout, kind, id=f"{recipe}-{layout}_layout-{kind}", marks=mark)


#: The cases of the scenarios run for both recipes, and of those run for the mutex only
#: (a partition tells a holder the same way whether it holds a lock or leads).
BOTH = [_case("mutex", "etcd", "etcd"), _case("election", "etcd", "etcd")]
MUTEX = [_case("mutex", "etcd", "etcd")]

#: The shape of a hold's key (relative to the client's namespace) in each layout.
KEYS = {"etcd": re.compile(re.escape(NAME) + r"/[0-9a-f]+")}  # <prefix>/<lease id in hex>


@pytest.fixture
def run(tmp_path: Path, recipe: str, layout: str) -> Iterator[FaultRun]:
    """Workers in *layout* on a mutex, or campaigning in an election (see test_faults)."""
    run = FaultRun(tmp_path, ttl=base.TTL, recipe=recipe, layout=layout)
    try:
        yield run
    finally:
        run.close()


def check_keys(run: FaultRun, layout: str) -> None:
    """Every hold was in *layout*: its key has the layout's shape."""
    holds = run.holds()
    assert holds
    wrong = [h for h in holds if not KEYS[layout].fullmatch(h.key)]
    shown = ", ".join(f"{h} key {h.key!r}" for h in wrong[:3])
    assert not wrong, f"{len(wrong)} holds not in the {layout} layout: {shown}"


@pytest.mark.parametrize(ARGS, BOTH)
async def test_holder_paused_past_its_ttl(
    run: FaultRun, server: EtcdServer | ZooKeeperServer, layout: str
) -> None:
    """SIGSTOP the holder for 2 x TTL, then SIGCONT: the others take over, the paused
    one is told and acquires again with the same client."""
    await base.test_holder_paused_past_its_ttl(run, server)
    check_keys(run, layout)


@pytest.mark.parametrize(ARGS, BOTH)
async def test_holder_killed(
    run: FaultRun, server: EtcdServer | ZooKeeperServer, layout: str
) -> None:
    """SIGKILL the holder: its key goes with its lease or session, the others and a
    replacement process acquire."""
    await base.test_holder_killed(run, server)
    check_keys(run, layout)


@pytest.mark.parametrize(ARGS, MUTEX)
async def test_client_cut_off_past_its_ttl(
    run: FaultRun, server: EtcdServer | ZooKeeperServer, proxy: TcpProxy, kind: str, layout: str
) -> None:
    """Cut one holder off for 2 x TTL, then heal: the others take over, it is told, and
    acquires again after the heal."""
    await base.test_client_cut_off_past_its_ttl(run, server, proxy, kind)
    check_keys(run, layout)
