"""Names: a user's name never reaches into a recipe's own keys.

A queue ``N`` keeps its jobs under ``N/_jobs``, its claims under ``N/_claims``, ...; a
partitioner its partitions' locks under ``N/_partitions/<p>``. A semaphore called
``emails/_idle`` would take the places of the queue's idle lookers, and a lock called
``emails/_jobs`` would show as one of its jobs: no segment of a user's name may start
with ``_``, at any place in the name, for any recipe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

import coord
from coord._core.keys import check_name, internal_name

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.anyio

#: Every segment a recipe adds to a name for its own keys (queue, partitioner).
INTERNAL = ["_idle", "_jobs", "_claims", "_dead", "_ids", "_partitions", "_assignment"]

FACTORIES: list[tuple[str, Callable[[coord.Client, str], Any]]] = [
    ("mutex", lambda c, n: c.mutex(n)),
    ("cohort mutex", lambda c, n: c.mutex(n, local_handoff=4)),
    ("semaphore", lambda c, n: c.semaphore(n, 2)),
    ("rwlock", lambda c, n: c.rwlock(n)),
    ("election", lambda c, n: c.election(n)),
    ("group", lambda c, n: c.group(n)),
    ("partitioner", lambda c, n: c.partitioner(n, partitions=4)),
    ("queue", lambda c, n: c.queue(n)),
]


@pytest.mark.parametrize("segment", INTERNAL)
@pytest.mark.parametrize(("kind", "make"), FACTORIES, ids=[k for k, _ in FACTORIES])
async def test_a_recipes_own_segment_is_refused_in_every_name(
    segment: str, kind: str, make: Callable[[coord.Client, str], Any]
) -> None:
    async with coord.connect("memory://") as client:
        for name in (f"emails/{segment}", f"{segment}/x", f"emails/{segment}/1"):
            with pytest.raises(coord.ConfigurationError, match=f"segment '{segment}' must"):
                make(client, name)
        make(client, f"emails/x{segment}")  # inside a segment, "_" is a character as any


def test_any_segment_that_starts_with_an_underscore_is_the_recipes() -> None:
    with pytest.raises(coord.ConfigurationError, match="recipes' own"):
        check_name("a/_future_part")
    assert check_name("a/b_c/d_") == "a/b_c/d_"


def test_a_recipes_own_name_is_accepted_where_it_is_made() -> None:
    made = internal_name("emails", "_turn")
    assert made == "emails/_turn"
    assert check_name(made) == "emails/_turn"
    assert coord.connect("memory://").mutex(made).name == "emails/_turn"
    with pytest.raises(coord.ConfigurationError):
        internal_name("emails/_jobs", "_turn")  # the user's part is checked


def test_namespaces_may_start_with_an_underscore() -> None:
    """A namespace holds names; it is none (and ``_staging`` was always accepted)."""
    assert coord.connect("etcd://127.0.0.1/_staging").backend.url.endswith("/_staging")
    assert coord.connect("memory://_scratch").backend.url == "memory://_scratch"
