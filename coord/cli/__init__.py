"""The ``coord`` command line: locks, elections, status, queues and a local dev cluster.

Installed with the ``cli`` extra (``pip install 'coord[cli]'``, which brings click and
rich); ``import coord`` never imports it. Run ``coord --help``, or ``python -m coord.cli``.
One module per command group: :mod:`.lock`, :mod:`.elect`, :mod:`.status`, :mod:`.queue`,
:mod:`.dev`; :mod:`._store` holds the store options, :mod:`._common` the rest of what
they share (errors, exit codes, signals), :mod:`._child` runs the wrapped command.

This module imports click only when the command runs or ``cli`` is read: the ``coord``
script is installed with coord itself, extra or not, and without the extra it says so in
one line instead of a traceback.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from .._core.extras import missing_extra, needs_extra

if TYPE_CHECKING:
    import click

    from ._app import cli  # at run time: __getattr__, below

__all__ = ["cli", "main"]

_EXTRA_MODULES = {"click", "rich"}


def main() -> None:
    """Run the ``coord`` command (the console script and ``python -m coord.cli``)."""
    try:
        from ._app import main as run
    except ModuleNotFoundError as exc:
        if exc.name not in _EXTRA_MODULES:
            raise
        sys.exit(f"coord: {needs_extra('the coord command', 'cli')} ({exc})")
    run()


def __getattr__(name: str) -> click.Group:
    """``cli``, the click group, imported on first use."""
    if name != "cli":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from ._app import cli
    except ModuleNotFoundError as exc:
        if exc.name not in _EXTRA_MODULES:
            raise
        raise missing_extra("coord.cli", "cli", exc) from exc
    return cli
