"""The ``coord`` command line: locks, elections, status, queues and a local dev cluster.

Installed with the ``cli`` extra (``pip install 'coord[cli]'``, which brings click and
rich); ``import coord`` never imports it. Run ``coord --help``, or ``python -m coord.cli``.
One module per command group: :mod:`.lock`, :mod:`.elect`, :mod:`.status`, :mod:`.queue`,
:mod:`.dev`; :mod:`._store` holds the store options, :mod:`._common` the rest of what
they share (errors, exit codes, signals), :mod:`._child` runs the wrapped command.
"""

from __future__ import annotations

from ._app import cli, main

__all__ = ["cli", "main"]
