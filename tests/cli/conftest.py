"""The CLI's tests run ``python -m coord.cli`` as subprocesses against the session's etcd
(a fresh namespace per test, from the ``etcd_url`` fixture)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from ._support import Coord

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # aetcd's gRPC is asyncio-only


@pytest.fixture
def coord_cli(etcd_url: str, tmp_path: Path) -> Iterator[Coord]:
    """The ``coord`` command, pointed at a namespace of this test's own."""
    cli = Coord(etcd_url, tmp_path)
    yield cli
    cli.close()
