"""``python -m coord.cli``: the same as the ``coord`` script."""

from __future__ import annotations

from . import main

main()
